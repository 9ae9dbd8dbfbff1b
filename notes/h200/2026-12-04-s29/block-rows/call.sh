. .bench/head.sh
R=$OUT/results.txt
B=.bench/s29/bench
echo "== tests" >> $R
timeout 100 .bench/s29/norm > /tmp/t.txt 2>&1; echo "tests rc=$?" >> $R; grep -E "test result|FAILED|panicked" /tmp/t.txt >> $R
for mode in 32 64 128 32 64 128; do
  echo "== bench chunk rows $mode" >> $R
  WGRAD_NORM_CHUNK_ROWS=$mode timeout 100 $B --only rms_norm,layer_norm,add_rms_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -v "^ " /tmp/o.txt | grep -E "^copy|bwd" >> $R
done
cat $R
