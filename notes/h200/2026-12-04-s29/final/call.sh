. .bench/head.sh
R=$OUT/results.txt
echo "== bench" >> $R
timeout 150 .bench/s29/bench --only rms_norm,layer_norm,add_rms_norm,group_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -v "^ " /tmp/o.txt | grep -E "GB/s|^copy|norm" >> $R
echo "== peers" >> $R
(cd scripts && PYTHONPATH=/tmp/site OUT=$OUT timeout 240 python3 peer_norms_liger.py) >> $R 2>&1; echo "peers rc=$?" >> $R
cat $R
