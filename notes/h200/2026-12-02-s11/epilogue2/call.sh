set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
(time timeout 150 .bench/s11/matmul-test --test-threads 4) > $OUT/tests.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/tests.txt | head
(time timeout 100 .bench/s11/fl-test tensor_cores --test-threads 4) > $OUT/tests-fl.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/tests-fl.txt | head
for r in 1 2; do
  for v in bold bnew; do
    timeout 120 .bench/s11/$v --only "matmul_fwd_tc,rms_norm fwd,layer_norm fwd,add_rms_norm fwd" > /tmp/$v-$r.txt 2>&1
    grep -E "TFLOP|_norm fwd  |rror" /tmp/$v-$r.txt | sed "s/^/$v r$r /"
  done
done > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
