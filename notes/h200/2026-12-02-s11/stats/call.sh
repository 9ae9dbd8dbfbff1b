set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
mkdir -p $OUT/ir
WGRAD_DUMP_IR=$OUT/ir timeout 420 .bench/s11/bench --prewarm 0.1 --only "rms_norm,layer_norm,add_rms_norm,rope_fwd,rope_bwd,softmax,log_softmax,cross_entropy,swiglu_fwd,matmul_fwd,matmul_bwd" --pipeline-stats > $OUT/bench.txt 2>&1
echo rc=$?
grep -A 400 "pipeline statistics" $OUT/bench.txt | head -150
ls $OUT/ir | wc -l; du -sh $OUT/ir
