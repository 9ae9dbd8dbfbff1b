#!/usr/bin/env python3
"""Liger-Kernel and PyTorch peers of wgrad's GeGLU rows (`bench --only geglu`): the gated tanh
GELU `gelu_tanh(a)·b` on `a, b [8192, 14336]`, F32 and BF16, forward and backward timed
separately (Triton's `do_bench` medians after 0.3 s of busy warm-up, as the team's peer
script does for SwiGLU), in the same command as wgrad's bench. Bytes: forward reads a and b
and writes the product (3 tensors), backward reads a, b and the cotangent and writes da, db (5),
each in the inputs' dtype. Prints one line per row and writes JSON lines to
$OUT/peers_geglu.jsonl. A missing Liger prints its error; the PyTorch rows still run.
"""
import json
import os

import torch
import torch.nn.functional as F
from peer_timing import copy_gbs, median_ms

OUT = os.environ.get("OUT", "/tmp")
DEV = "cuda"
ROWS, COLS = 8192, 14336
rows = []


def measure(peer, dtype, fn, copy):
    size = torch.tensor([], dtype=dtype).element_size()
    n = ROWS * COLS
    a = torch.randn(ROWS, COLS, device=DEV, dtype=dtype, requires_grad=True)
    b = torch.randn(ROWS, COLS, device=DEV, dtype=dtype, requires_grad=True)
    y = fn(a, b)
    dy = torch.randn_like(y)

    def backward():
        a.grad = None
        b.grad = None
        y.backward(dy, retain_graph=True)

    label = "bf16" if dtype == torch.bfloat16 else "f32"
    for mode, run, nbytes in (("fwd", lambda: fn(a, b), 3 * n * size), ("bwd", backward, 5 * n * size)):
        ms = median_ms(run)
        gbs = nbytes / ms / 1e6
        row = dict(op="geglu", peer=peer, dtype=label, mode=mode, ms=ms, gbs=gbs, pct_copy=100 * gbs / copy)
        rows.append(row)
        print(f"geglu {peer:<12} {label:<5} {mode}  {ms * 1000:9.1f} us  {gbs:8.1f} GB/s  {row['pct_copy']:5.1f}% of copy", flush=True)


def main():
    copy = copy_gbs()
    print(f"copy {copy:.1f} GB/s", flush=True)
    try:
        from liger_kernel.ops.geglu import LigerGELUMulFunction
    except Exception as err:  # report and keep the PyTorch rows
        print(f"liger geglu: import failed: {err}", flush=True)
        LigerGELUMulFunction = None
    for dtype in (torch.float32, torch.bfloat16):
        measure("torch eager", dtype, lambda a, b: F.gelu(a, approximate="tanh") * b, copy)
        if LigerGELUMulFunction is not None:
            measure("liger", dtype, LigerGELUMulFunction.apply, copy)
        torch.cuda.empty_cache()
    with open(os.path.join(OUT, "peers_geglu.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


main()
