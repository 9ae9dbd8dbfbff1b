. .bench/head.sh
echo "== norm tests (new)" >> $R
timeout 150 .bench/tb/norm > /tmp/t.txt 2>&1; echo "norm rc=$? $(grep 'test result' /tmp/t.txt)" >> $R; grep "FAILED\|panicked" /tmp/t.txt >> $R
for i in 1 2; do for b in old new; do
  if [ $b = old ]; then BIN=.bench/gn/bench; else BIN=.bench/gp/bench; fi
  echo "== $b run $i" >> $R
  timeout 100 $BIN --only group_norm > /tmp/o.txt 2>&1; grep -E "^group_norm|^copy " /tmp/o.txt >> $R
done; done
echo "== profile old" >> $R
timeout 100 .bench/gn/bench --only group_norm --profile > /tmp/p.txt 2>&1; tail -40 /tmp/p.txt >> $R
echo "== profile new" >> $R
timeout 100 .bench/gp/bench --only group_norm --profile > /tmp/p.txt 2>&1; tail -40 /tmp/p.txt >> $R
tail -3 $R
