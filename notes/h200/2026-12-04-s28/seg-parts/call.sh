. .bench/head.sh
R=$OUT/results.txt
timeout 90 .bench/s28/norm > /tmp/t.txt 2>&1; echo "norm rc=$? $(grep 'test result' /tmp/t.txt)" >> $R; grep "FAILED\|panicked" -A3 /tmp/t.txt >> $R
for i in 1 2; do for b in old mid bench; do
  echo "== $b run $i" >> $R
  timeout 70 .bench/s28/$b --only rms_norm,layer_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -E "^copy | bwd" /tmp/o.txt | grep -v "^ " >> $R
done; done
cat $R
