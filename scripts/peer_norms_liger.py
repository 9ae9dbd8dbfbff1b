#!/usr/bin/env python3
"""Liger-Kernel and PyTorch peers of wgrad's other normalization rows (`bench --only
modulated_rms_norm,group_norm,poly_norm,dyt`), on the bench's shapes and values, F32 and BF16:
modulated RMSNorm `(1 + scale)·RMSNorm(x)·w + shift` on x [8192, 8192] with scale and shift
[2, 8192] (two batches of 4,096 rows); GroupNorm on [8192, 32, 256], 8 groups, affine;
PolyNorm on [8192, 8192] with w [3] and a scalar bias; DyT `γ·tanh(αx) + β` on [8192, 8192];
RMSNorm and LayerNorm (weight and bias 1.25) on the narrow rows [65536, 1024] (`bench`'s
fourth norm shape).
Forward and backward timed separately (the median of Triton's `do_bench` after 0.3 s of busy
warm-up, `peer_timing.median_ms`), in the same command as wgrad's bench. Bytes as the bench
counts them: forward reads x and writes y, backward reads x and dy and writes dx (parameters
and statistics are small beside them). Prints one line per row and writes JSON lines to
$OUT/peers_norms.jsonl. A missing Liger op prints its error; the other rows still run.
"""
import json
import os

import torch
import torch.nn.functional as F
from peer_timing import copy_gbs, median_ms

OUT = os.environ.get("OUT", "/tmp")
DEV = "cuda"
ROWS, COLS = 8192, 8192
rows = []


def source(shape, dtype):
    # The bench's values: ((i mod 251) − 125)/64.
    n = 1
    for s in shape:
        n *= s
    i = torch.arange(n, device=DEV, dtype=torch.int64)
    return (((i % 251) - 125).to(torch.float32) / 64.0).reshape(shape).to(dtype)


