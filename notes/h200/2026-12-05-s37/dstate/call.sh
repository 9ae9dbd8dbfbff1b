# chunk_states and chunk_dstate in rounds of 8 tokens, 16-byte staged groups, parts summed by
# shuffles (bench_new) against the session's base build (bench_base), alternating twice; the
# gated_delta test binary first; the driver's statistics of the new pipelines.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
timeout 200 .bench/test_gated_delta --test-threads 4 > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
for r in 1 2; do for b in base new; do
  echo "== $b run $r" >> $OUT/ab.txt
  timeout 100 .bench/bench_$b --profile --json /tmp/x.json --only gated_delta_chunked >> $OUT/ab.txt 2>&1
done; done
timeout 60 .bench/bench_new --pipeline-stats --json /tmp/y.json --only gated_delta_chunked 2>&1 | grep "chunk_states\|chunk_dstate" > $OUT/stats.txt
grep -E "test result|FAILED|panicked" $OUT/tests.txt; grep -E "^==|median|chunk_states|chunk_dstate" $OUT/ab.txt; cut -c1-250 $OUT/stats.txt
