# chunk_key_blocks with its staged keys stored key dim major (no 16-way bank conflict on the
# column reads) and the next step fetched ahead (bench_kb) against the build of dstate/
# (bench_new: c47214b's kernels but for CS_RMAX 16), alternating twice; tests first.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
timeout 200 .bench/test_gated_delta --test-threads 4 > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
for r in 1 2; do for b in new kb; do
  echo "== $b run $r" >> $OUT/ab.txt
  timeout 100 .bench/bench_$b --profile --json /tmp/x.json --only gated_delta_chunked >> $OUT/ab.txt 2>&1
done; done
grep -E "test result|FAILED|panicked" $OUT/tests.txt; grep -E "^==|median|chunk_prepare|chunk_grads|chunk_states|chunk_dstate" $OUT/ab.txt | grep -v "run 1" 
