set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
(time timeout 150 .bench/s11/check matmul_tensor_cores,matmul,matmul_as,mlp,fused_linear_cross_entropy) > $OUT/check.txt 2>&1; tail -12 $OUT/check.txt
