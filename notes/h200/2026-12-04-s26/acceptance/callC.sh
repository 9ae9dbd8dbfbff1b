. .bench/head.sh
echo "== tests 3cdcdc9" >> $R
for t in norm activation rope loss; do s=$(date +%s); timeout 170 .bench/tb/$t > /tmp/t-$t.txt 2>&1; rc=$?; echo "$t rc=$rc $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$t.txt | tail -1)" >> $R; grep -h '^test .* FAILED$\|panicked' /tmp/t-$t.txt | head -20 >> $R; done
echo "== check" >> $R
s=$(date +%s); timeout 200 .bench/bin/check > /tmp/check.txt 2>&1; echo "check rc=$? $(( $(date +%s) - s ))s" >> $R; cat /tmp/check.txt >> $R
tail -8 $R
