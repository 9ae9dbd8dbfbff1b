set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 120 .bench/matmul-test tensor_core --nocapture > $OUT/tests-tc.txt 2>&1; echo "tc rc=$?"; grep "test result\|panicked" -A4 $OUT/tests-tc.txt | head -20
for round in 1 2; do
  for v in 1_64 1_64_bt 1_32_bt 2_64_bt; do
    echo "== variant $v round $round" >> $OUT/bench.err
    WGRAD_TC=$v timeout 60 target/release/examples/bench --only matmul_fwd_tc,matmul_bwd_tc > /dev/null 2> $OUT/one.err
    echo "variant $v round $round rc=$?"; grep "TFLOP" $OUT/one.err | sort -u; cat $OUT/one.err >> $OUT/bench.err
  done
done
rm -f $OUT/one.err
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site SECTIONS=mm timeout 120 python3 .peers/peers.py > $OUT/peers.txt 2>&1; echo "peers rc=$?"; grep -i "matmul" $OUT/peers.txt
