#!/usr/bin/env bash
# t7 (10e94e3, the reviewed code: ce_scan shared by ce_fwd and ce_block_stats). The whole fused
# linear and loss test binaries and `check fused_linear_cross_entropy cross_entropy` first; then
# the 56 MiB block-statistics row (BT 2,048: blocks of 2,920, no room for the logit gradient's
# F16 copies) against the same blocks with a 192 MiB budget (room for them), alternating twice;
# then every FLCE row of the build once more.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/t7
{
timeout 240 $B/fused_linear-test 2>&1 | grep -E "FAILED|test result|panicked" | head -20; echo "fused_linear tests rc=${PIPESTATUS[0]}"
timeout 240 $B/loss-test 2>&1 | grep -E "FAILED|test result|panicked" | head -20; echo "loss tests rc=${PIPESTATUS[0]}"
timeout 150 $B/check fused_linear_cross_entropy cross_entropy 2>&1 | tail -3; echo "check rc=${PIPESTATUS[0]}"
} > $OUT/r/tests.txt 2>&1
export WGRAD_FLCE_LABELS="bf16 tc+grads blocks"
for r in 1 2; do
  unset WGRAD_FLCE_BLOCK
  timeout 60 $B/bench --only "fused_linear_ce_fwd_bwd BT2048 budget 56M" > $OUT/r/b-56-$r.txt 2>&1; echo "56M r$r rc=$?"
  export WGRAD_FLCE_BLOCK=2920
  timeout 60 $B/bench --only "fused_linear_ce_fwd_bwd BT2048 budget 192M" > $OUT/r/b-192-$r.txt 2>&1; echo "192M r$r rc=$?"
done
unset WGRAD_FLCE_BLOCK
WGRAD_FLCE_LABELS="bf16 tc+grads,bf16 tc+grads head,bf16 tc+grads blocks" timeout 330 $B/bench --only "fused_linear_ce_fwd_bwd" > $OUT/r/flce.txt 2>&1; echo "flce rc=$?"
echo "=== tests"; cat $OUT/r/tests.txt
for r in 1 2; do for b in 56 192; do echo "=== ${b}M r$r"; grep -E "vocabulary blocks|^fused" $OUT/r/b-$b-$r.txt | grep "BT2048" | cut -c1-200; done; done
echo "=== flce"; grep -E "^fused" $OUT/r/flce.txt | cut -c1-170
