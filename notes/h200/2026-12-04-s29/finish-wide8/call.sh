. .bench/head.sh
R=$OUT/results.txt
B=.bench/s29/bench
for mode in rule wide8 rule2 wide8b; do
  echo "== bench $mode" >> $R
  case $mode in wide8*) export WGRAD_NORM_WIDE8=1;; *) unset WGRAD_NORM_WIDE8;; esac
  timeout 100 $B --only rms_norm,layer_norm,add_rms_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -v "^ " /tmp/o.txt | grep -E "^copy|bwd" >> $R
done
unset WGRAD_NORM_WIDE8
echo "== profile rule" >> $R
timeout 150 $B --only rms_norm,layer_norm,add_rms_norm --profile > $OUT/profile.txt 2>&1; echo "rc=$?" >> $R
grep -A6 "bwd.*2048x32768" $OUT/profile.txt >> $R
cat $R
