# Build b5d9293: the norm test binary (the modulated chunk-pass rule), the attention test
# binary (the compact test's device request fixed), modulated RMSNorm and GroupNorm rows by the
# rule, twice; .bench/s31/{bench,norm,attention}.
. .bench/head.sh
for t in norm attention; do
  echo "== $t tests" >> $R
  timeout 150 .bench/s31/$t > /tmp/t.txt 2>&1; echo "rc=$?" >> $R
  grep -E "test result|FAILED|panicked" /tmp/t.txt >> $R; cp /tmp/t.txt $OUT/tests-$t.txt
done
for run in 1 2; do
  echo "== modulated by the rule, run $run" >> $R
  timeout 100 .bench/s31/bench --only modulated_rms_norm,group_norm > /tmp/o.txt 2>&1
  echo "rc=$?" >> $R; grep -E "^(modulated|group|copy)" /tmp/o.txt >> $R; cp /tmp/o.txt $OUT/rows-$run.txt
done
cat $R
