. .bench/head.sh
R=$OUT/results.txt
echo "== tests" >> $R
timeout 100 .bench/s29/norm > /tmp/t.txt 2>&1; echo "tests rc=$?" >> $R; grep -E "test result|FAILED|panicked" /tmp/t.txt >> $R
echo "== bench" >> $R
timeout 120 .bench/s29/bench --only rms_norm,layer_norm,add_rms_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -v "^ " /tmp/o.txt | grep -E "GB/s|^copy|norm" >> $R
echo "== peers norm" >> $R
PYTHONPATH=/tmp/site SECTIONS=norm OUT=/tmp timeout 200 python3 .peers/peers.py >> $R 2>&1; echo "peers rc=$?" >> $R
cat $R
