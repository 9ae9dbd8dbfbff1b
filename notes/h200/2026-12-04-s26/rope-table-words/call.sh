. .bench/head.sh
echo "== rope tests (new)" >> $R
timeout 120 .bench/tb/rope > /tmp/t.txt 2>&1; echo "rope rc=$? $(grep 'test result' /tmp/t.txt)" >> $R; grep "FAILED\|panicked" /tmp/t.txt >> $R
for i in 1 2; do for b in old new; do
  if [ $b = old ]; then BIN=.bench/new/bench; else BIN=.bench/rope/bench; fi
  echo "== $b run $i" >> $R
  timeout 100 $BIN --only rope > /tmp/o.txt 2>&1; grep -E "^rope|^copy " /tmp/o.txt >> $R
done; done
tail -3 $R
