. .bench/head.sh
R=$OUT/results.txt
timeout 100 .bench/s27/norm > /tmp/t.txt 2>&1; echo "norm rc=$? $(grep 'test result' /tmp/t.txt)" >> $R; grep "FAILED\|panicked" -A3 /tmp/t.txt >> $R
for i in 1 2; do for b in old bench; do
  echo "== $b run $i" >> $R
  timeout 60 .bench/s27/$b --only group_norm,poly_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -E " fwd | bwd |^copy " /tmp/o.txt >> $R
done; done
cat $R
