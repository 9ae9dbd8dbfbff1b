# build 81b1a3a: cargo build --release --examples; the gated_delta test binary copied to .bench/
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $OUT/gpu.txt 2>&1
timeout 40 .bench/gated_delta > $OUT/tests.txt 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site
SECTIONS=gdn timeout 290 python3 .peers/peers.py > $OUT/peers_gdn.txt 2>&1
timeout 230 ./target/release/examples/bench --profile --json $OUT/bench.json --only gated_delta > $OUT/bench.txt 2>&1
