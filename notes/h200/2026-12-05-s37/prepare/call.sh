# Where chunk_prepare spends its time (a measurement build, c47214b + WGRAD_PREP_MODE: 1 = no
# solves, 2 = only γ and β; results wrong in 1 and 2): the forward rows, --profile.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
for m in 0 1 2; do
  echo "== mode $m" >> $OUT/prep.txt
  WGRAD_PREP_MODE=$m timeout 100 .bench/bench_exp --profile --json /tmp/x.json --only gated_delta_chunked_fwd >> $OUT/prep.txt 2>&1
done
grep -E "^==|chunk_prepare" $OUT/prep.txt
