#!/usr/bin/env bash
# t10: tensor-core fragment staging with subgroup barriers (WGRAD_TC_SG_SYNC=1) against
# workgroup barriers (0, the rule), alternating twice; tensor-core tests first.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/t10
{
timeout 150 $B/matmul-test tensor_core 2>&1 | grep -E "FAILED|test result|panicked" | head; echo "matmul tc tests rc=${PIPESTATUS[0]}"
timeout 90 $B/fused_linear-test 2>&1 | grep -E "FAILED|test result|panicked" | head; echo "fused_linear tests rc=${PIPESTATUS[0]}"
} > $OUT/r/tests.txt 2>&1
cat $OUT/r/tests.txt
for r in 1 2; do
  for s in 0 1; do
    export WGRAD_TC_SG_SYNC=$s
    timeout 60 $B/bench --only matmul_fwd_tc,matmul_bwd_tc > $OUT/r/mm-$s-$r.txt 2>&1; echo "mm s$s r$r rc=$?"
    WGRAD_FLCE_LABELS="bf16 tc+grads blocks" timeout 60 $B/bench --only "fused_linear_ce_fwd_bwd BT2048" > $OUT/r/flce-$s-$r.txt 2>&1; echo "flce s$s r$r rc=$?"
  done
done
for r in 1 2; do for s in 0 1; do echo "=== s$s r$r"; grep -hE "^(matmul|fused)" $OUT/r/mm-$s-$r.txt $OUT/r/flce-$s-$r.txt | cut -c1-160; done; done
