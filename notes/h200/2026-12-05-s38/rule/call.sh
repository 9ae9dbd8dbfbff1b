# The prefetching rule (16-bit sources on 256 lanes: words held, the next row's loaded ahead)
# built (bench_new) against the session's base build 067c96c (bench_base), alternating twice;
# the norm test binary of the new build first.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
timeout 150 .bench/test_norm --test-threads 8 > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
ONLY="rms_norm bwd,add_rms_norm bwd"
for run in 1 2; do
  for b in base new; do
    echo "== $run $b" >> $OUT/ab.txt
    timeout 100 .bench/bench_$b --only "$ONLY" >> $OUT/ab.txt 2>&1
  done
done
cat $OUT/gpu.txt; grep -E "test result|FAILED|panicked" $OUT/tests.txt; grep -E "^==|^copy|^(rms|add).* bwd " $OUT/ab.txt
