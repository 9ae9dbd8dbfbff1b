set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
B=target/release/examples/bench
timeout 60 .bench/matmul-test --test-threads 4 > $OUT/tests.txt 2>&1; echo "matmul tests rc=$?"; grep "test result" $OUT/tests.txt
timeout 200 $B --json $OUT/bench.json --only "matmul,swiglu_mlp,fused_linear,grpo,preference" > $OUT/bench.txt 2>&1; echo "bench rc=$?"
timeout 150 target/release/examples/check > $OUT/check.txt 2>&1; echo "check rc=$?"; tail -1 $OUT/check.txt; grep -E "FAIL|ERROR" $OUT/check.txt | head
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
PYTHONPATH=/tmp/site SECTIONS=flce,mm timeout 120 python3 .peers/peers.py > $OUT/peers.txt 2>&1; echo "peers rc=$?"
PYTHONPATH=/tmp/site timeout 100 python3 scripts/peer_losses_liger.py > $OUT/peers_losses.txt 2>&1; echo "losses rc=$?"
rm -f $OUT/peers.json $OUT/peers.jsonl $OUT/peers_losses.jsonl
grep -E "TFLOP|median" $OUT/bench.txt | grep -v "GB/s, median" | head -60
grep -E "flce|fused_linear|matmul" $OUT/peers.txt | head; tail -12 $OUT/peers_losses.txt
