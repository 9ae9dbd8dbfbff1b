#!/usr/bin/env bash
# t11: tensor-core products that need the epilogue staged in F32 scratch for gemm_finish
# (WGRAD_TC_STAGE=1, the new rule) against workgroup-memory staging (0), alternating twice;
# the tensor-core tests (matmul), the fused linear and MLP binaries and check first.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/t11
{
timeout 150 $B/matmul-test tensor_core 2>&1 | grep -E "FAILED|test result|panicked" | head; echo "matmul tc tests rc=${PIPESTATUS[0]}"
timeout 60 $B/fused_linear-test 2>&1 | grep -E "FAILED|test result|panicked" | head; echo "fused_linear tests rc=${PIPESTATUS[0]}"
timeout 90 $B/mlp-test 2>&1 | grep -E "FAILED|test result|panicked" | head; echo "mlp tests rc=${PIPESTATUS[0]}"
timeout 60 $B/check matmul_tensor_cores fused_linear_cross_entropy mlp 2>&1 | tail -2; echo "check rc=${PIPESTATUS[0]}"
} > $OUT/r/tests.txt 2>&1
cat $OUT/r/tests.txt
for r in 1 2; do
  for s in 0 1; do
    export WGRAD_TC_STAGE=$s
    timeout 40 $B/bench --only matmul_fwd_tc_epilogue,matmul_fwd_tc > $OUT/r/mm-$s-$r.txt 2>&1; echo "mm s$s r$r rc=$?"
    WGRAD_FLCE_LABELS="bf16 tc+grads head,bf16 tc+grads blocks" timeout 70 $B/bench --only "fused_linear_ce_fwd_bwd BT2048" > $OUT/r/flce-$s-$r.txt 2>&1; echo "flce s$s r$r rc=$?"
  done
done
for s in 0 1; do
  export WGRAD_TC_STAGE=$s
  timeout 60 $B/bench --only swiglu_mlp > $OUT/r/mlp-$s.txt 2>&1; echo "mlp s$s rc=$?"
done
for r in 1 2; do for s in 0 1; do echo "=== s$s r$r"; grep -hE "^(matmul|fused)" $OUT/r/mm-$s-$r.txt $OUT/r/flce-$s-$r.txt | cut -c1-160; done; done
for s in 0 1; do echo "=== mlp s$s"; grep -hE "^swiglu" $OUT/r/mlp-$s.txt | cut -c1-160; done
