#!/usr/bin/env bash
# t1: tensor-core tiles selectable (WGRAD_TC_TILE=ROWSxBLOCK): default (128x32 / 64x32),
# 128x64 and 256x64 (64x64 subgroup blocks, K steps of 32). Tests first, then registers, then
# the products alternating twice, then FLCE.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/t1
{
timeout 200 $B/matmul-test tensor_core 2>&1 | grep -E "test result|panicked|FAILED|assert" | head -20; echo "matmul tests rc=${PIPESTATUS[0]}"
timeout 150 $B/fused_linear-test tensor_core 2>&1 | grep -E "test result|panicked|FAILED" | head; echo "fused_linear tests rc=${PIPESTATUS[0]}"
timeout 100 $B/mlp-test tensor 2>&1 | grep -E "test result|panicked|FAILED" | head; echo "mlp tests rc=${PIPESTATUS[0]}"
} > $OUT/r/tests.txt 2>&1; cat $OUT/r/tests.txt
for v in def 128x64 256x64 64x64; do
  if [ $v = def ]; then unset WGRAD_TC_TILE; else export WGRAD_TC_TILE=$v; fi
  timeout 60 $B/bench --pipeline-stats --only matmul_fwd_tc > $OUT/r/stats-$v.txt 2>&1; echo "stats $v rc=$?"
  grep -i -E "gemm_tc" $OUT/r/stats-$v.txt | grep -i -E "register|shared|spill" | head -3 | cut -c1-250
done
for r in 1 2; do
  for v in def 128x64 256x64; do
    if [ $v = def ]; then unset WGRAD_TC_TILE; else export WGRAD_TC_TILE=$v; fi
    timeout 100 $B/bench --only "matmul_fwd_tc,matmul_bwd_tc" > $OUT/r/mm-$v-$r.txt 2>&1
    echo "$v r$r rc=$?"; grep -E "TFLOP/s" $OUT/r/mm-$v-$r.txt | grep "^ " | cut -c1-110
  done
done
unset WGRAD_TC_TILE
