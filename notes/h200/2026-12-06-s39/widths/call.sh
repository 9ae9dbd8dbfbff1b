# The 16-bit forward lane rule (RMSNorm and LayerNorm rows of more than 512 chunks on at least
# 512 lanes; PolyNorm's forward follows RMSNorm's) at widths between 4,096 and 8,192 columns
# (about 64 M values each), against 256 lanes forced (the rule before), alternating twice;
# the norm test binary first. bench_new and the test binary: build 9ec46f7.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
timeout 100 .bench/norm_test --test-threads 4 > $OUT/tests.txt 2>&1; echo "tests rc=$?" >> $OUT/gpu.txt
export WGRAD_NORM_SHAPES="12800x5120,10922x6144,9362x7168,8192x8192"
for run in 1 2; do
  for l in 256 rule; do
    echo "== $run $l" >> $OUT/widths.txt
    if [ $l = rule ]; then env=; else env="WGRAD_NORM_FWD_LANES=$l"; fi
    env $env timeout 40 .bench/bench_new --only "rms_norm fwd,layer_norm fwd,poly_norm fwd" >> $OUT/widths.txt 2>&1
  done
done
cat $OUT/gpu.txt; grep "test result" $OUT/tests.txt; grep -E "^==|^(rms|layer|poly)_norm fwd +[0-9]+x[0-9]+ +bf16" $OUT/widths.txt
