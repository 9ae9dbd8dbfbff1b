set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/s12/tests2.tar.xz
for t in embedding reduce; do
  timeout 100 /tmp/tb/$t > /tmp/t-$t.txt 2>&1; echo "$t rc=$?"; cat /tmp/t-$t.txt
done > $OUT/tests2.txt 2>&1
grep -E "rc=|test result|panicked|left|right" $OUT/tests2.txt | cut -c1-300
s=$(date +%s); timeout 380 /tmp/tb/check > $OUT/tests2-check.txt 2>&1; echo "check rc=$? $(( $(date +%s) - s ))s"; tail -30 $OUT/tests2-check.txt | cut -c1-300
