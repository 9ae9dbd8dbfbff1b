#!/usr/bin/env bash
# t8 (the split-K scratch and F16 copies of block statistics within what the budget leaves):
# the fused linear binary's tensor-core and block-statistics tests, then the FLCE rows with
# head dtypes (row chunks and block statistics).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/t8
timeout 100 $B/fused_linear-test tensor_core block_statistics 2>&1 | grep -E "^test |test result|panicked" > $OUT/r/tests.txt; echo "tests rc=${PIPESTATUS[0]}"
WGRAD_FLCE_LABELS="bf16 tc+grads head,bf16 tc+grads blocks" timeout 280 $B/bench --only "fused_linear_ce_fwd_bwd" > $OUT/r/flce.txt 2>&1; echo "flce rc=$?"
echo "=== tests"; cat $OUT/r/tests.txt
echo "=== plans"; grep -E "fused_linear_ce .*blocks.*(chunks|skipped)" $OUT/r/flce.txt | cut -c1-200
echo "=== flce"; grep -E "^fused" $OUT/r/flce.txt | cut -c1-170
