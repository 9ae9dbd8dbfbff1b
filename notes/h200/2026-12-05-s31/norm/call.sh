# The session-30 plan (`notes/h200/2026-12-04-s30/plan/call.sh`) on build a6340c6: the norm
# test binary, modulated RMSNorm's backward by the general passes (the rule) against the
# chunk passes (forced), alternating twice, and the rows whose bindings changed in session 30.
# Carry [".gl", ".whl", ".peers", ".bench"], .bench/s31/* stripped release builds of a6340c6.
. .bench/head.sh
echo "== norm tests" >> $R
timeout 150 .bench/s31/norm > /tmp/t.txt 2>&1; echo "tests rc=$?" >> $R; grep -E "test result|FAILED|panicked" /tmp/t.txt >> $R
for run in 1 2; do
  for forced in "" 1; do
    echo "== modulated, WGRAD_NORM_CHUNK_PASSES=$forced run $run" >> $R
    WGRAD_NORM_CHUNK_PASSES=$forced timeout 100 .bench/s31/bench --only modulated_rms_norm > /tmp/o.txt 2>&1
    echo "rc=$?" >> $R; grep -E "GB/s|^copy|modulated" /tmp/o.txt >> $R
    cp /tmp/o.txt $OUT/modulated-$run-${forced:-rule}.txt
  done
done
echo "== norm rows" >> $R
timeout 170 .bench/s31/bench --only layer_norm,add_rms_norm,group_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R
grep -E "GB/s|^copy|norm" /tmp/o.txt >> $R
cp /tmp/o.txt $OUT/norm-rows.txt
cat $R
