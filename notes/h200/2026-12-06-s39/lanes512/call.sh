# (Run as one command line on the warm machine after accept/.) The 16-bit forwards at 8192²
# with 512 lanes forced against the rule then (256), alternating three times; bench_new = 677fab0.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for run in 1 2 3; do for l in rule 512; do echo "== $run $l" >> $OUT/lanes2.txt; if [ $l = rule ]; then env=; else env="WGRAD_NORM_FWD_LANES=$l"; fi; env $env timeout 40 .bench/bench_new --only "rms_norm fwd,layer_norm fwd" >> $OUT/lanes2.txt 2>&1; done; done
grep -E "^==|^(rms|layer)_norm fwd +8192x8192 +bf16" $OUT/lanes2.txt
