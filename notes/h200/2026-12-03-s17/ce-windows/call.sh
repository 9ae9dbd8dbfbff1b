# Cross-entropy past one storage binding (row windows): the loss and cast test binaries, then
# the cross-entropy rows at the shape (B·T 16,384 rows of 131,072 and 128,256 classes;
# F32 logits and gradient 8.6 GB each, in windows of the 2 GiB binding), then the peer
# script's CE section (PyTorch, Liger) in the same command.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=.bench/s17a
for t in loss cast; do
  s=$(date +%s)
  timeout 150 $B/$t > /tmp/t-$t.txt 2>&1
  echo "$t rc=$? $(( $(date +%s) - s ))s $(grep -h 'test result' /tmp/t-$t.txt | tail -1)"
  grep -h -A12 "panicked\|FAILED" /tmp/t-$t.txt | head -30
done > $OUT/tests.txt 2>&1
cat $OUT/tests.txt
timeout 330 $B/bench --only cross_entropy --json $OUT/bench.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; grep -E "cross_entropy|copy|peak" $OUT/bench.txt | tail -30
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
SECTIONS=ce PYTHONPATH=/tmp/site OUT=$OUT timeout 100 python3 .peers/peers.py > $OUT/peers.txt 2>&1
echo "peers rc=$?"; grep -i "cross" $OUT/peers.txt | tail -8
