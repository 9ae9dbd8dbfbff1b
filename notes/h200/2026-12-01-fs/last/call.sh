set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 40 .bench/matmul-test --test-threads 4 > $OUT/tests-matmul.txt 2>&1; echo "matmul rc=$?"; grep "test result" $OUT/tests-matmul.txt
timeout 30 .bench/tensor-test --test-threads 4 > $OUT/tests-tensor.txt 2>&1; echo "tensor rc=$?"; grep "test result" $OUT/tests-tensor.txt
timeout 60 target/release/examples/check matmul,matmul_as,mlp,fused_linear_cross_entropy,rms_norm,softmax,embedding > $OUT/check.txt 2>&1; echo "check rc=$?"; tail -8 $OUT/check.txt
