set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 100 .bench/s12/test-reduce > $OUT/tests3-reduce.txt 2>&1; echo "reduce rc=$?"
grep -E "test result|panicked|differ" $OUT/tests3-reduce.txt | cut -c1-300
