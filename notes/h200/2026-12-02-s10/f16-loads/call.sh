set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
(time timeout 150 .bench/new/matmul-test --test-threads 4) > $OUT/tests.txt 2>&1; grep "test result" $OUT/tests.txt
for r in 1 2; do
  for v in old new; do
    timeout 100 .bench/$v/bench --only "matmul_fwd_tc,matmul_bwd_tc" > /tmp/$v-$r.txt 2>&1
    grep -E "TFLOP|error|Error" /tmp/$v-$r.txt | sed "s/^/$v r$r /"
  done
done > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
timeout 60 .bench/new/check matmul_tensor_cores matmul > $OUT/check.txt 2>&1; tail -5 $OUT/check.txt
