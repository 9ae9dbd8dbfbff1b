set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=target/release/examples/bench
ONLY=rms_norm,layer_norm,add_rms_norm,softmax,log_softmax
timeout 150 $B --json $OUT/bench.json --only $ONLY > $OUT/bench.txt 2>&1; echo "bench rc=$?"
timeout 150 target/release/examples/check > $OUT/check.txt 2>&1; echo "check rc=$?"; tail -1 $OUT/check.txt; grep -E "FAIL|ERROR" $OUT/check.txt | head
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
PYTHONPATH=/tmp/site SECTIONS=norm,softmax timeout 150 python3 .peers/peers.py > $OUT/peers.txt 2>&1
rm -f $OUT/peers.json $OUT/peers.jsonl
grep median $OUT/bench.txt | head -80
