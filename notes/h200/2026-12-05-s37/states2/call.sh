# chunk_states with 16-byte staged groups (bench_new; WGRAD_CS_ROUND=8: rounds of 8 tokens)
# against the session's base build (bench_base), alternating twice; the gated_delta test
# binary first; the driver's statistics of the new pipelines.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
timeout 200 .bench/test_gated_delta --test-threads 4 > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
for r in 1 2; do for b in base new new8; do
  echo "== $b run $r" >> $OUT/ab.txt
  if [ $b = new8 ]; then export WGRAD_CS_ROUND=8; bin=new; else unset WGRAD_CS_ROUND; bin=$b; fi
  timeout 100 .bench/bench_$bin --profile --json /tmp/x.json --only gated_delta_chunked >> $OUT/ab.txt 2>&1
done; done
unset WGRAD_CS_ROUND
timeout 60 .bench/bench_new --pipeline-stats --json /tmp/y.json --only gated_delta_chunked_fwd 2>&1 | grep chunk_states > $OUT/stats.txt
WGRAD_CS_ROUND=8 timeout 60 .bench/bench_new --pipeline-stats --json /tmp/y.json --only gated_delta_chunked_fwd 2>&1 | grep chunk_states >> $OUT/stats.txt
grep -E "test result|FAILED|panicked" $OUT/tests.txt; grep -E "^==|median|chunk_states" $OUT/ab.txt | grep -v "profile.*fwd_bwd" ; cat $OUT/stats.txt | cut -c1-300
