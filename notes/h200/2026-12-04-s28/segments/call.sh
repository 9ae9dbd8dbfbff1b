. .bench/head.sh
R=$OUT/results.txt
B=.bench/s28/bench
timeout 120 .bench/s28/norm > /tmp/t.txt 2>&1; echo "norm rc=$? $(grep 'test result' /tmp/t.txt)" >> $R; grep "FAILED\|panicked" -A3 /tmp/t.txt >> $R
for i in 1 2; do for v in 0 rule; do
  echo "== seg $v run $i" >> $R
  if [ $v = rule ]; then unset WGRAD_NORM_SEGMENT; else export WGRAD_NORM_SEGMENT=$v; fi
  timeout 150 $B --only rms_norm,layer_norm,add_rms_norm,group_norm,poly_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -E " fwd | bwd |^copy " /tmp/o.txt >> $R
done; done
for v in 16 8; do
  echo "== seg $v" >> $R
  WGRAD_NORM_SEGMENT=$v timeout 60 $B --only group_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -E " fwd |^copy " /tmp/o.txt >> $R
done
cat $R
