set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/n2
{ timeout 120 $B/mlp-test --test-threads 4; timeout 120 $B/fl-test tensor_cores --test-threads 4; timeout 100 $B/matmul-test tensor_core --test-threads 4; } > $OUT/tests.txt 2>&1; grep -E "test result|FAILED|panicked" $OUT/tests.txt
timeout 120 $B/check mlp fused_linear_cross_entropy matmul_tensor_cores > $OUT/check.txt 2>&1; tail -4 $OUT/check.txt
timeout 240 $B/bench --only "swiglu_mlp,fused_linear_ce_fwd_bwd" > $OUT/bench.txt 2> $OUT/bench.err; grep -E "TFLOP|peak|rror" $OUT/bench.err | head -40; grep -E "swiglu|fused" $OUT/bench.txt | head -40
for r in 1 2; do timeout 60 .bench/pk/bench --only tc_peak 2>&1 | grep -E "TFLOP|rror" | sed "s/^/r$r /"; done > $OUT/peak.txt; cat $OUT/peak.txt
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm --format=csv >> $OUT/peak.txt
