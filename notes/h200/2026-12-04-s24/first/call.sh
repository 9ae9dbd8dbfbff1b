#!/usr/bin/env bash
# t5 (e25928d): Chunking::block_statistics. Tests first (fused linear: tensor-core and block
# statistics tests; check fused_linear_cross_entropy), then the FLCE rows (both tensor-core
# options: row chunks with F32 gradients, head dtypes at the default / 256 / 40 MiB budgets,
# block statistics at the default / 48 / 160 MiB budgets), a profile of the 48 MiB blocks row,
# then the peer script's FLCE section (BF16) in the same command.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/t5
{
timeout 200 $B/fused_linear-test tensor_core block_statistics 2>&1 | grep -E "^test |test result|panicked" | head -20; echo "fused_linear tests rc=${PIPESTATUS[0]}"
timeout 120 $B/check fused_linear_cross_entropy matmul_tensor_cores 2>&1 | tail -3; echo "check rc=${PIPESTATUS[0]}"
} > $OUT/r/tests.txt 2>&1
WGRAD_FLCE_LABELS="bf16 tc+grads,bf16 tc+grads head,bf16 tc+grads blocks" timeout 260 $B/bench --only "fused_linear_ce_fwd_bwd" > $OUT/r/flce.txt 2>&1; echo "flce rc=$?"
WGRAD_FLCE_LABELS="bf16 tc+grads blocks" timeout 60 $B/bench --profile --only "fused_linear_ce_fwd_bwd BT2048 budget 48M" > $OUT/r/profile.txt 2>&1; echo "profile rc=$?"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
sed '183s/for dt in (torch.bfloat16, torch.float32):/for dt in (torch.bfloat16,):/' .peers/peers.py > /tmp/peers.py
SECTIONS=flce PYTHONPATH=/tmp/site timeout 150 python3 /tmp/peers.py > $OUT/r/peers.txt 2>&1; echo "peers rc=$?"
echo "=== tests"; cat $OUT/r/tests.txt
echo "=== plans"; grep -E "fused_linear_ce .*(chunks|skipped)" $OUT/r/flce.txt | cut -c1-200
echo "=== profile"; grep -v "^ *$" $OUT/r/profile.txt | tail -30 | cut -c1-150
echo "=== flce"; grep -E "^fused" $OUT/r/flce.txt | cut -c1-170
echo "=== peers"; tail -8 $OUT/r/peers.txt
