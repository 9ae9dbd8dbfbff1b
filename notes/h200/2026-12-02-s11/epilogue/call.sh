set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
(time timeout 150 .bench/s11/matmul-test --test-threads 4) > $OUT/tests.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/tests.txt | head
for r in 1 2; do
  for v in bold bnew; do
    timeout 80 .bench/s11/$v --only "matmul_fwd_tc,matmul_bwd_tc" > /tmp/$v-$r.txt 2>&1
    grep -E "TFLOP|rror" /tmp/$v-$r.txt | sed "s/^/$v r$r /"
  done
done > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
