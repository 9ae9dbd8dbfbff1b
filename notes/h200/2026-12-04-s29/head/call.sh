. .bench/head.sh
R=$OUT/results.txt
echo "== tests" >> $R
timeout 80 .bench/s29/norm > /tmp/t.txt 2>&1; echo "tests rc=$?" >> $R; grep -E "test result|FAILED|panicked" /tmp/t.txt >> $R
echo "== bench" >> $R
timeout 60 .bench/s29/bench --only layer_norm,add_rms_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -v "^ " /tmp/o.txt | grep -E "^copy|32768" >> $R
cat $R
