#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
run() { # label, env...
  local label=$1; shift
  env "$@" timeout 120 .bench/new/bench --only cross_entropy > "$OUT/bench-$label.txt" 2>&1
  echo "== $label rc=$?"; grep -E "^cross_entropy|in_place.*peak" "$OUT/bench-$label.txt"
}
for i in 1 2; do
  run "l256-$i" WGRAD_CE_LANES=256
  run "l1024-$i" WGRAD_CE_LANES=1024
done
run "l1024-r4096" WGRAD_CE_LANES=1024 WGRAD_IN_PLACE_ROWS=4096
