#!/usr/bin/env bash
# n1: raw words held until staged (one step ahead) and `gemm_tc_bias` (an F32 out's bias added to
# whole fragments) against the build before (base); the tensor-core tests and checks first;
# then the peer script's FLCE section, BF16 only, in the same command.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/r"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for t in "matmul tensor_core" "fused_linear tensor_cores" "mlp tensor_cores"; do
  set -- $t; s=$(date +%s)
  timeout 150 .bench/n1/$1-test $2 > $OUT/r/tests-$1.txt 2>&1
  echo "$1 $2 rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' $OUT/r/tests-$1.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" $OUT/r/tests-$1.txt | head -30
done | tee $OUT/r/tests.txt
timeout 120 .bench/n1/check matmul_tensor_cores fused_linear_cross_entropy mlp > $OUT/r/check.txt 2>&1; echo "check rc=$?"; grep -E "PASS|FAIL" $OUT/r/check.txt | cut -c1-150 | head
export WGRAD_FLCE_LABELS="f16 tc,bf16 tc,bf16 tc+grads,bf16 tc+grads head"
ONLY="matmul_fwd_tc,matmul_bwd_tc,fused_linear_ce_fwd_bwd"
for r in 1 2; do for v in base n1; do
  timeout 200 .bench/$v/bench --only "$ONLY" > $OUT/r/bench-$v-$r.txt 2>&1
  echo "$v r$r rc=$?"; grep -E "TFLOP/s|peak" $OUT/r/bench-$v-$r.txt | grep -v "GB/s" | sed "s/^/$v r$r /" | cut -c1-150
done; done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
sed '183s/for dt in (torch.bfloat16, torch.float32):/for dt in (torch.bfloat16,):/' .peers/peers.py > /tmp/peers.py
grep -n "for dt in (torch.bfloat16,):" /tmp/peers.py | head -2
SECTIONS=flce PYTHONPATH=/tmp/site timeout 200 python3 /tmp/peers.py > $OUT/r/peers.txt 2>&1; tail -8 $OUT/r/peers.txt
tar -C $OUT -czf $OUT/all.tgz r && rm -rf $OUT/r
