# The build with tensor-core tiles in bands of 8 rows by default: the tensor-core tests, the
# BF16 rounding tests and the tensor-core `check`, then the products' and FLCE's bench rows
# (BT 2,048, then BT 8,192 with every dtype and option).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
for t in "matmul tensor_core" "fused_linear tensor_cores" "mlp tensor_cores" "norm bf16"; do
  set -- $t; s=$(date +%s)
  timeout 150 /tmp/tb/$1 $2 > /tmp/t-$1.txt 2>&1
  echo "$1 $2 rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$1.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$1.txt | head -30
done > $OUT/tests.txt 2>&1
timeout 60 .bench/s14/check matmul_tensor_cores >> $OUT/tests.txt 2>&1; echo "check rc=$?" >> $OUT/tests.txt
cat $OUT/tests.txt
B=.bench/s14/bench
timeout 150 $B --only "matmul_fwd_tc,matmul_bwd_tc,fused_linear_ce_fwd_bwd BT2048" --json $OUT/bench.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; grep -E "TFLOP/s|peak" $OUT/bench.txt | grep -v "GB/s"
timeout 240 $B --only "fused_linear_ce_fwd_bwd BT8192" --json $OUT/bench8192.json > $OUT/bench8192.txt 2>&1
echo "bench8192 rc=$?"; grep -E "TFLOP/s|peak" $OUT/bench8192.txt
