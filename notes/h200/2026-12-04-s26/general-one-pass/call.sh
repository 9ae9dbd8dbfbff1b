. .bench/head.sh
echo "== norm tests (new)" >> $R
timeout 150 .bench/tb/norm > /tmp/t.txt 2>&1; echo "norm rc=$? $(grep 'test result' /tmp/t.txt)" >> $R; grep "FAILED\|panicked" /tmp/t.txt >> $R
for i in 1 2; do for b in old new; do
  if [ $b = old ]; then BIN=.bench/new/bench; else BIN=.bench/gn/bench; fi
  echo "== $b run $i" >> $R
  timeout 100 $BIN --only layer_norm,group_norm > /tmp/o.txt 2>&1; grep -E "^layer_norm|^group_norm|^copy " /tmp/o.txt >> $R
done; done
tail -3 $R
