set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/s12/tests.tar.xz
for t in cast tensor reduce engine spirv msl activation embedding optim rope norm loss grpo preference gated_delta attention mlp model matmul fused_linear wgrad check; do
  s=$(date +%s)
  timeout 170 /tmp/tb/$t > $OUT/tests-$t.txt 2>&1
  rc=$?
  echo "$t rc=$rc $(( $(date +%s) - s ))s $(grep -h 'test result' $OUT/tests-$t.txt | tail -1)"
  grep -h "^test .* FAILED\|^    [a-z_0-9]*$" $OUT/tests-$t.txt | head -20
done 2>&1 | tee $OUT/summary.txt
