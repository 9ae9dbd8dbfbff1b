# Tensor-core scales and F16 copies over the region a product reads (build c4aa5c8 and the
# bench's WGRAD_FLCE_LABELS): the matmul test binary (its tensor-core tests included), the fused
# linear and MLP tensor-core tests and the whole fused linear binary, then the FLCE rows with
# tensor cores and the head-dtype rows (WGRAD_FLCE_LABELS), BT 2,048 and 8,192.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
for t in "matmul" "fused_linear" "mlp tensor_cores"; do
  set -- $t; s=$(date +%s)
  timeout 120 /tmp/tb/$1 ${2:-} > /tmp/t-$1.txt 2>&1
  echo "$1 ${2:-} rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$1.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$1.txt | head -30
done > $OUT/tests.txt 2>&1
cat $OUT/tests.txt
WGRAD_FLCE_LABELS="bf16 tc+grads head,bf16 tc+grads,bf16 head,f16 tc,f32 tc grads" timeout 300 .bench/s16c/bench --only "fused_linear_ce" --json $OUT/bench.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; grep -E "fused_linear_ce" $OUT/bench.txt | grep -v "GB/s" | head -60
