# Divergences with 16-bit inputs and F32 outputs by half chunks (`div_bwd_h`, `div_elems_h`:
# contiguous vec4 stores) against the whole-chunk kernels of the build before (.bench/s17b),
# alternating twice; the activation windows' build on the SwiGLU / GeGLU rows likewise. First
# the loss and activation test binaries and `check`.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
N=.bench/s17c; O=.bench/s17b
for t in loss activation; do
  s=$(date +%s)
  timeout 60 $N/$t > /tmp/t-$t.txt 2>&1
  echo "$t rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$t.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$t.txt | head -30
done > $OUT/tests.txt 2>&1
timeout 90 $N/check > $OUT/check.txt 2>&1; echo "check rc=$?" >> $OUT/tests.txt
grep -c PASS $OUT/check.txt >> $OUT/tests.txt; grep -E "FAIL|ERROR" $OUT/check.txt | head >> $OUT/tests.txt
cat $OUT/tests.txt
ONLY="kl_div,jsd,tvd,swiglu_fwd,swiglu_bwd,swiglu_packed,geglu"
for r in 1 2; do
  for b in old new; do
    if [ $b = old ]; then B=$O; else B=$N; fi
    timeout 80 $B/bench --only $ONLY --json $OUT/bench-$b-$r.json > $OUT/bench-$b-$r.txt 2>&1
    echo "$b $r rc=$?"
  done
done
for f in $OUT/bench-*-1.txt; do echo "== $f"; grep -E "^(kl_div|jsd|tvd|swiglu|geglu)" $f | grep -E "bf16|f32" | awk '{print $1, $2, $3, $5, $8}'; done
