. .bench/head.sh
for t in attention dual_chunk graph; do
  echo "== $t tests" >> $R
  timeout 150 .bench/s31/$t > /tmp/t.txt 2>&1; echo "rc=$?" >> $R
  grep -E "test result|FAILED|panicked" /tmp/t.txt >> $R; cp /tmp/t.txt $OUT/tests-$t.txt
done
echo "== check: default limits, entry points" >> $R
timeout 150 .bench/s31/check operator_checks_pass_on_a_device_with_webgpu_default_limits entry_points > /tmp/t.txt 2>&1
echo "rc=$?" >> $R; grep -E "test result|FAILED|panicked" /tmp/t.txt >> $R; cp /tmp/t.txt $OUT/tests-check.txt
echo "== attention and dual chunk rows" >> $R
timeout 200 .bench/s31/bench --only attention_fwd,dual_chunk > /tmp/o.txt 2>&1
echo "rc=$?" >> $R; cp /tmp/o.txt $OUT/attention-rows.txt; grep -E "^(attention|dual_chunk|copy)" /tmp/o.txt >> $R
cat $R
