set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for r in 1 2; do timeout 120 .bench/bench-exp2 --only softmax_backward,sbexp > /tmp/e$r.txt 2>&1; grep median /tmp/e$r.txt | sed "s/^/r$r /"; done | tee $OUT/exp.txt
