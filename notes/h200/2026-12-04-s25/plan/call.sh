#!/usr/bin/env bash
# t12: block statistics with tensor-core gradients plan blocks with room to stage the 16-bit
# weight gradient's F32 sums (gemm_finish) where blocks of >= 4,096 columns then fit; t11b (the
# build before: the same staging rule in the product, the old plan) alternating; tests first;
# then the peer script's flce section (Liger, PyTorch) in the same command.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
R=$OUT/results.txt
export WGRAD_FLCE_LABELS="bf16 tc+grads blocks"
{
timeout 60 .bench/t12/fused_linear-test 2>&1 | grep -E "FAILED|test result|panicked" | head; echo "fused_linear tests rc=${PIPESTATUS[0]}"
timeout 90 .bench/t12/matmul-test tensor_core 2>&1 | grep -E "FAILED|test result|panicked" | head; echo "matmul tc tests rc=${PIPESTATUS[0]}"
timeout 40 .bench/t12/check fused_linear_cross_entropy 2>&1 | tail -1; echo "check rc=${PIPESTATUS[0]}"
for r in 1 2; do
  for b in t12 t11b; do
    echo "=== $b r$r BT2048"
    timeout 45 .bench/$b/bench --only "fused_linear_ce_fwd_bwd BT2048" 2>&1 | grep -E "vocabulary blocks|^fused" | grep -E "BT2048" | cut -c1-200
  done
done
for b in t12 t11b; do
  echo "=== $b BT8192"
  timeout 60 .bench/$b/bench --only "fused_linear_ce_fwd_bwd BT8192" 2>&1 | grep -E "vocabulary blocks|^fused" | grep -E "BT8192" | grep -v skipped | cut -c1-200
done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
sed '183s/for dt in (torch.bfloat16, torch.float32):/for dt in (torch.bfloat16,):/' .peers/peers.py > /tmp/peers.py
SECTIONS=flce PYTHONPATH=/tmp/site timeout 120 python3 /tmp/peers.py 2>&1 | tail -8; echo "peers rc=$?"
} > $R 2>&1
cat $R
