# A/B on one machine (bench_new = 677fab0: c61c9da's kernels by default, the SHARED_ACC knob
# added): (1) the 16-bit backwards' next-row loads (bench_new) against
# the build before them (bench_base, 067c96c), alternating twice; (2) the register forwards'
# lanes forced (WGRAD_NORM_FWD_LANES 1024 / 512) against the rule, one run each; (3) the
# reverted LayerNorm words entry (bench_lnw, cb3e4f1) without the next row ahead
# (WGRAD_NORM_PREFETCH=0) against the current widened-values entry, and its driver statistics;
# (4) `rms_backward_words` with its weight partials in workgroup memory (WGRAD_NORM_SHARED_ACC=1)
# against registers, alternating twice, and the driver statistics of both.
set -uo pipefail
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > $OUT/gpu.txt
BWD="rms_norm bwd,add_rms_norm bwd,layer_norm bwd"
for run in 1 2; do
  for b in base new; do
    echo "== $run $b" >> $OUT/rule.txt
    timeout 45 .bench/bench_$b --only "$BWD" >> $OUT/rule.txt 2>&1
  done
done
FWD="rms_norm fwd,layer_norm fwd,add_rms_norm fwd"
for l in rule 1024 512; do
  echo "== $l" >> $OUT/lanes.txt
  if [ $l = rule ]; then env=; else env="WGRAD_NORM_FWD_LANES=$l"; fi
  env $env timeout 40 .bench/bench_new --only "$FWD" >> $OUT/lanes.txt 2>&1
done
for b in new lnw; do
  echo "== $b" >> $OUT/lnw.txt
  WGRAD_NORM_PREFETCH=0 timeout 45 .bench/bench_$b --only "layer_norm bwd" >> $OUT/lnw.txt 2>&1
done
WGRAD_NORM_PREFETCH=0 timeout 45 .bench/bench_lnw --only "layer_norm bwd" --pipeline-stats 2>&1 | grep -E "layer_backward" | sed 's/Binary Size [0-9]*, //' > $OUT/lnw-stats.txt
for run in 1 2; do
  for a in 0 1; do
    echo "== $run shared $a" >> $OUT/shared.txt
    WGRAD_NORM_SHARED_ACC=$a timeout 45 .bench/bench_new --only "$BWD" >> $OUT/shared.txt 2>&1
  done
done
for a in 0 1; do
  echo "== shared $a" >> $OUT/shared-stats.txt
  WGRAD_NORM_SHARED_ACC=$a timeout 45 .bench/bench_new --only "rms_norm bwd,add_rms_norm bwd" --pipeline-stats 2>&1 | grep -E "rms_backward_words" | sed 's/Binary Size [0-9]*, //' >> $OUT/shared-stats.txt
done
cat $OUT/gpu.txt; grep -cE "bwd" $OUT/rule.txt; grep -cE "fwd" $OUT/lanes.txt; grep -cE "bwd" $OUT/lnw.txt
