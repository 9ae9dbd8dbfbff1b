# Build 6850720 on the H200: the whole matmul, fused linear and MLP test binaries, then `check`
# (every operator).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
for t in matmul fused_linear mlp; do
  s=$(date +%s)
  timeout 150 /tmp/tb/$t > /tmp/t-$t.txt 2>&1
  echo "$t rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$t.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$t.txt | head -30
done > $OUT/tests.txt 2>&1
cat $OUT/tests.txt
timeout 280 .bench/s13/check > $OUT/check.txt 2>&1
echo "check rc=$?"; grep -c PASS $OUT/check.txt; grep -v PASS $OUT/check.txt | tail -8
