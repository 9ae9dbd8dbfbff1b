# The device's float controls (Vulkan 1.2): can it keep FP32 subnormals (DenormPreserve)?
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
WGRAD_PROBE_FLOAT_CONTROLS=1 timeout 60 .bench/s14p/bench --only none > $OUT/float-controls.txt 2>&1
echo "rc=$?"; head -4 $OUT/float-controls.txt
