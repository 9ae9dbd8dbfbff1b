#!/usr/bin/env bash
# s2 (W's and x's maxima once a call; vocabulary blocks a multiple of 8) against s1 (HEAD
# 20616cf): tests first, then the BF16 FLCE rows alternating, s2's profile and BT 8,192 rows,
# then the peer script's FLCE section (BF16) in the same command.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 120 .bench/s2/matmul-test tensor_core > $OUT/r/tests-matmul.txt 2>&1; echo "matmul tests rc=$?"; grep "test result" $OUT/r/tests-matmul.txt
timeout 200 .bench/s2/fused_linear-test > $OUT/r/tests-fused_linear.txt 2>&1; echo "fused_linear tests rc=$?"; grep -E "test result|FAILED|panicked" $OUT/r/tests-fused_linear.txt | head
timeout 150 .bench/s2/check matmul_tensor_cores fused_linear_cross_entropy mlp > $OUT/r/check.txt 2>&1; echo "check rc=$?"; tail -5 $OUT/r/check.txt
export WGRAD_FLCE_LABELS="bf16 tc+grads,bf16 tc+grads head"
for r in 1 2; do for v in s1 s2; do
  timeout 100 .bench/$v/bench --only "fused_linear_ce_fwd_bwd BT2048" > $OUT/r/bench-$v-$r.txt 2>&1
  echo "$v r$r rc=$?"; grep -E "^fused" $OUT/r/bench-$v-$r.txt | cut -c1-150
done; done
timeout 100 .bench/s2/bench --profile --only "fused_linear_ce_fwd_bwd BT2048" > $OUT/r/profile-s2.txt 2>&1; echo "profile rc=$?"
grep -E "profile.*(tc_scale|gemm)" $OUT/r/profile-s2.txt | cut -c1-150
timeout 150 .bench/s2/bench --only "fused_linear_ce_fwd_bwd BT8192" > $OUT/r/bench-s2-8192.txt 2>&1; echo "s2 8192 rc=$?"; grep -E "^fused" $OUT/r/bench-s2-8192.txt | cut -c1-150
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
sed '183s/for dt in (torch.bfloat16, torch.float32):/for dt in (torch.bfloat16,):/' .peers/peers.py > /tmp/peers.py
SECTIONS=flce PYTHONPATH=/tmp/site timeout 150 python3 /tmp/peers.py > $OUT/r/peers.txt 2>&1; echo "peers rc=$?"; tail -6 $OUT/r/peers.txt
