# The register backward of RMSNorm / add+RMSNorm holding words (`rms_backward_words`) with and
# without loading the next row's words during the current row's dx (WGRAD_NORM_PREFETCH),
# against the rule (widened values for RMSNorm, words for add+RMSNorm), alternating twice.
# The norm test binary first; then the driver's register counts of the prefetching kernels.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
timeout 150 .bench/test_norm --test-threads 8 > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
ONLY="rms_norm bwd,add_rms_norm bwd"
for run in 1 2; do
  for v in rule words prefetch; do
    case $v in
      rule) env=;;
      words) env="WGRAD_NORM_WORDS=1";;
      prefetch) env="WGRAD_NORM_WORDS=1 WGRAD_NORM_PREFETCH=1";;
    esac
    echo "== $run $v" >> $OUT/ab.txt
    env $env timeout 100 .bench/bench_new --only "$ONLY" >> $OUT/ab.txt 2>&1
  done
done
WGRAD_NORM_WORDS=1 WGRAD_NORM_PREFETCH=1 timeout 100 .bench/bench_new --quick --only "$ONLY" --pipeline-stats > $OUT/stats.txt 2>&1
cat $OUT/gpu.txt; grep -E "test result|FAILED|panicked" $OUT/tests.txt; grep -E "^==| bwd" $OUT/ab.txt
