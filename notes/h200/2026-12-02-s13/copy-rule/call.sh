# The copy rule (operands staged by at least 16 tiles): the tensor-core tests, then the products'
# and FLCE's bench rows (BT 2,048).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
for t in "matmul tensor_core" "fused_linear tensor_cores" "mlp tensor_cores" "wgrad f16_copies"; do
  set -- $t; s=$(date +%s)
  timeout 120 /tmp/tb/$1 $2 > /tmp/t-$1.txt 2>&1
  echo "$1 $2 rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$1.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$1.txt | head -30
done > $OUT/tests.txt 2>&1
cat $OUT/tests.txt
timeout 200 .bench/s13/bench --only "matmul_fwd_tc,matmul_bwd_tc,fused_linear_ce_fwd_bwd BT2048" --json $OUT/bench.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; grep -E "TFLOP/s|peak" $OUT/bench.txt
