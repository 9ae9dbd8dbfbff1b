# The register forwards' lanes (WGRAD_NORM_FWD_LANES 256 / 512 / 1024 against the rule,
# `norm::forward_lanes`, set when the row sums were workgroup-memory trees) now that the
# forwards sum their rows with subgroup shuffles; alternating twice.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
ONLY="rms_norm fwd,layer_norm fwd,add_rms_norm fwd"
for run in 1 2; do
  for l in rule 256 512 1024; do
    echo "== $run $l" >> $OUT/ab.txt
    if [ $l = rule ]; then env=; else env="WGRAD_NORM_FWD_LANES=$l"; fi
    env $env timeout 100 .bench/bench_new --only "$ONLY" >> $OUT/ab.txt 2>&1
  done
done
cat $OUT/gpu.txt; grep -E "^==|^copy bandwidth|^(rms|add|layer).* fwd " $OUT/ab.txt
# Then the 16-bit register backwards (words, the next row ahead where dx is F32) on 512 lanes
# (WGRAD_NORM_BWD_LANES=512) against the rule's 256, alternating twice.
ONLY="rms_norm bwd,add_rms_norm bwd,layer_norm bwd"
for run in 1 2; do
  for l in rule 512; do
    echo "== $run $l" >> $OUT/bwd.txt
    if [ $l = rule ]; then env=; else env="WGRAD_NORM_BWD_LANES=$l"; fi
    env $env timeout 100 .bench/bench_new --only "$ONLY" >> $OUT/bwd.txt 2>&1
  done
done
grep -E "^==|^(rms|add|layer).* bwd.* bf16" $OUT/bwd.txt | grep -E "^==|8192x8192|4096x4096"
