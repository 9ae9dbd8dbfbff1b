#!/usr/bin/env bash
# t2 = t1 + the tile rule (256x64 for B not transposed, > 128 rows, whole fragments).
# Tests of t2 first, then t1 / t2 alternating: products, FLCE.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/t2
{
timeout 240 $B/matmul-test tensor_core 2>&1 | grep -E "test result|panicked|FAILED|assert" | head -20; echo "matmul tests rc=${PIPESTATUS[0]}"
timeout 150 $B/fused_linear-test tensor_core 2>&1 | grep -E "test result|panicked|FAILED" | head; echo "fused_linear tests rc=${PIPESTATUS[0]}"
timeout 100 $B/mlp-test tensor 2>&1 | grep -E "test result|panicked|FAILED" | head; echo "mlp tests rc=${PIPESTATUS[0]}"
timeout 150 $B/check matmul_tensor_cores fused_linear_cross_entropy mlp 2>&1 | tail -4; echo "check rc=${PIPESTATUS[0]}"
} > $OUT/r/tests.txt 2>&1
for r in 1 2; do
  for v in t1 t2; do
    timeout 100 .bench/$v/bench --only "matmul_fwd_tc,matmul_bwd_tc" > $OUT/r/mm-$v-$r.txt 2>&1; echo "mm $v r$r rc=$?"
  done
done
for v in t1 t2; do
  WGRAD_FLCE_LABELS="bf16 tc+grads,bf16 tc+grads head" timeout 150 .bench/$v/bench --only "fused_linear_ce_fwd_bwd BT2048,fused_linear_ce_fwd_bwd BT8192" > $OUT/r/flce-$v.txt 2>&1; echo "flce $v rc=$?"
done
echo "=== tests"; cat $OUT/r/tests.txt
for r in 1 2; do for v in t1 t2; do echo "=== mm $v r$r"; grep -E "TFLOP/s" $OUT/r/mm-$v-$r.txt | grep "^ " | cut -c3-60; done; done
for v in t1 t2; do echo "=== flce $v"; grep -E "^fused|^  fused" $OUT/r/flce-$v.txt | cut -c1-160; done
