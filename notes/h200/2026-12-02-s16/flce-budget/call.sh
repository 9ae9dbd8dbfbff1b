# FLCE head-dtype gradients within a budget (build 146dfad: the tensor-core copies within the
# budget's remainder, 1 MiB size classes above 64 MiB): the fused linear, engine and matmul
# test binaries, the head-dtype rows with tensor cores (default budget, 256 MiB, 40 MiB) and
# the default tensor-core row, BT 2,048 and 8,192; then the peer script's FLCE section.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
for t in "fused_linear" "engine" "matmul tensor_core"; do
  set -- $t; s=$(date +%s)
  timeout 120 /tmp/tb/$1 ${2:-} > /tmp/t-$1.txt 2>&1
  echo "$1 ${2:-} rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$1.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$1.txt | head -30
done > $OUT/tests.txt 2>&1
cat $OUT/tests.txt
WGRAD_FLCE_LABELS="bf16 tc+grads head,bf16 tc+grads" timeout 300 .bench/s16d/bench --only "fused_linear_ce" --json $OUT/bench.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; grep -E "fused_linear_ce" $OUT/bench.txt | grep -v "GB/s" | tail -24
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
SECTIONS=flce PYTHONPATH=/tmp/site timeout 200 python3 .peers/peers.py > $OUT/peers.txt 2>&1
echo "peers rc=$?"; grep fused_linear $OUT/peers.txt
