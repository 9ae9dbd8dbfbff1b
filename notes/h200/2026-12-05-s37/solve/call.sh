# The substitutions of chunk_prepare and chunk_grads in blocks of 8 rows held in registers
# (bench_solve) against fc98314 (bench_kb), alternating twice; tests first.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
timeout 200 .bench/test_gated_delta --test-threads 4 > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
for r in 1 2; do for b in kb solve; do
  echo "== $b run $r" >> $OUT/ab.txt
  timeout 100 .bench/bench_$b --profile --json /tmp/x.json --only gated_delta_chunked >> $OUT/ab.txt 2>&1
done; done
grep -E "test result|FAILED|panicked" $OUT/tests.txt; grep -E "^==|median|chunk_prepare|chunk_grads" $OUT/ab.txt | grep -v "run 1"
