# build 6e73a08: cargo build --release --examples; test binaries gated_delta, moe copied to .bench/
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
for t in gated_delta moe; do timeout 60 .bench/$t > $OUT/tests-$t.txt 2>&1; done   # (outputs not returned: file-count limit)
timeout 60 ./target/release/examples/check gated_delta,fused_moe > $OUT/check.txt 2>&1
timeout 200 ./target/release/examples/bench --json $OUT/bench.json --only gated_delta,fused_moe > $OUT/bench.txt 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site
SECTIONS=gdn timeout 50 python3 .peers/peers.py > $OUT/peers_gdn.txt 2>&1          # fla cut by the timeout (Triton autotuning)
timeout 80 python3 scripts/peer_mta_attnres_liger.py --short > $OUT/peers_mta.txt 2>&1   # Liger cut by the timeout
timeout 60 python3 scripts/peer_moe_liger.py > $OUT/peers_moe.txt 2>&1                 # Liger cut by the timeout
