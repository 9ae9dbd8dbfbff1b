#!/usr/bin/env python3
"""PyTorch peers of wgrad's embedding and optim rows on the same machine: F.embedding forward
and its dense backward (aten.embedding_dense_backward) at V = 128,256, D = 1,024, 16,384
positions; AdamW (fused, foreach) and SGD with momentum (foreach, fused) over one 64M-element
F32 parameter; the global gradient norm (torch.nn.utils.get_total_norm). Bytes moved are
counted as wgrad's bench counts them (each operand read once, each updated tensor written
once). CUDA-event timing, medians of 20 runs after 3 warm-ups and a 0.3 s busy pre-warm.
Prints one line per measurement and writes JSON lines to $OUT/peers_embed_optim.jsonl.
"""
import json
import os
import statistics

import torch
import torch.nn.functional as F

OUT = os.environ.get("OUT", "/tmp")
DEV = "cuda"


def prewarm(seconds=0.3):
    a = torch.empty(64 << 20, device=DEV)
    b = torch.empty_like(a)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        for _ in range(20):
            b.copy_(a)
        end.record()
        end.synchronize()
        if start.elapsed_time(end) > seconds * 1e3:
            break


def median_ms(fn, warmup=3, iters=20):
    for _ in range(warmup):
        fn()
    prewarm()
    times = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


rows = []


def report(name, dtype, ms, moved, copy_bps=None):
    gbps = moved / (ms * 1e-3) / 1e9
    pct = 100.0 * moved / (ms * 1e-3) / copy_bps if copy_bps else 100.0
    rows.append(dict(name=name, dtype=dtype, ms=ms, bytes=moved, gb_per_s=gbps, pct_copy=pct))
    print(f"{name:<28} {dtype:<6} {ms:9.4f} ms  {gbps:8.1f} GB/s  {pct:6.1f}% copy", flush=True)


def main():
    torch.manual_seed(0)
    src = torch.empty(64 << 20, device=DEV)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    copy_bps = 2 * src.numel() * 4 / (ms * 1e-3)
    report("copy", "f32", ms, 2 * src.numel() * 4)
    del src, dst

    rows_v, dim, n = 128_256, 1024, 16_384
    idx = (torch.arange(n, device=DEV) * 7919) % rows_v
    for dtype, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        table = torch.randn(rows_v, dim, device=DEV, dtype=dtype)
        out = F.embedding(idx, table)
        size = out.element_size()
        ms = median_ms(lambda: F.embedding(idx, table))
        report("embedding_fwd", name, ms, 2 * n * dim * size + n * 8, copy_bps)
        dy = torch.randn_like(out)
        ms = median_ms(
            lambda: torch.ops.aten.embedding_dense_backward(dy, idx, rows_v, -1, False)
        )
        # PyTorch's gradient has the cotangent's dtype (wgrad's is F32).
        report(
            "embedding_dense_backward", name, ms, n * dim * size + n * 8 + rows_v * dim * size,
            copy_bps,
        )
        del table, out, dy

    numel = 1 << 26
    for label, kwargs in [("fused", dict(fused=True)), ("foreach", dict(foreach=True))]:
        p = torch.nn.Parameter(torch.randn(numel, device=DEV))
        p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW([p], lr=1e-3, **kwargs)
        ms = median_ms(opt.step)
        report(f"adamw_step {label}", "f32", ms, 7 * 4 * numel, copy_bps)
        del p, opt
    for label, kwargs in [("foreach", dict(foreach=True)), ("fused", dict(fused=True))]:
        p = torch.nn.Parameter(torch.randn(numel, device=DEV))
        p.grad = torch.randn_like(p)
        opt = torch.optim.SGD([p], lr=1e-3, momentum=0.9, **kwargs)
        opt.step()
        ms = median_ms(opt.step)
        report(f"sgd_momentum_step {label}", "f32", ms, 5 * 4 * numel, copy_bps)
        del p, opt
    for dtype, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        g = torch.randn(numel, device=DEV, dtype=dtype)
        ms = median_ms(lambda: torch.nn.utils.get_total_norm([g]))
        report("get_total_norm", name, ms, numel * g.element_size(), copy_bps)
        del g

    with open(os.path.join(OUT, "peers_embed_optim.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
