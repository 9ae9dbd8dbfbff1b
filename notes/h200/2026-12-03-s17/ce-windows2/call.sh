# Cross-entropy past one storage binding (row windows), second call: the logits made in their
# dtype on the host (16,384 BF16 rows of 131,072 / 128,256 classes: 4.2 GB, one buffer of the
# 4 GiB max_buffer_size, windows of the 2 GiB binding); F32 logits and F32 gradients as many
# rows as one buffer holds. Then the softmax rows, then the peer script's CE section.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/s17b
for t in loss cast; do
  s=$(date +%s)
  timeout 60 $B/$t > /tmp/t-$t.txt 2>&1
  echo "$t rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$t.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$t.txt | head -30
done > $OUT/tests.txt 2>&1
cat $OUT/tests.txt
timeout 380 $B/bench --only cross_entropy,softmax,log_softmax --json $OUT/bench.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; grep -E "cross_entropy|softmax|copy|peak|failed" $OUT/bench.txt | tail -40
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
SECTIONS=ce PYTHONPATH=/tmp/site OUT=$OUT timeout 90 python3 .peers/peers.py > $OUT/peers.txt 2>&1
echo "peers rc=$?"; grep -i "cross" $OUT/peers.txt | tail -8
