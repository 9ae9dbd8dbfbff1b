#!/usr/bin/env bash
# s4 (= 46bd317's code): the BF16 FLCE rows with both tensor-core options at BT 8,192 (default
# order; head dtypes at the default, 256 MiB and 40 MiB budgets), then the peer script's FLCE
# section (BF16) in the same command.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
WGRAD_FLCE_LABELS="bf16 tc+grads,bf16 tc+grads head" timeout 200 .bench/s4/bench --only "fused_linear_ce_fwd_bwd" > $OUT/r/bench-s4.txt 2>&1
echo "s4 rc=$?"; grep -E "^fused|peak" $OUT/r/bench-s4.txt | cut -c1-170
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
sed '183s/for dt in (torch.bfloat16, torch.float32):/for dt in (torch.bfloat16,):/' .peers/peers.py > /tmp/peers.py
SECTIONS=flce PYTHONPATH=/tmp/site timeout 150 python3 /tmp/peers.py > $OUT/r/peers.txt 2>&1; echo "peers rc=$?"; tail -6 $OUT/r/peers.txt
