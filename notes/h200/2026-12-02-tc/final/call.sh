set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 100 .bench/matmul-test --test-threads 4 > $OUT/tests-matmul.txt 2>&1; echo "matmul rc=$?"; grep "test result\|panicked" $OUT/tests-matmul.txt
timeout 40 .bench/tensor-test --test-threads 4 > $OUT/tests-tensor.txt 2>&1; echo "tensor rc=$?"; grep "test result\|panicked" $OUT/tests-tensor.txt
timeout 120 target/release/examples/bench --only matmul > $OUT/bench.txt 2> $OUT/bench.err; echo "bench rc=$?"; grep "TFLOP" $OUT/bench.err | sort -u
timeout 270 target/release/examples/check > $OUT/check.txt 2>&1; echo "check rc=$?"; tail -4 $OUT/check.txt; grep -c PASS $OUT/check.txt; grep -v PASS $OUT/check.txt | grep -i "fail" | head
