# The norm family's acceptance rows at the current build (bench_new = 677fab0: c61c9da's
# kernels by default, a measurement knob added): the norm test binary first, then every RMSNorm, LayerNorm and add+RMSNorm
# bench row, then the peer script's norm section (PyTorch, torch.compile, Liger) in the same
# command.
set -uo pipefail
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
R=$OUT/results.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv >> $R
echo "== norm tests" >> $R
timeout 100 .bench/norm_test --test-threads 4 > /tmp/t.txt 2>&1; echo "tests rc=$?" >> $R; grep -E "^test result|FAILED|panicked" /tmp/t.txt >> $R
echo "== bench" >> $R
timeout 150 .bench/bench_new --json $OUT/bench.json --only rms_norm,layer_norm,add_rms_norm > /tmp/b.txt 2>&1; echo "bench rc=$?" >> $R; cat /tmp/b.txt >> $R
echo "== peers norm" >> $R
PYTHONPATH=/tmp/site SECTIONS=norm OUT=/tmp timeout 300 python3 .peers/peers.py >> $R 2>&1; echo "peers rc=$?" >> $R
grep -E "^==|rc=|^copy|bandwidth" $R | head -20
