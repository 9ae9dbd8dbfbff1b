#!/usr/bin/env python3
"""Liger-Kernel and PyTorch peers of wgrad's multi-token attention and attention-residual rows
(`bench --only mta,attn_res`), the bench's shapes: multi-token attention on scores
[2, 4, L, L] (L 1,024, then 2,048 unless --short), a 4 → 4 channel 3 × 3 kernel, padding 1,
bias, softmax; attention residuals over 8 blocks of [2, 1,024, 4,096], eps 1e-6. F32 and BF16,
forward and forward + backward, Triton `do_bench` medians after 0.3 s of busy warm-up, in the
same command as wgrad's bench. The PyTorch peers are eager compositions: the causal mask to
−1e9, `softmax`, `F.conv2d`, the mask to 0; and the RMS-normalized keys, the softmax over the
blocks and the weighted sum. Prints one line per row and writes JSON lines to
$OUT/peers_mta_attn_res.jsonl. A peer that cannot run prints its error; the others still run.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from peer_timing import median_ms

OUT = os.environ.get("OUT", "/tmp")
DEV = "cuda"
SIDES = (1024,) if "--short" in sys.argv else (1024, 2048)
rows = []


def timed(op, peer, label, shape, fn, inputs, dy):
    def forward():
        with torch.no_grad():
            return fn(*inputs)

    def forward_backward():
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.grad = None
        fn(*inputs).backward(dy)

    for mode, run in (("fwd", forward), ("fwd_bwd", forward_backward)):
        ms = median_ms(run)
        rows.append(dict(op=op, peer=peer, dtype=label, mode=mode, ms=ms, shape=shape))
        print(f"{op:9} {peer:7} {label:4} {shape:22} {mode:7} {ms:9.3f} ms", flush=True)


def mta_eager(scores, weight, bias):
    length = scores.shape[-1]
    future = torch.ones(length, length, device=scores.device, dtype=torch.bool).triu(1)
    p = torch.softmax(scores.masked_fill(future, -1e9).float(), dim=-1).to(scores.dtype)
    return F.conv2d(p, weight, bias, padding=1).masked_fill(future, 0.0)


def attn_res_eager(blocks, w_query, w_norm, eps=1e-6):
    v = blocks.float()
    keys = (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)).to(blocks.dtype).float()
    scores = (keys * w_norm.float() * w_query.float()).sum(-1)
    alpha = torch.softmax(scores, dim=0)
    return (alpha.unsqueeze(-1) * v).sum(0).to(blocks.dtype)


def mta(dtype, label):
    for length in SIDES:
        torch.manual_seed(0)
        scores = torch.randn(2, 4, length, length, device=DEV, dtype=dtype, requires_grad=True)
        weight = (torch.randn(4, 4, 3, 3, device=DEV, dtype=dtype) * 0.2).requires_grad_(True)
        bias = (torch.randn(4, device=DEV, dtype=dtype) * 0.1).requires_grad_(True)
        dy = torch.randn(2, 4, length, length, device=DEV, dtype=dtype)
        shape = f"B2 C4 L{length} 3x3"
        timed("mta", "pytorch", label, shape, mta_eager, (scores, weight, bias), dy)
        try:
            from liger_kernel.ops.multi_token_attention import LigerMultiTokenAttentionFunction

            liger = lambda s, w, b: LigerMultiTokenAttentionFunction.apply(s, w, b, 1, 1, 1, 1, False)
            timed("mta", "liger", label, shape, liger, (scores, weight, bias), dy)
        except Exception as err:  # a peer that cannot run is reported, not fatal
            print(f"mta liger {label} L{length}: {err}", flush=True)


def attn_res(dtype, label):
    torch.manual_seed(0)
    blocks = torch.randn(8, 2, 1024, 4096, device=DEV, dtype=dtype, requires_grad=True)
    w_query = (torch.randn(4096, device=DEV, dtype=dtype) * 0.05).requires_grad_(True)
    w_norm = (1 + 0.1 * torch.randn(4096, device=DEV, dtype=dtype)).requires_grad_(True)
    dy = torch.randn(2, 1024, 4096, device=DEV, dtype=dtype)
    shape = "N8 2x1024 D4096"
    timed("attn_res", "pytorch", label, shape, attn_res_eager, (blocks, w_query, w_norm), dy)
    try:
        from liger_kernel.ops.attn_res import LigerAttnResFunction

        liger = lambda v, q, w: LigerAttnResFunction.apply(v, q, w, 1e-6)
        timed("attn_res", "liger", label, shape, liger, (blocks, w_query, w_norm), dy)
    except Exception as err:
        print(f"attn_res liger {label}: {err}", flush=True)


def main():
    for dtype, label in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        for section in (mta, attn_res):
            try:
                section(dtype, label)
            except Exception as err:
                print(f"{section.__name__} {label}: {err}", flush=True)
    with open(os.path.join(OUT, "peers_mta_attn_res.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
