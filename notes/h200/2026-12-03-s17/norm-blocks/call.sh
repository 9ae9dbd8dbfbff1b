# Build 7d414ae's tree plus the `binding_windows` check and a measurement switch of the norm
# register backwards' most blocks (WGRAD_NORM_BLOCKS): the loss, activation, cast and engine
# test binaries, `check` of the windowed and loss operators, then the norm rows with the
# default 256 blocks, 512 and 1,024, alternating twice.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/s17d
for t in loss activation cast engine; do
  s=$(date +%s)
  timeout 60 $B/$t > /tmp/t-$t.txt 2>&1
  echo "$t rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$t.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$t.txt | head -30
done > $OUT/tests.txt 2>&1
timeout 90 $B/check binding_windows,cast,softmax,log_softmax,sparsemax,cross_entropy,cross_entropy_in_place,cross_entropy_backward_as,cross_entropy_soft,kl_div,jsd,tvd,swiglu > $OUT/check.txt 2>&1
echo "check rc=$?" >> $OUT/tests.txt; tail -3 $OUT/check.txt >> $OUT/tests.txt
cat $OUT/tests.txt
for r in 1 2; do
  for n in 256 512 1024; do
    WGRAD_NORM_BLOCKS=$n timeout 70 $B/bench --only rms_norm,layer_norm,add_rms_norm --json $OUT/bench-$n-$r.json > $OUT/bench-$n-$r.txt 2>&1
    echo "blocks $n run $r rc=$?"
  done
done
for n in 256 512 1024; do echo "== $n"; grep -E "bwd" $OUT/bench-$n-1.txt | awk '{print $1, $2, $3, $4, $6, $10}'; done
