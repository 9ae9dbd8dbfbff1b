#!/usr/bin/env bash
# t11 again: the test binaries' results of call25b (its tests.txt did not come back), then the
# fused-linear GRPO and DPO rows (F32, BF16, BF16 with every head product on tensor cores, and
# with gradients in the head's dtypes by vocabulary-block statistics) and Liger's in the same
# command (scripts/peer_losses_liger.py).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/t11
R=$OUT/results.txt
{
timeout 150 $B/matmul-test tensor_core 2>&1 | grep -E "FAILED|test result|panicked" | head; echo "matmul tc tests rc=${PIPESTATUS[0]}"
timeout 60 $B/fused_linear-test 2>&1 | grep -E "FAILED|test result|panicked" | head; echo "fused_linear tests rc=${PIPESTATUS[0]}"
timeout 90 $B/mlp-test 2>&1 | grep -E "FAILED|test result|panicked" | head; echo "mlp tests rc=${PIPESTATUS[0]}"
timeout 150 $B/bench --only grpo,fused_linear_grpo,preference 2>&1; echo "bench rc=$?"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
PYTHONPATH=/tmp/site timeout 200 python3 scripts/peer_losses_liger.py 2>&1 | grep -v "^  " | tail -30; echo "peers rc=$?"
} > $R 2>&1
grep -vE "^  (fused_linear_grpo|preference_dpo) .*(FLOP per run)" $R | grep -vE "^\s*$" | tail -60
