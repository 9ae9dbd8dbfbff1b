#!/usr/bin/env bash
# Tensor-core staging: raw words held until staged (c1: one step ahead, c2: two steps ahead)
# against the build before (base); the matmul test binary of each candidate first.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for c in c1 c2; do
  s=$(date +%s); timeout 120 .bench/$c/matmul-test tensor_core > $OUT/r/tests-$c.txt 2>&1
  echo "$c tests rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' $OUT/r/tests-$c.txt | tail -1)"
  grep -h -A8 "panicked\|FAILED" $OUT/r/tests-$c.txt | head -20
done
export WGRAD_FLCE_LABELS="f16 tc,bf16 tc+grads"
ONLY="matmul_fwd_tc,matmul_bwd_tc,fused_linear_ce_fwd_bwd BT2048"
for r in 1 2; do for v in base c1 c2; do
  timeout 100 .bench/$v/bench --only "$ONLY" > $OUT/r/bench-$v-$r.txt 2>&1
  echo "$v r$r rc=$?"; grep -E "TFLOP/s|median" $OUT/r/bench-$v-$r.txt | grep -v "GB/s" | sed "s/^/$v r$r /" | cut -c1-150
done; done
tar -C $OUT -czf $OUT/all.tgz r && rm -rf $OUT/r
