. .bench/head.sh
echo "== bench norm+softmax 3cdcdc9" >> $R
timeout 200 $B --json $OUT/bench-a.json --only rms_norm,layer_norm,add_rms_norm,softmax,log_softmax > /tmp/a.txt 2>&1; echo "bench rc=$?" >> $R; cat /tmp/a.txt >> $R
echo "== peers norm,softmax" >> $R
PYTHONPATH=/tmp/site SECTIONS=norm,softmax OUT=/tmp timeout 330 python3 .peers/peers.py >> $R 2>&1; echo "peers rc=$?" >> $R
tail -5 $R
