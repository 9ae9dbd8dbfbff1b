# BF16 conversion in hardware, rounding to nearest even asked for by an FPRoundingMode RTE
# decoration on each conversion (the driver truncated without it): the tests that compare
# 16-bit outputs bit for bit; if they fail, again with the RoundingModeRTE execution mode as
# well. If one passes: the BF16 rows with the conversion on and off, and the norm, RoPE and
# softmax peers in the same command.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
tests() {
  ok=0
  for t in norm loss rope activation attention grpo reduce; do
    s=$(date +%s); timeout 60 /tmp/tb/$t > /tmp/t-$t.txt 2>&1; rc=$?; [ $rc -eq 0 ] || ok=1
    echo "$1 $t rc=$rc $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$t.txt | tail -1)"
    grep -h '^test .* FAILED$' /tmp/t-$t.txt; grep -h -A1 "panicked" /tmp/t-$t.txt | cut -c1-300 | head -4
  done
  return $ok
}
if tests decoration; then mode=decoration; else
  export WGRAD_BF16_RTE_EXECUTION_MODE=1
  if tests execution-mode; then mode=execution-mode; else echo "no mode rounds to nearest even"; exit 1; fi
fi
echo "mode $mode"
B=.bench/s15/bench
ROWS="rms_norm fwd,layer_norm fwd,add_rms_norm fwd,rms_norm bwd_as,layer_norm bwd_as,softmax,log_softmax,rope_fwd,rope_bwd_as,swiglu_fwd,geglu_fwd,swiglu_bwd_as,kl_div_backward_as,jsd_backward_as"
for conv in 1 0; do
  WGRAD_BF16_CONVERSION=$conv timeout 90 $B --only "$ROWS" --json $OUT/bench-$conv.json > $OUT/bench-$conv.txt 2>&1
  echo "bench conv=$conv rc=$?"
done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
OUT=$OUT SECTIONS=norm,rope,softmax timeout 150 python3 .peers/peers.py > $OUT/peers.txt 2>&1
echo "peers rc=$?"
# The engine binary timed out (100 s) in the previous call: which test, one at a time.
timeout 40 /tmp/tb/engine --test-threads=1 > $OUT/engine.txt 2>&1; echo "engine rc=$?"; tail -3 $OUT/engine.txt
for f in $OUT/bench-1.txt $OUT/bench-0.txt; do echo "== $f"; grep -E "^[a-z_ ]+ +[0-9x]+ +bf16 " $f | cut -c1-110; done
