# same warm H100 as ../gdn-h100 (build 81b1a3a), right after it
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 150 ./target/release/examples/bench --json $OUT/bench.json --only fused_moe,mta,attn_res > $OUT/bench.txt 2>&1
export PYTHONPATH=/tmp/site
timeout 240 python3 scripts/peer_mta_attnres_liger.py --short > $OUT/peers_mta.txt 2>&1   # cut at 240 s after PyTorch's f32 rows
timeout 190 python3 scripts/peer_moe_liger.py > $OUT/peers_moe.txt 2>&1                  # cut at 190 s before Liger's bf16 rows
