# FLCE with the gradients in the head's dtypes (Chunking::head_dtype_gradients; build 1de403d +
# the bench rows): the fused linear and loss test binaries on the H200 (the new tests among
# them), the FLCE bench rows (each configuration at BT 2,048 and 8,192, H 4,096, V 128,256;
# the new "head" rows with the default budget and with 40 MiB) and the peer script's FLCE
# section (Liger and PyTorch, same call).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
tar -C /tmp -xJf .bench/tests.tar.xz
for t in "fused_linear" "loss"; do
  set -- $t; s=$(date +%s)
  timeout 150 /tmp/tb/$1 ${2:-} > /tmp/t-$1.txt 2>&1
  echo "$1 ${2:-} rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$1.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$1.txt | head -30
done > $OUT/tests.txt 2>&1
cat $OUT/tests.txt
timeout 240 .bench/s16b/bench --only "fused_linear_ce" --json $OUT/bench.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; grep -E "fused_linear_ce" $OUT/bench.txt | head -60
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
SECTIONS=flce PYTHONPATH=/tmp/site timeout 200 python3 .peers/peers.py > $OUT/peers.txt 2>&1
echo "peers rc=$?"; tail -12 $OUT/peers.txt
