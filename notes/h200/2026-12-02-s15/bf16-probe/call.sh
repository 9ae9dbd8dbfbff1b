# Does the driver offer VK_KHR_shader_bfloat16 (hardware F32 -> BF16 conversion in shaders)?
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
WGRAD_PROBE_FLOAT_CONTROLS=1 timeout 60 .bench/s15p/bench --only none > $OUT/probe.txt 2>&1
echo "rc=$?"; head -4 $OUT/probe.txt; nvidia-smi --query-gpu=driver_version --format=csv
