# The register forwards' lanes (WGRAD_NORM_FWD_LANES 512 / 1024 against the rule,
# `norm::forward_lanes`, set when the row sums were workgroup-memory trees) now that the
# forwards sum their rows with subgroup shuffles (one run each: little device time was left). Then the reverted
# LayerNorm words entry (build cb3e4f1, bench_lnw) without the next row ahead
# (WGRAD_NORM_PREFETCH=0: words held, bias partials in workgroup memory) against the rule's
# widened values (bench_new), and its driver statistics.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
ONLY="rms_norm fwd,layer_norm fwd,add_rms_norm fwd"
for run in 1; do
  for l in rule 1024 512; do
    echo "== $run $l" >> $OUT/ab.txt
    if [ $l = rule ]; then env=; else env="WGRAD_NORM_FWD_LANES=$l"; fi
    env $env timeout 40 .bench/bench_new --only "$ONLY" >> $OUT/ab.txt 2>&1
  done
done
for b in new lnw; do
  echo "== $b" >> $OUT/lnw.txt
  WGRAD_NORM_PREFETCH=0 timeout 60 .bench/bench_$b --only "layer_norm bwd" >> $OUT/lnw.txt 2>&1
done
WGRAD_NORM_PREFETCH=0 timeout 60 .bench/bench_lnw --only "layer_norm bwd" --pipeline-stats 2>&1 | grep -E "layer_backward" | sed 's/Binary Size [0-9]*, //' > $OUT/lnw-stats.txt
cat $OUT/gpu.txt; grep -E "^==|^copy bandwidth|^(rms|add|layer).* fwd " $OUT/ab.txt
grep -E "^==|^layer.* bwd.* bf16" $OUT/lnw.txt | grep -E "^==|8192x8192|4096x4096"; cut -c1-60,150-400 $OUT/lnw-stats.txt
