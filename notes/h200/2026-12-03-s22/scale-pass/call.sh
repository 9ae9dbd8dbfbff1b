#!/usr/bin/env bash
# s0 (c041799: one load in flight in tc_scale_part) vs s1 (HEAD: sixteen), the BF16 FLCE rows
# with both tensor-core options at BT 2,048 (default order; head dtypes at the default, 256 MiB
# and 40 MiB budgets), each with --profile; then s1's BT 8,192 default-order profile.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for v in s0 s1; do
  WGRAD_FLCE_LABELS="bf16 tc+grads,bf16 tc+grads head" timeout 150 .bench/$v/bench --profile --only "fused_linear_ce_fwd_bwd BT2048" > $OUT/r/bench-$v.txt 2>&1
  echo "$v rc=$?"; grep -E "median|%" $OUT/r/bench-$v.txt | grep -v "GB/s" | cut -c1-160 | head -60
done
WGRAD_FLCE_LABELS="bf16 tc+grads" timeout 100 .bench/s1/bench --profile --only "fused_linear_ce_fwd_bwd BT8192" > $OUT/r/bench-s1-8192.txt 2>&1
echo "s1 8192 rc=$?"; grep -E "median|%" $OUT/r/bench-s1-8192.txt | grep -v "GB/s" | cut -c1-160 | head -30
