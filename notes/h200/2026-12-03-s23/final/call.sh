#!/usr/bin/env bash
# t3 = t2 + WGRAD_TC_SHORT_TILE (the tile of products of at most 64 rows; a measurement switch
# of this build only, not kept): the FLCE rows and
# the tensor-core products of the default rule; the 40 MiB rows with 64x64 short tiles
# alternating with the default; then the peer script's FLCE section (BF16) in the same command.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/t3
WGRAD_FLCE_LABELS="bf16 tc+grads,bf16 tc+grads head" timeout 200 $B/bench --only "fused_linear_ce_fwd_bwd" > $OUT/r/flce-t3.txt 2>&1; echo "flce rc=$?"
timeout 100 $B/bench --only "matmul_fwd_tc,matmul_bwd_tc" > $OUT/r/mm-t3.txt 2>&1; echo "mm rc=$?"
for r in 1 2; do
  for v in def 64x64; do
    if [ $v = def ]; then unset WGRAD_TC_SHORT_TILE; else export WGRAD_TC_SHORT_TILE=$v; fi
    WGRAD_FLCE_LABELS="bf16 tc+grads head" timeout 100 $B/bench --only "fused_linear_ce_fwd_bwd BT2048 budget 40M" > $OUT/r/short-$v-$r.txt 2>&1; echo "short $v r$r rc=$?"
  done
done
unset WGRAD_TC_SHORT_TILE
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
sed '183s/for dt in (torch.bfloat16, torch.float32):/for dt in (torch.bfloat16,):/' .peers/peers.py > /tmp/peers.py
SECTIONS=flce PYTHONPATH=/tmp/site timeout 150 python3 /tmp/peers.py > $OUT/r/peers.txt 2>&1; echo "peers rc=$?"
echo "=== flce"; grep -E "^fused" $OUT/r/flce-t3.txt | cut -c1-170
echo "=== mm"; grep -E "TFLOP/s" $OUT/r/mm-t3.txt | grep "^ " | cut -c3-90
for r in 1 2; do for v in def 64x64; do echo "=== short $v r$r"; grep -E "^fused" $OUT/r/short-$v-$r.txt | cut -c1-170; done; done
echo "=== peers"; tail -8 $OUT/r/peers.txt
