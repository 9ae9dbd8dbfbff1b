# The session's final gated delta kernels (bench_final) against its base build 554f2b5
# (bench_base) in one call; the gated_delta test binary of the final build first.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
timeout 120 .bench/test_gated_delta --test-threads 8 > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
for b in base final; do
  echo "== $b" >> $OUT/ab.txt
  timeout 90 .bench/bench_$b --profile --json /tmp/x.json --only gated_delta_chunked >> $OUT/ab.txt 2>&1
done
cat $OUT/gpu.txt; grep -E "test result|FAILED|panicked" $OUT/tests.txt; grep -E "^==|median" $OUT/ab.txt
