. .bench/head.sh
R=$OUT/results.txt
B=.bench/s28/bench
timeout 120 .bench/s28/norm > /tmp/t.txt 2>&1; echo "norm rc=$? $(grep 'test result' /tmp/t.txt)" >> $R; grep "FAILED\|panicked" -A3 /tmp/t.txt >> $R
for i in 1 2; do for v in 0 rule; do
  echo "== seg $v run $i" >> $R
  if [ $v = rule ]; then unset WGRAD_NORM_SEGMENT; else export WGRAD_NORM_SEGMENT=$v; fi
  timeout 120 $B --only rms_norm,layer_norm,add_rms_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -E "^copy |65536x1024" /tmp/o.txt | grep -v "^ " >> $R
done; done
unset WGRAD_NORM_SEGMENT
for b in 512 1024; do
  echo "== rule, blocks $b" >> $R
  WGRAD_NORM_BLOCKS=$b timeout 120 $B --only rms_norm,layer_norm,add_rms_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -E "65536x1024" /tmp/o.txt | grep -v "^ " | grep bwd >> $R
done
echo "== profile" >> $R
timeout 120 $B --only rms_norm,layer_norm --profile > /tmp/p.txt 2>&1; grep -A4 "bwd.*65536x1024" /tmp/p.txt | grep -E "profile|GB/s" >> $R
cat $R
