. .bench/head.sh
R=$OUT/results.txt
B=.bench/s29/bench
for mode in rule wide8 rule2; do
  echo "== bench $mode" >> $R
  if [ $mode = wide8 ]; then export WGRAD_NORM_BWD_LANES=1024 WGRAD_NORM_WIDE8=1; else unset WGRAD_NORM_BWD_LANES WGRAD_NORM_WIDE8; fi
  timeout 100 $B --only rms_norm,layer_norm,add_rms_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -v "^ " /tmp/o.txt | grep -E "^copy|bwd" >> $R
done
unset WGRAD_NORM_BWD_LANES WGRAD_NORM_WIDE8
echo "== profile chunk passes forced" >> $R
WGRAD_NORM_CHUNK_PASSES=1 timeout 150 $B --only rms_norm,layer_norm,add_rms_norm --profile > $OUT/profile.txt 2>&1; echo "rc=$?" >> $R
grep -A6 "bwd.*2048x32768" $OUT/profile.txt >> $R
cat $R
