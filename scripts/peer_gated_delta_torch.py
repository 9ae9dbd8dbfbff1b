#!/usr/bin/env python3
"""PyTorch sequential gated delta rule (the recurrence written token by token, autograd for the
backward): the peer for wgrad's gated_delta backward on machines where flash-linear-attention's
backward cannot run. Prints one line per measurement and appends JSON lines to
$OUT/peers_gdn_torch.jsonl.

Recurrence per token and value head: S = exp(g)·S; e = v − Sᵀk; S = S + β·k⊗e; o = scale·Sᵀq.
"""
import json
import os
import time

import torch

OUT = os.environ.get("OUT", "/tmp")


def recurrence(q, k, v, beta, g, scale):
    b, t, h, kd = q.shape
    state = torch.zeros(b, h, kd, v.shape[-1], device=q.device, dtype=torch.float32)
    outs = []
    for i in range(t):
        state = state * torch.exp(g[:, i])[..., None, None]
        ki = k[:, i]
        err = v[:, i] - torch.einsum("bhkv,bhk->bhv", state, ki)
        state = state + beta[:, i][..., None, None] * torch.einsum("bhk,bhv->bhkv", ki, err)
        outs.append(scale * torch.einsum("bhkv,bhk->bhv", state, q[:, i]))
    return torch.stack(outs, 1), state


def measure(b, t, hk, hv, kd, vd, reps=2):
    torch.manual_seed(0)
    dev = "cuda"
    q = torch.randn(b, t, hk, kd, device=dev) / kd**0.5
    k = torch.nn.functional.normalize(torch.randn(b, t, hk, kd, device=dev), dim=-1)
    v = torch.randn(b, t, hv, vd, device=dev)
    beta = torch.rand(b, t, hv, device=dev)
    g = -torch.rand(b, t, hv, device=dev) * 0.1
    rep = hv // hk
    leaves = [x.requires_grad_() for x in (q, k, v, beta, g)]

    def fwd():
        qq = leaves[0].repeat_interleave(rep, dim=2)
        kk = leaves[1].repeat_interleave(rep, dim=2)
        return recurrence(qq, kk, leaves[2], leaves[3], leaves[4], kd**-0.5)

    def timed(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def fwd_only():
        with torch.no_grad():
            fwd()

    def fwd_bwd():
        o, s = fwd()
        (o.sum() + s.sum()).backward()

    fwd_only()
    fwd_bwd()
    f = min(timed(fwd_only) for _ in range(reps))
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fb = min(timed(fwd_bwd) for _ in range(reps))
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    shape = f"B{b} T{t} Hk{hk} Hv{hv} K={kd} V={vd}"
    for mode, sec, pk in (("fwd", f, None), ("full", fb, peak)):
        row = dict(op="gated_delta", provider="torch sequential", shape=shape, dtype="float32",
                   mode=mode, ms=round(sec * 1e3, 2), peak_mb=pk and round(pk, 1))
        print(" | ".join(str(x) for x in row.values()), flush=True)
        with open(os.path.join(OUT, "peers_gdn_torch.jsonl"), "a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__)
    for shape in ((4, 2048, 16, 16, 128, 128), (1, 8192, 16, 48, 128, 128)):
        try:
            measure(*shape)
        except torch.OutOfMemoryError as e:  # autograd keeps every state: O(T·H·K·V)
            print(f"FAILED {shape}: out of memory: {str(e)[:200]}", flush=True)
        torch.cuda.empty_cache()
