#!/usr/bin/env python3
"""Liger-Kernel and PyTorch peers of wgrad's fused MoE rows (`bench --only fused_moe`):
Qwen3-MoE-30B's experts, T 4,096 tokens, E 128 experts, H 2,048, I 768, top-8, F32 and BF16,
with the bench's routing (slot k of token t goes to expert (7t + k·E/K) mod E: every expert
equally loaded) and weights 1/K. Forward, and forward + backward (the gradients of x, both
weight tensors and the routing weights), Triton `do_bench` medians after 0.3 s of busy warm-up,
in the same command as wgrad's bench. TFLOP/s count the products only (three a slot forward,
nine forward + backward), as the bench does. The PyTorch peer is an eager loop over the experts
(gather, two linears, SiLU gate, weighted `index_add_`). Prints one line per row and writes JSON
lines to $OUT/peers_moe.jsonl. A missing Liger prints its error; the PyTorch rows still run.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from peer_timing import median_ms

OUT = os.environ.get("OUT", "/tmp")
DEV = "cuda"
T, E, H, I, K = 4096, 128, 2048, 768, 8
if len(sys.argv) > 1 and sys.argv[1] == "--quick":
    T, E, H, I, K = 64, 8, 128, 64, 2
SLOT_PRODUCTS = 2.0 * T * K * I * H
rows = []


def routing():
    t = torch.arange(T, device=DEV).unsqueeze(1)
    k = torch.arange(K, device=DEV).unsqueeze(0)
    index = ((7 * t + k * (E // K)) % E).to(torch.int32)
    return index


def eager(x, gate_up, down, index, weights):
    out = torch.zeros(x.shape, device=x.device, dtype=torch.float32)
    flat = index.reshape(-1).long()
    token = torch.arange(T, device=x.device).repeat_interleave(K)
    w = weights.reshape(-1)
    for e in range(E):
        slots = (flat == e).nonzero(as_tuple=True)[0]
        if slots.numel() == 0:
            continue
        rows_x = x[token[slots]]
        g, u = F.linear(rows_x, gate_up[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(g) * u, down[e]) * w[slots, None]
        out.index_add_(0, token[slots], y.float())
    return out


def measure(peer, dtype, fn):
    torch.manual_seed(0)
    x = torch.randn(T, H, device=DEV, dtype=dtype, requires_grad=True)
    gate_up = (torch.randn(E, 2 * I, H, device=DEV, dtype=dtype) * 0.02).requires_grad_(True)
    down = (torch.randn(E, H, I, device=DEV, dtype=dtype) * 0.02).requires_grad_(True)
    index = routing()
    weights = torch.full((T, K), 1.0 / K, device=DEV, dtype=dtype, requires_grad=True)
    dy = torch.randn(T, H, device=DEV, dtype=dtype)
    leaves = (x, gate_up, down, weights)

    def forward():
        with torch.no_grad():
            return fn(x, gate_up, down, index, weights)

    def forward_backward():
        for leaf in leaves:
            leaf.grad = None
        y = fn(x, gate_up, down, index, weights)
        y.backward(dy.to(y.dtype))

    label = "bf16" if dtype == torch.bfloat16 else "f32"
    for mode, run, flops in (("fwd", forward, 3 * SLOT_PRODUCTS), ("fwd_bwd", forward_backward, 9 * SLOT_PRODUCTS)):
        torch.cuda.reset_peak_memory_stats()
        ms = median_ms(run)
        peak = torch.cuda.max_memory_allocated() / 2**20
        row = dict(op="fused_moe", peer=peer, dtype=label, mode=mode, ms=ms,
                   tflops=flops / ms / 1e9, peak_mib=peak, shape=f"T{T} E{E} H{H} I{I} K{K}")
        rows.append(row)
        print(f"fused_moe {peer:7} {label:4} {mode:7} {ms:9.3f} ms  {row['tflops']:7.2f} TFLOP/s  peak {peak:8.1f} MiB", flush=True)


def main():
    for dtype in (torch.float32, torch.bfloat16):
        try:
            measure("pytorch", dtype, eager)
        except Exception as err:  # a peer that cannot run is reported, not fatal
            print(f"fused_moe pytorch {dtype}: {err}", flush=True)
        try:
            from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

            measure("liger", dtype, LigerFusedMoEFunction.apply)
        except Exception as err:
            print(f"fused_moe liger {dtype}: {err}", flush=True)
    with open(os.path.join(OUT, "peers_moe.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
