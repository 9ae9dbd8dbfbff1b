set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for v in mms mmd; do
  timeout 60 .bench/s11/$v --only "matmul_fwd f32" --pipeline-stats > /tmp/s-$v.txt 2>&1
  grep "^matmul gemm" /tmp/s-$v.txt | sed -E 's/Binary Size [0-9]+, Stack Size 0, //; s/^/'$v' /'
done > $OUT/stats.txt 2>&1
cat $OUT/stats.txt
for r in 1 2; do
  for v in mms mmd; do
    timeout 120 .bench/s11/$v --only "matmul_fwd,matmul_bwd,fused_linear_ce_fwd_bwd BT2048" > /tmp/$v-$r.txt 2>&1
    grep -E "TFLOP|fused_linear|rror" /tmp/$v-$r.txt | grep -v "_tc" | sed "s/^/$v r$r /"
  done
done > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
