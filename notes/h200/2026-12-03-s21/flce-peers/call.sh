#!/usr/bin/env bash
# n1's BF16 fused linear cross-entropy with both tensor-core options, then the peer script's
# FLCE section (BF16 only) in the same command.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
WGRAD_FLCE_LABELS="bf16 tc+grads" timeout 100 .bench/n1/bench --only fused_linear_ce_fwd_bwd > $OUT/r/bench-n1.txt 2>&1
echo "n1 rc=$?"; grep -E "TFLOP/s|peak" $OUT/r/bench-n1.txt | grep -v "GB/s" | cut -c1-150
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
sed '183s/for dt in (torch.bfloat16, torch.float32):/for dt in (torch.bfloat16,):/' .peers/peers.py > /tmp/peers.py
SECTIONS=flce PYTHONPATH=/tmp/site timeout 150 python3 /tmp/peers.py > $OUT/r/peers.txt 2>&1; echo "peers rc=$?"; tail -8 $OUT/r/peers.txt
