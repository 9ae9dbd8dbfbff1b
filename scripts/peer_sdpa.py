#!/usr/bin/env python3
"""PyTorch `scaled_dot_product_attention` at wgrad's attention bench shapes (`bench --only
attention`): B4 H32 S2048 D128 and B1 H16 S8192 D128, causal and full, FP32 (TF32 off) and
BF16, forward and forward+backward, with the peak memory of forward+backward beyond the inputs
(`max_memory_allocated`). Medians of Triton's `do_bench` after 0.3 s of busy warm-up, in the
same command as wgrad's bench. Prints one line per row and writes JSON lines to
$OUT/peers_sdpa.jsonl.
"""
import json
import os

import torch
import torch.nn.functional as F
from peer_timing import median_ms

OUT = os.environ.get("OUT", "/tmp")
DEV = "cuda"
SHAPES = [(4, 32, 2048, 128), (1, 16, 8192, 128)]
rows = []


def one(b, h, s, d, causal, dtype):
    q0 = torch.randn(b, h, s, d, device=DEV, dtype=dtype)
    k0 = torch.randn_like(q0)
    v0 = torch.randn_like(q0)
    flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)

    def forward():
        return F.scaled_dot_product_attention(q0, k0, v0, is_causal=causal)

    def forward_backward():
        q = q0.detach().requires_grad_()
        k = k0.detach().requires_grad_()
        v = v0.detach().requires_grad_()
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    forward_backward()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    label = "bf16" if dtype == torch.bfloat16 else "f32"
    shape = f"B{b} H{h} S{s} D{d} {'causal' if causal else 'full'}"
    for mode, fn, n in (("fwd", forward, flops), ("fwd_bwd", forward_backward, 3.5 * flops)):
        ms = median_ms(fn)
        row = dict(op="sdpa", shape=shape, dtype=label, mode=mode, ms=ms,
                   tflops=n / ms / 1e9, peak_mib=peak if mode == "fwd_bwd" else None)
        rows.append(row)
        extra = f"  peak {peak:8.1f} MiB" if mode == "fwd_bwd" else ""
        print(f"sdpa {shape:<24} {label:<5} {mode:<8} {ms:9.3f} ms  {row['tflops']:7.2f} TFLOP/s{extra}",
              flush=True)
    del q0, k0, v0
    torch.cuda.empty_cache()


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for dtype in (torch.float32, torch.bfloat16):
        for (b, h, s, d) in SHAPES:
            for causal in (True, False):
                try:
                    one(b, h, s, d, causal, dtype)
                except Exception as err:  # report and go on
                    print(f"sdpa B{b} H{h} S{s} D{d} causal={causal} {dtype}: {err}", flush=True)
    with open(os.path.join(OUT, "peers_sdpa.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


main()