def measure(op, peer, dtype, make, fn, copy):
    """make() -> (inputs needing gradients, other inputs); fn(*grads, *others) -> y."""
    size = torch.tensor([], dtype=dtype).element_size()
    grads, others = make()
    y = fn(*grads, *others)
    dy = source(y.shape, dtype)
    n = y.numel()

    def backward():
        for t in grads:
            t.grad = None
        y.backward(dy, retain_graph=True)

    label = "bf16" if dtype == torch.bfloat16 else "f32"
    for mode, run, nbytes in (("fwd", lambda: fn(*grads, *others), 2 * n * size), ("bwd", backward, 3 * n * size)):
        ms = median_ms(run)
        gbs = nbytes / ms / 1e6
        row = dict(op=op, peer=peer, dtype=label, mode=mode, ms=ms, gbs=gbs, pct_copy=100 * gbs / copy)
        rows.append(row)
        print(f"{op:<21} {peer:<12} {label:<5} {mode}  {ms * 1000:9.1f} us  {gbs:8.1f} GB/s  {row['pct_copy']:5.1f}% of copy", flush=True)


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def main():
    copy = copy_gbs()
    print(f"copy {copy:.1f} GB/s", flush=True)
    liger = {}
    for name, module, attr in (
        ("dyt", "liger_kernel.ops.dyt", "LigerDyTFunction"),
        ("poly_norm", "liger_kernel.ops.poly_norm", "LigerPolyNormFunction"),
        ("modulated_rms_norm", "liger_kernel.ops.modulated_rms_norm", "LigerModulatedRMSNormFunction"),
        ("group_norm", "liger_kernel.ops.group_norm", "LigerGroupNormFunction"),
        ("rms_norm", "liger_kernel.ops.rms_norm", "LigerRMSNormFunction"),
        ("layer_norm", "liger_kernel.ops.layer_norm", "LigerLayerNormFunction"),
    ):
        try:
            liger[name] = getattr(__import__(module, fromlist=[attr]), attr)
        except Exception as err:  # report and keep the other rows
            print(f"liger {name}: import failed: {err}", flush=True)
    for dtype in (torch.float32, torch.bfloat16):
        x = source((ROWS, COLS), dtype)
        w = torch.full((COLS,), 1.25, device=DEV, dtype=dtype)

        # modulated RMSNorm: x as [2, 4096, 8192], scale = shift = 0.125.
        xm = x.reshape(2, ROWS // 2, COLS)
        m = torch.full((2, COLS), 0.125, device=DEV, dtype=dtype)

        def mod_make():
            return [leaf(xm), leaf(w), leaf(m), leaf(m)], []

        def mod_torch(x, w, scale, shift):
            xf = x.float()
            n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)
            return ((1 + scale.float()[:, None]) * (n * w.float()) + shift.float()[:, None]).to(x.dtype)

        measure("modulated_rms_norm", "torch eager", dtype, mod_make, mod_torch, copy)
        if "modulated_rms_norm" in liger:
            f = liger["modulated_rms_norm"].apply
            measure("modulated_rms_norm", "liger", dtype, mod_make,
                    lambda x, w, s, h: f(x, w, s, h, 1e-5, 0.0, "llama", True), copy)

        # GroupNorm [8192, 32, 256], 8 groups.
        xg = x.reshape(ROWS, 32, COLS // 32)
        wg = torch.full((32,), 1.25, device=DEV, dtype=dtype)

        def group_make():
            return [leaf(xg), leaf(wg), leaf(wg)], []

        measure("group_norm", "torch eager", dtype, group_make, lambda x, w, b: F.group_norm(x, 8, w, b, 1e-5), copy)
        if "group_norm" in liger:
            f = liger["group_norm"].apply
            measure("group_norm", "liger", dtype, group_make, lambda x, w, b: f(x, w, b, 32, 8, 1e-5), copy)

        # PolyNorm, w = (0.5, 0.25, 1), b = 0.1.
        pw = torch.tensor([0.5, 0.25, 1.0], device=DEV, dtype=dtype)
        pb = torch.tensor(0.1, device=DEV, dtype=dtype)  # Liger takes a 0-dim bias

        def poly_make():
            return [leaf(x), leaf(pw), leaf(pb)], []

        def poly_torch(x, w, b):
            xf = x.float()

            def n(u):
                return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + 1e-6)

            return (w[0] * n(xf ** 3) + w[1] * n(xf ** 2) + w[2] * n(xf) + b).to(x.dtype)

        measure("poly_norm", "torch eager", dtype, poly_make, poly_torch, copy)
        if "poly_norm" in liger:
            f = liger["poly_norm"].apply
            measure("poly_norm", "liger", dtype, poly_make, lambda x, w, b: f(x, w, b, 1e-6, True), copy)

        # DyT, α = 0.5, γ = β = 1.25.
        alpha = torch.tensor([0.5], device=DEV, dtype=dtype)

        def dyt_make():
            return [leaf(x), leaf(alpha), leaf(w), leaf(w)], []

        measure("dyt", "torch eager", dtype, dyt_make, lambda x, a, g, b: g * torch.tanh(a * x) + b, copy)
        if "dyt" in liger:
            measure("dyt", "liger", dtype, dyt_make, liger["dyt"].apply, copy)
        # RMSNorm and LayerNorm on rows of 1,024 values.
        xn = source((65536, 1024), dtype)
        wn = torch.full((1024,), 1.25, device=DEV, dtype=dtype)

        def narrow_make():
            return [leaf(xn), leaf(wn)], []

        def narrow_ln_make():
            return [leaf(xn), leaf(wn), leaf(wn)], []

        measure("rms_norm 65536x1024", "F.rms_norm", dtype, narrow_make,
                lambda x, w: F.rms_norm(x, (1024,), w, 1e-5), copy)
        measure("layer_norm 65536x1024", "F.layer_norm", dtype, narrow_ln_make,
                lambda x, w, b: F.layer_norm(x, (1024,), w, b, 1e-5), copy)
        if "rms_norm" in liger:
            f = liger["rms_norm"].apply
            measure("rms_norm 65536x1024", "liger", dtype, narrow_make,
                    lambda x, w: f(x, w, 1e-5, 0.0, "llama", False), copy)
        if "layer_norm" in liger:
            f = liger["layer_norm"].apply
            measure("layer_norm 65536x1024", "liger", dtype, narrow_ln_make,
                    lambda x, w, b: f(x, w, b, 1e-5), copy)
        torch.cuda.empty_cache()
    with open(os.path.join(OUT, "peers_norms.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


main()
