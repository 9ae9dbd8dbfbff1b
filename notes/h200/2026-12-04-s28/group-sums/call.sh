. .bench/head.sh
R=$OUT/results.txt
timeout 120 .bench/s28/norm > /tmp/t.txt 2>&1; echo "norm rc=$? $(grep 'test result' /tmp/t.txt)" >> $R; grep "FAILED\|panicked" -A3 /tmp/t.txt >> $R
for i in 1 2; do for b in old bench; do
  echo "== $b run $i" >> $R
  timeout 60 .bench/s28/$b --only group_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -E "group_norm|^copy " /tmp/o.txt | grep -v "^ " >> $R
done; done
echo "== profile" >> $R
timeout 60 .bench/s28/bench --only group_norm --profile > /tmp/p.txt 2>&1; grep -E "profile|group|sum" /tmp/p.txt | grep -i bwd -A12 | head -40 >> $R
cat $R
