set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for v in 64p 64n 32p 32n 16p 16n; do
  timeout 60 .bench/s11/b$v --only "matmul_fwd_tc" --pipeline-stats > /tmp/s-$v.txt 2>&1
  echo "$v: $(grep -E 'TFLOP' /tmp/s-$v.txt | tr '\n' ' ')"
  grep "^matmul_tc" /tmp/s-$v.txt | sed -E 's/\[.*\] \|//; s/Binary Size [0-9]+, Stack Size 0, //; s/^/   /'
done > $OUT/stats.txt 2>&1
cat $OUT/stats.txt
for r in 1 2; do
  for v in 64p 64n 32p 32n 16p 16n; do
    timeout 80 .bench/s11/b$v --only "matmul_fwd_tc,matmul_bwd_tc" > /tmp/$v-$r.txt 2>&1
    grep -E "TFLOP|rror" /tmp/$v-$r.txt | sed "s/^/$v r$r /"
  done
done > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
