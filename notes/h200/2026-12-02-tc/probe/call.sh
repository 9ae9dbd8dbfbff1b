set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 60 .bench/matmul-test tensor_core --nocapture > $OUT/tests-tc.txt 2>&1; echo "tc rc=$?"; tail -30 $OUT/tests-tc.txt
timeout 200 target/release/examples/bench --only matmul_fwd > $OUT/bench.txt 2> $OUT/bench.err; echo "bench rc=$?"; grep -i "tflop" $OUT/bench.err | tail -20; tail -5 $OUT/bench.err
