set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=target/release/examples/bench
(time timeout 150 .bench/matmul-test --test-threads 4) > $OUT/tests.txt 2>&1; tail -3 $OUT/tests.txt
timeout 100 target/release/examples/check matmul,matmul_as,mlp,fused_linear_cross_entropy,fused_linear_grpo_loss > $OUT/check.txt 2>&1; tail -4 $OUT/check.txt
for r in 1 2; do
  for v in chunk elem group8; do
    case $v in chunk) e="X=1";; elem) e="WGRAD_CHUNKED_FETCHES=0";; group8) e="WGRAD_GEMM_GROUP=8";; esac
    env $e timeout 150 $B --only "matmul,fused_linear_ce_fwd_bwd BT2048" > /tmp/$v-$r.txt 2>&1
    grep -E "median|TFLOP" /tmp/$v-$r.txt | sed "s/^/$v r$r /"
  done
done > $OUT/ab.txt
cat $OUT/ab.txt | grep TFLOP
cp /tmp/chunk-1.txt $OUT/bench-chunk-1.txt
