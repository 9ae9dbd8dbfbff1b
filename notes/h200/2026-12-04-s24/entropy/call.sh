#!/usr/bin/env bash
# t9 (7ab9bb1, block statistics with the entropy's sum in the row state): the fused linear
# binary (every test), `check fused_linear_cross_entropy`, then the 56 MiB and default
# block-statistics rows at BT 2,048.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/t9
{
timeout 60 $B/fused_linear-test 2>&1 | grep -E "FAILED|test result|panicked"; echo "fused_linear tests rc=${PIPESTATUS[0]}"
timeout 60 $B/check fused_linear_cross_entropy 2>&1 | tail -2; echo "check rc=${PIPESTATUS[0]}"
} > $OUT/r/tests.txt 2>&1
WGRAD_FLCE_LABELS="bf16 tc+grads blocks" timeout 50 $B/bench --only "fused_linear_ce_fwd_bwd BT2048" > $OUT/r/flce.txt 2>&1; echo "flce rc=$?"
cat $OUT/r/tests.txt; grep -E "^fused" $OUT/r/flce.txt | cut -c1-170
