#!/usr/bin/env bash
# s4: 64-row tensor-core tiles (four subgroups) for products of at most 64 rows; s5: the same
# kernel with 64-row tiles for every product; against s2 (8b4d08b). s4's tests first.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
{
timeout 150 .bench/s4/matmul-test tensor_core 2>&1 | grep -E "test result|panicked|FAILED" ; echo "matmul tests rc=${PIPESTATUS[0]}"
timeout 150 .bench/s4/fused_linear-test 2>&1 | grep -E "test result|panicked|FAILED"; echo "fused_linear tests rc=${PIPESTATUS[0]}"
timeout 100 .bench/s4/mlp-test 2>&1 | grep -E "test result|panicked|FAILED"; echo "mlp tests rc=${PIPESTATUS[0]}"
timeout 150 .bench/s4/check matmul_tensor_cores fused_linear_cross_entropy mlp 2>&1 | tail -4; echo "check rc=${PIPESTATUS[0]}"
} > $OUT/r/tests.txt 2>&1; cat $OUT/r/tests.txt
for r in 1 2; do
  for v in s2 s4; do
    WGRAD_FLCE_LABELS="bf16 tc+grads head" timeout 100 .bench/$v/bench --only "fused_linear_ce_fwd_bwd BT2048" > $OUT/r/flce-$v-$r.txt 2>&1
    echo "$v r$r rc=$?"; grep -E "^fused" $OUT/r/flce-$v-$r.txt | cut -c1-150
  done
  for v in s2 s5; do
    timeout 100 .bench/$v/bench --only "matmul_fwd_tc,matmul_bwd_tc" > $OUT/r/mm-$v-$r.txt 2>&1
    echo "$v r$r rc=$?"; grep -E "TFLOP/s" $OUT/r/mm-$v-$r.txt | grep "^ " | cut -c1-110
  done
done
WGRAD_FLCE_LABELS="bf16 tc+grads head" timeout 100 .bench/s4/bench --profile --only "fused_linear_ce_fwd_bwd BT2048 budget 40M" > $OUT/r/profile-s4.txt 2>&1; echo "profile rc=$?"
grep -E "profile.*(gemm|scale)" $OUT/r/profile-s4.txt | cut -c1-150
timeout 60 .bench/s5/bench --pipeline-stats --only matmul_fwd_tc > $OUT/r/stats.txt 2>&1; echo "stats rc=$?"
grep -i -E "gemm_tc" $OUT/r/stats.txt | head -4 | cut -c1-300
