#!/usr/bin/env bash
# Run wgrad's bench and the peer script on an H200 machine that has the NVIDIA driver, PyTorch
# and Triton but no Vulkan loader (see the team's GPU notes). Expects in the working tree:
#   .gl/*.deb                          Vulkan loader packages (apt-get download libvulkan1 ...)
#   target/release/examples/bench      built on the build machine (and, optionally,
#   target/release/examples/check      the gradient-check report, run first)
#   .whl/*.whl, .peers/peers.py        optional: Liger-Kernel wheel and the peer script
# Writes bench.json, bench.txt, peers.jsonl, peers.txt into $OUT (default ./out).
# LOSS_PEERS=1 also runs scripts/peer_losses_liger.py (Liger's GRPO, fused-linear GRPO, DPO),
# GEGLU_PEERS=1 scripts/peer_geglu_liger.py (Liger's and PyTorch's GeGLU), SDPA_PEERS=1
# scripts/peer_sdpa.py (PyTorch's SDPA at the attention bench's shapes, causal and full),
# MOE_PEERS=1 scripts/peer_moe_liger.py (Liger's fused MoE and an eager loop over the experts),
# MTA_PEERS=1 scripts/peer_mta_attnres_liger.py (Liger's and eager multi-token attention and
# attention residuals; MTA_PEERS_ARGS=--short: L 1,024 only).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; export OUT
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
if [ -x target/release/examples/check ]; then
  timeout "${CHECK_TIMEOUT:-200}" ./target/release/examples/check > "$OUT/check.txt" 2>&1
  echo "check exit $?: $(tail -1 "$OUT/check.txt")"
fi
timeout "${BENCH_TIMEOUT:-300}" ./target/release/examples/bench --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt" | tail -60
# Liger-Kernel (and any other wheel brought along) for the peer scripts below.
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
  export PYTHONPATH=/tmp/site
fi
if [ -f .peers/peers.py ] && [ -n "${SECTIONS:-}" ]; then
  timeout "${PEERS_TIMEOUT:-240}" python3 .peers/peers.py > "$OUT/peers.txt" 2>&1
  tail -40 "$OUT/peers.txt"
fi
if [ -n "${LOSS_PEERS:-}" ]; then
  timeout "${LOSS_PEERS_TIMEOUT:-240}" python3 scripts/peer_losses_liger.py 2>&1 | tee "$OUT/peers_losses.txt" | tail -12
fi
if [ -n "${GEGLU_PEERS:-}" ]; then
  timeout "${GEGLU_PEERS_TIMEOUT:-200}" python3 scripts/peer_geglu_liger.py 2>&1 | tee "$OUT/peers_geglu.txt" | tail -6
fi
if [ -n "${SDPA_PEERS:-}" ]; then
  timeout "${SDPA_PEERS_TIMEOUT:-240}" python3 scripts/peer_sdpa.py 2>&1 | tee "$OUT/peers_sdpa.txt" | tail -16
fi
if [ -n "${TORCH_GDN:-}" ]; then
  timeout "${TORCH_GDN_TIMEOUT:-200}" python3 scripts/peer_gated_delta_torch.py 2>&1 | tee "$OUT/peers_gdn_torch.txt" | tail -8
fi
if [ -n "${MOE_PEERS:-}" ]; then
  timeout "${MOE_PEERS_TIMEOUT:-300}" python3 scripts/peer_moe_liger.py 2>&1 | tee "$OUT/peers_moe.txt" | tail -8
fi
if [ -n "${MTA_PEERS:-}" ]; then
  timeout "${MTA_PEERS_TIMEOUT:-300}" python3 scripts/peer_mta_attnres_liger.py ${MTA_PEERS_ARGS:-} 2>&1 | tee "$OUT/peers_mta_attn_res.txt" | tail -20
fi
