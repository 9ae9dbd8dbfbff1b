set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 60 .bench/matmul-test-np tensor_core > $OUT/tests-np.txt 2>&1; echo "np tests rc=$?"; grep "test result\|panicked" $OUT/tests-np.txt
for round in 1 2; do
  for b in target/release/examples/bench .bench/bench-np; do
    echo "== $b round $round" >> $OUT/bench-tc.err
    timeout 60 $b --only matmul_fwd_tc,matmul_bwd_tc > /dev/null 2> $OUT/one.err; echo "$b round $round rc=$?"; grep TFLOP $OUT/one.err | sort -u; cat $OUT/one.err >> $OUT/bench-tc.err
  done
done
for round in 1 2; do
  for hold in 0 1; do
    echo "== hold $hold round $round" >> $OUT/bench-sm.err
    if [ $hold = 1 ]; then export WGRAD_SOFTMAX_HOLD_OUT=1; else unset WGRAD_SOFTMAX_HOLD_OUT; fi
    timeout 60 target/release/examples/bench --only softmax_backward_from_output > $OUT/one.txt 2> $OUT/one.err; echo "hold $hold round $round rc=$?"; grep -i "from_output" $OUT/one.txt $OUT/one.err | head -4; cat $OUT/one.txt >> $OUT/bench-sm.err
  done
done
unset WGRAD_SOFTMAX_HOLD_OUT
rm -f $OUT/one.err $OUT/one.txt
timeout 60 target/release/examples/check softmax,log_softmax,softmax_backward_from_output,matmul_tensor_cores > $OUT/check.txt 2>&1; echo "check rc=$?"; tail -3 $OUT/check.txt
