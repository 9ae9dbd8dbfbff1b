# Build a57d452 (cargo build --release --examples; scripts/tests-pack.sh). Device command
# (timed out at 600 s during scripts/peer_mta_attnres_liger.py; the bench stopped at the
# fused MoE backward's WorkspaceExceeded, 1.21 GB against the default 1 GiB bound):
set -o pipefail; ONLY="moe mhc mta attn_res vocab_parallel expr hostile" TEST_TIMEOUT=150 OUT=$OUT/tests bash scripts/tests-h200.sh | tail -12
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
timeout 120 ./target/release/examples/check fused_moe,mhc_coefficients,mhc_pre,mhc_post_res,multi_token_attention,attn_res,vocab_parallel_cross_entropy,expression_vjp > $OUT/check.txt 2>&1
chmod -x target/release/examples/check
BENCH_TIMEOUT=200 BENCH_ARGS="--only fused_moe,mhc,mta,attn_res,vocab_parallel" MOE_PEERS=1 MTA_PEERS=1 MTA_PEERS_ARGS=--short bash scripts/bench-h200.sh 2>&1 | tail -70
