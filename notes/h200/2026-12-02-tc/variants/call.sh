set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 90 .bench/matmul-test tensor_core --nocapture > $OUT/tests-tc.txt 2>&1; echo "tc rc=$?"; grep "test result\|panicked" $OUT/tests-tc.txt
for round in 1 2; do
  for v in 1,32 0,32 2,32 1,64 2,64; do
    WGRAD_TC=$v timeout 60 target/release/examples/bench --only matmul_fwd_tc > $OUT/bench-${v/,/_}-$round.txt 2> $OUT/bench-${v/,/_}-$round.err
    echo "variant $v round $round rc=$?"; grep "TFLOP" $OUT/bench-${v/,/_}-$round.err | sort -u
  done
done
