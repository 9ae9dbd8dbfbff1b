# Tensor-core tiles in bands of rows (WGRAD_TC_GROUP 1, 8), alternated twice, after the
# tensor-core tests (which check that bands leave the bits alone); then FLCE BT 8,192 (every
# dtype and option) with bands of 8. The `check` of the tensor-core product (now with BF16 operands
# outside F16's range) after the tests.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
for t in "matmul tensor_core" "fused_linear tensor_cores" "mlp tensor_cores"; do
  set -- $t; s=$(date +%s)
  timeout 150 /tmp/tb/$1 $2 > /tmp/t-$1.txt 2>&1
  echo "$1 $2 rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$1.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$1.txt | head -30
done > $OUT/tests.txt 2>&1
timeout 60 .bench/s14/check matmul_tensor_cores >> $OUT/tests.txt 2>&1; echo "check rc=$?" >> $OUT/tests.txt
cat $OUT/tests.txt
B=.bench/s14/bench
for r in 1 2; do
  for g in 1 8; do
    WGRAD_TC_GROUP=$g timeout 110 $B --only "matmul_fwd_tc,matmul_bwd_tc,fused_linear_ce_fwd_bwd BT2048" > /tmp/v.txt 2>&1
    echo "rc=$?" | sed "s/^/group$g r$r /"
    grep -E "TFLOP/s|peak" /tmp/v.txt | sed "s/^/group$g r$r /"
  done
done > $OUT/ab.txt 2>&1
grep -v "GB/s" $OUT/ab.txt
WGRAD_TC_GROUP=8 timeout 170 $B --only "fused_linear_ce_fwd_bwd BT8192" --json $OUT/bench8192.json > $OUT/bench8192.txt 2>&1
echo "rc=$?"; grep -E "TFLOP/s|peak" $OUT/bench8192.txt
