set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=target/release/examples/bench
(time timeout 150 .bench/matmul-test --test-threads 4) > $OUT/tests.txt 2>&1; grep "test result" $OUT/tests.txt
for r in 1 2; do
  for v in chunk wide16 wide16g8; do
    case $v in chunk) e="X=1";; wide16) e="WGRAD_GEMM_WIDE16=1";; wide16g8) e="WGRAD_GEMM_WIDE16=1 WGRAD_GEMM_GROUP=8";; esac
    env $e timeout 150 $B --only "matmul_fwd,matmul_bwd,fused_linear_ce_fwd_bwd BT2048" > /tmp/$v-$r.txt 2>&1
    grep -E "median|TFLOP" /tmp/$v-$r.txt | sed "s/^/$v r$r /"
  done
done > $OUT/ab.txt
grep TFLOP $OUT/ab.txt
