. .bench/head.sh
echo "== bench pointwise+losses 3cdcdc9" >> $R
timeout 260 $B --json $OUT/bench-b.json --only swiglu,geglu,rope,kl_div,jsd,tvd,cross_entropy > /tmp/b.txt 2>&1; echo "bench rc=$?" >> $R; cat /tmp/b.txt >> $R
echo "== peers swiglu,rope,ce" >> $R
PYTHONPATH=/tmp/site SECTIONS=swiglu,rope,ce OUT=/tmp timeout 200 python3 .peers/peers.py >> $R 2>&1; echo "peers rc=$?" >> $R
echo "== peers geglu" >> $R
PYTHONPATH=/tmp/site timeout 100 python3 scripts/peer_geglu_liger.py >> $R 2>&1; echo "geglu rc=$?" >> $R
tail -5 $R
