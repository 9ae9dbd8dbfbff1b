#!/usr/bin/env bash
# t4 (5f4a25d): the tensor-core tests of the matmul (every tile; the maxima refusals, the
# offset one new), fused linear and MLP binaries and the tensor-core `check`; then the MLP
# rows with tensor cores (the dh products' backward layouts take the 256x128 tile).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/t4
{
timeout 240 $B/matmul-test tensor_core 2>&1 | grep -E "^test |test result|panicked" | head -20; echo "matmul tests rc=${PIPESTATUS[0]}"
timeout 150 $B/fused_linear-test tensor_core 2>&1 | grep -E "^test |test result|panicked" | head; echo "fused_linear tests rc=${PIPESTATUS[0]}"
timeout 100 $B/mlp-test 2>&1 | grep -E "test result|panicked" | head; echo "mlp tests rc=${PIPESTATUS[0]}"
timeout 150 $B/check matmul_tensor_cores fused_linear_cross_entropy mlp 2>&1 | tail -4; echo "check rc=${PIPESTATUS[0]}"
} > $OUT/r/tests.txt 2>&1
timeout 150 $B/bench --only "swiglu_mlp" > $OUT/r/mlp.txt 2>&1; echo "mlp bench rc=$?"
echo "=== tests"; cat $OUT/r/tests.txt
echo "=== mlp"; grep -E "swiglu" $OUT/r/mlp.txt | grep -v "FLOP per" | cut -c1-170
