# Split-K for tensor-core products (build 52a1312): the matmul test binary (the new split
# shapes among the tensor-core and epilogue cases), the fused linear and MLP tensor-core tests,
# `check` of the products' operators; then the tensor-core product rows and the FLCE rows with
# tensor cores, the head-dtype ones with their budgets (BT 2,048 and 8,192).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
for t in "matmul" "fused_linear tensor_cores" "mlp tensor_cores"; do
  set -- $t; s=$(date +%s)
  timeout 120 /tmp/tb/$1 ${2:-} > /tmp/t-$1.txt 2>&1
  echo "$1 ${2:-} rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$1.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$1.txt | head -30
done > $OUT/tests.txt 2>&1
timeout 120 .bench/s16e/check matmul_tensor_cores matmul mlp fused_linear_cross_entropy >> $OUT/tests.txt 2>&1; echo "check rc=$?" >> $OUT/tests.txt
cat $OUT/tests.txt
WGRAD_FLCE_LABELS="bf16 tc+grads,bf16 tc+grads head,f32 tc grads" timeout 300 .bench/s16e/bench --only "matmul_fwd_tc,matmul_bwd_tc,matmul_flce_dx,fused_linear_ce" --json $OUT/bench.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; grep -E "TFLOP/s" $OUT/bench.txt | tail -30
