#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for t in loss reduce; do
  timeout 150 .bench/t/$t > "$OUT/tests-$t.txt" 2>&1; echo "$t rc=$?"; grep -E "test result|FAILED" "$OUT/tests-$t.txt"
done
