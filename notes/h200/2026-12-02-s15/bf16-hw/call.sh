# BF16 conversion in hardware (VK_KHR_shader_bfloat16): the rows that round to BF16 with it on
# (the default) and off (WGRAD_BF16_CONVERSION=0), then the whole test suite with it on, then
# the rows again.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/s15/bench
ROWS="rms_norm fwd,layer_norm fwd,add_rms_norm fwd,rms_norm bwd_as,layer_norm bwd_as,softmax,log_softmax,rope_fwd,rope_bwd_as,swiglu_fwd,geglu_fwd,swiglu_bwd_as,kl_div_backward_as,jsd_backward_as"
bench() {
  for conv in 1 0; do
    s=$(date +%s)
    WGRAD_BF16_CONVERSION=$conv timeout 90 $B --only "$ROWS" --json $OUT/bench-$conv-$1.json > $OUT/bench-$conv-$1.txt 2>&1
    echo "bench conv=$conv run=$1 rc=$? $(( $(date +%s) - s ))s"; head -1 $OUT/bench-$conv-$1.txt | cut -c1-200
  done
}
bench 1
TEST_TIMEOUT=100 bash scripts/tests-h200.sh > /dev/null 2>&1; echo "tests rc=$?"
cat $OUT/summary.txt
bench 2
for f in $OUT/bench-1-1.txt $OUT/bench-0-1.txt; do echo "== $f"; grep -E " bf16 " $f; done
