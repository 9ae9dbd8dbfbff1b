#!/usr/bin/env bash
# The final build's tensor-core tests (matmul, fused linear) and the tensor-core check.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 120 .bench/s6/matmul-test tensor_core 2>&1 | grep -E "^test |test result|panicked"; echo "matmul rc=${PIPESTATUS[0]}"
timeout 100 .bench/s6/fused_linear-test 2>&1 | grep -E "test result|panicked|FAILED"; echo "fused_linear rc=${PIPESTATUS[0]}"
timeout 100 .bench/s6/check matmul_tensor_cores fused_linear_cross_entropy 2>&1 | tail -3; echo "check rc=${PIPESTATUS[0]}"
