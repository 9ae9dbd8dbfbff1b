#!/usr/bin/env bash
# n2: the FP32 module's chunked fetches hold their words until staged (16-bit operands widened
# there), against n1, alternating twice; then the driver's statistics of the tensor-core entries.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
export WGRAD_FLCE_LABELS="f32,bf16"
ONLY="matmul_fwd,matmul_bwd,fused_linear_ce_fwd_bwd BT2048"
for r in 1 2; do for v in n1 n2; do
  timeout 60 .bench/$v/bench --only "$ONLY" > $OUT/r/bench-$v-$r.txt 2>&1
  echo "$v r$r rc=$?"; grep -E "TFLOP/s" $OUT/r/bench-$v-$r.txt | grep -v "_tc" | sed "s/^/$v r$r /" | cut -c1-140
done; done
timeout 40 .bench/n2/bench --pipeline-stats --only matmul_fwd_tc > $OUT/r/stats.txt 2>&1; echo "stats rc=$?"
grep -i -E "gemm_tc|register" $OUT/r/stats.txt | head -20
