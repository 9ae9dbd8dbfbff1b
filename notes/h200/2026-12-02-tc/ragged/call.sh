set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 60 .bench/matmul-test --test-threads 4 > $OUT/tests-matmul.txt 2>&1; echo "matmul rc=$?"; grep "test result\|panicked" -A3 $OUT/tests-matmul.txt
for round in 1 2; do
  timeout 60 target/release/examples/bench --only matmul_fwd_tc,matmul_bwd_tc > /dev/null 2> $OUT/one.err; echo "round $round rc=$?"; grep TFLOP $OUT/one.err | sort -u; cat $OUT/one.err >> $OUT/bench.err
done
rm -f $OUT/one.err
timeout 30 target/release/examples/check matmul_tensor_cores > $OUT/check.txt 2>&1; echo "check rc=$?"; tail -2 $OUT/check.txt
