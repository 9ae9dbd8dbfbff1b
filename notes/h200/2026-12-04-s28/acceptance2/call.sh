. .bench/head.sh
R=$OUT/results.txt
echo "== bench" >> $R
timeout 150 .bench/s28/bench --only rms_norm,layer_norm,add_rms_norm,group_norm > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -v "^ " /tmp/o.txt | grep -E "GB/s|^copy|norm" >> $R
echo "== peers" >> $R
(cd scripts && PYTHONPATH=/tmp/site OUT=$OUT timeout 240 python3 peer_norms_liger.py) >> $R 2>&1; echo "peers rc=$?" >> $R
for t in norm reduce loss hostile; do
  timeout 120 .bench/s28/$t > /tmp/t.txt 2>&1; echo "$t rc=$? $(grep 'test result' /tmp/t.txt)" >> $R; grep "FAILED\|panicked" -A3 /tmp/t.txt >> $R
done
cat $R
