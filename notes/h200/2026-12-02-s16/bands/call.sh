# The band order of both product modules in one shared function (`banded_tile` of
# wgsl/common/gemm_params.wgsl), build 29e5c64: the tensor-core tests (lavapipe has no tensor
# cores) and `check matmul_tensor_cores matmul`, the tensor-core product rows; and the driver's
# cooperative-matrix configurations with their raw component types (BF16 is 1000141000).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
for t in "matmul" "fused_linear tensor_cores" "mlp tensor_cores"; do
  set -- $t; s=$(date +%s)
  timeout 120 /tmp/tb/$1 ${2:-} > /tmp/t-$1.txt 2>&1
  echo "$1 ${2:-} rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$1.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$1.txt | head -30
done > $OUT/tests.txt 2>&1
timeout 90 .bench/s16/check matmul_tensor_cores matmul >> $OUT/tests.txt 2>&1; echo "check rc=$?" >> $OUT/tests.txt
cat $OUT/tests.txt
WGRAD_PROBE_FLOAT_CONTROLS=1 timeout 60 .bench/s16/bench --only "matmul_fwd_tc,matmul_bwd_tc" --json $OUT/bench.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; grep -E "cooperative|bfloat16|TFLOP/s" $OUT/bench.txt | grep -v "GB/s" | head -40
