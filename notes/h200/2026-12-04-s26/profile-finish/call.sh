. .bench/head.sh
timeout 150 .bench/gp/bench --only dyt,poly_norm,modulated_rms_norm --profile > /tmp/p.txt 2>&1; grep -E "profile|median|^dyt|^poly|^modulated" /tmp/p.txt >> $R
tail -30 $R
