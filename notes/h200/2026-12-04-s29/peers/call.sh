. .bench/head.sh
R=$OUT/results.txt
echo "== bench" >> $R
timeout 120 .bench/s29/bench --only rms_norm,layer_norm,add_rms_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -v "^ " /tmp/o.txt | grep -E "GB/s|^copy|norm" >> $R
echo "== peers norm" >> $R
PYTHONPATH=/tmp/site SECTIONS=norm OUT=/tmp timeout 300 python3 .peers/peers.py >> $R 2>&1; echo "peers rc=$?" >> $R
cat $R
