#!/usr/bin/env bash
# t5 + bench budgets 56/64/192 MiB for the block-statistics rows; profile of the 56 MiB row.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/t5
WGRAD_FLCE_LABELS="bf16 tc+grads blocks" timeout 200 $B/bench --only "fused_linear_ce_fwd_bwd" > $OUT/r/flce.txt 2>&1; echo "flce rc=$?"
WGRAD_FLCE_LABELS="bf16 tc+grads blocks" timeout 60 $B/bench --profile --only "fused_linear_ce_fwd_bwd BT2048 budget 56M" > $OUT/r/profile.txt 2>&1; echo "profile rc=$?"
echo "=== plans"; grep -E "fused_linear_ce .*(chunks|skipped)" $OUT/r/flce.txt | cut -c1-200
echo "=== profile"; grep "profile fused" $OUT/r/profile.txt | cut -c40-150
echo "=== flce"; grep -E "^fused" $OUT/r/flce.txt | cut -c1-170
