#!/usr/bin/env bash
# s3: the tensor-core kernel with K steps of 32 staged in two buffers (one barrier a step)
# against s2 (8b4d08b): s3's tensor-core tests and check first, then the tensor-core product
# rows and the BF16 FLCE row alternating twice, then the driver's statistics of s3's entries.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
{
timeout 120 .bench/s3/matmul-test tensor_core 2>&1 | grep -E "test result|panicked|FAILED" ; echo "matmul tests rc=${PIPESTATUS[0]}"
timeout 100 .bench/s3/fused_linear-test tensor_cores 2>&1 | grep -E "test result|panicked|FAILED"; echo "fused_linear tc tests rc=${PIPESTATUS[0]}"
timeout 100 .bench/s3/mlp-test 2>&1 | grep -E "test result|panicked|FAILED"; echo "mlp tests rc=${PIPESTATUS[0]}"
timeout 150 .bench/s3/check matmul_tensor_cores fused_linear_cross_entropy mlp 2>&1 | tail -4; echo "check rc=${PIPESTATUS[0]}"
} > $OUT/r/tests.txt 2>&1; cat $OUT/r/tests.txt
export WGRAD_FLCE_LABELS="bf16 tc+grads"
for r in 1 2; do for v in s2 s3; do
  timeout 100 .bench/$v/bench --only "matmul_fwd_tc,matmul_bwd_tc,fused_linear_ce_fwd_bwd BT2048" > $OUT/r/bench-$v-$r.txt 2>&1
  echo "$v r$r rc=$?"; grep -E "TFLOP/s" $OUT/r/bench-$v-$r.txt | grep -v "^ " | cut -c1-140
  grep -E "TFLOP/s" $OUT/r/bench-$v-$r.txt | grep "^ " | cut -c1-120
done; done
timeout 60 .bench/s3/bench --pipeline-stats --only matmul_fwd_tc > $OUT/r/stats.txt 2>&1; echo "stats rc=$?"
grep -i -E "gemm_tc" $OUT/r/stats.txt | head -8
