. .bench/head.sh
R=$OUT/results.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv >> $R
for t in norm; do
  timeout 150 .bench/s27/$t > /tmp/t.txt 2>&1; echo "$t rc=$? $(grep 'test result' /tmp/t.txt)" >> $R; grep "FAILED\|panicked" -A3 /tmp/t.txt >> $R
done
for i in 1 2; do
  echo "== bench run $i" >> $R
  timeout 150 .bench/s27/bench --only modulated_rms_norm,group_norm,poly_norm,dyt > /tmp/o.txt 2>&1; echo "rc=$?" >> $R; grep -E " fwd | bwd |^copy " /tmp/o.txt >> $R
done
echo "== profile" >> $R
timeout 100 .bench/s27/bench --only group_norm --profile > /tmp/p.txt 2>&1; grep -E "profile" /tmp/p.txt | grep bwd >> $R
echo "== peers" >> $R
(cd scripts && PYTHONPATH=/tmp/site OUT=$OUT timeout 300 python3 peer_norms_liger.py) >> $R 2>&1; echo "peers rc=$?" >> $R
tail -5 $R
