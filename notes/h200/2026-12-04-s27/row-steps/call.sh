. .bench/head.sh
R=$OUT/results.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv >> $R
echo "== norm tests" >> $R
timeout 120 .bench/s27/norm > /tmp/t.txt 2>&1; echo "norm rc=$? $(grep 'test result' /tmp/t.txt)" >> $R; grep "FAILED\|panicked" /tmp/t.txt >> $R
for i in 1 2; do for s in 1 2 4 8 16; do
  echo "== rows $s run $i" >> $R
  WGRAD_NORM_FWD_ROWS=$s timeout 100 .bench/s27/bench --only rms_norm,layer_norm,add_rms_norm > /tmp/o.txt 2>&1; grep -E " fwd |^copy " /tmp/o.txt >> $R
done; done
tail -3 $R
