. .bench/head.sh
R=$OUT/results.txt
echo "== tests" >> $R
timeout 200 .bench/s29/norm > /tmp/t.txt 2>&1; echo "tests rc=$?" >> $R; grep -E "test result|FAILED|panicked" /tmp/t.txt >> $R
for mode in rule 0 1 rule2; do
  echo "== bench $mode" >> $R
  case $mode in rule*) unset WGRAD_NORM_CHUNK_PASSES;; *) export WGRAD_NORM_CHUNK_PASSES=$mode;; esac
  timeout 100 .bench/s29/bench --only rms_norm,layer_norm,add_rms_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -v "^ " /tmp/o.txt | grep -E "^copy|bwd" >> $R
done
cat $R
