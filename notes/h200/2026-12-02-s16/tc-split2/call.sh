# Split-K for tensor-core products, corrected (build 4f2fd6a: a slice's sums at
# slice·batch·m·n; `tc-split/` had them all at one place for a single batch): the matmul test
# binary, the fused linear and MLP tensor-core tests, `check matmul_tensor_cores`; then the
# head-dtype FLCE rows with tensor cores (BT 2,048 and 8,192) and FLCE's dx product.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
for t in "matmul" "fused_linear tensor_cores" "mlp tensor_cores"; do
  set -- $t; s=$(date +%s)
  timeout 60 /tmp/tb/$1 ${2:-} > /tmp/t-$1.txt 2>&1
  echo "$1 ${2:-} rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$1.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$1.txt | head -30
done > $OUT/tests.txt 2>&1
timeout 40 .bench/s16e/check matmul_tensor_cores >> $OUT/tests.txt 2>&1; echo "check rc=$?" >> $OUT/tests.txt
cat $OUT/tests.txt
WGRAD_FLCE_LABELS="bf16 tc+grads head" timeout 170 .bench/s16e/bench --only "matmul_flce_dx,fused_linear_ce" --json $OUT/bench.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; grep -E "TFLOP/s" $OUT/bench.txt | tail -12
