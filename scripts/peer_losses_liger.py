#!/usr/bin/env python3
"""Liger-Kernel and PyTorch peers of wgrad's post-training loss rows, at the `bench` example's
shapes (run in the same call as `bench --only grpo,fused_linear_grpo,preference`):

* grpo_loss_fwd_bwd: Liger's `triton_grpo_loss` on logits [8, 1025, 32768] (old and reference
  log-probabilities, beta 0.04, a mask, DAPO, temperature 1) forward + backward, and the same
  loss in eager PyTorch (log_softmax + gather);
* fused_linear_grpo_fwd_bwd: `LigerFusedLinearGRPOLoss` on x [4, 1024, 4096], W [128256, 4096];
* preference_dpo_fwd_bwd: `LigerFusedLinearDPOLoss` on 2 pairs of 1,024 tokens, H 4096,
  V 128,256, with reference log-probabilities given as a reference head (`use_ref_model`).

F32 and BF16 inputs. CUDA-event medians of 10 runs after 2 warm-ups; peak memory is
`max_memory_allocated` beyond the inputs. Each measurement is guarded: an API mismatch prints
its error and the script goes on. Prints one line per row and writes JSON lines to
$OUT/peers_losses.jsonl.
"""
import json
import os
import statistics

import torch
import torch.nn.functional as F

OUT = os.environ.get("OUT", "/tmp")
DEV = "cuda"
rows = []


def timed(fn, warmup=2, iters=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    times = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times), peak


def report(name, peer, dtype, fn):
    try:
        ms, peak = timed(fn)
    except Exception as err:  # an API mismatch must not end the call
        print(f"{name:<28} {peer:<14} {dtype:<5} FAILED: {type(err).__name__}: {err}", flush=True)
        return
    rows.append(dict(name=name, peer=peer, dtype=dtype, ms=ms, peak_bytes=peak))
    print(f"{name:<28} {peer:<14} {dtype:<5} {ms:9.3f} ms  peak {peak / 2**20:9.1f} MiB", flush=True)


def grpo_rows(dtype):
    b, l, v = 8, 1024, 32768
    g = torch.Generator(device=DEV).manual_seed(0)
    logits = torch.randn(b, l + 1, v, device=DEV, generator=g).to(dtype).requires_grad_()
    ids = torch.randint(0, v, (b, l), device=DEV, generator=g)
    adv = torch.randn(b, device=DEV, generator=g)
    old = torch.full((b, l), -11.0, device=DEV)
    ref = torch.full((b, l), -11.0, device=DEV)
    mask = (torch.arange(b * l, device=DEV).view(b, l) % 7 != 0).to(torch.int32)
    label = "bf16" if dtype == torch.bfloat16 else "f32"
    try:
        from liger_kernel.transformers.grpo_loss import triton_grpo_loss
    except Exception:
        try:
            from liger_kernel.ops.grpo_loss import triton_grpo_loss
        except Exception as err:
            print(f"grpo_loss_fwd_bwd liger: import failed: {err}")
            triton_grpo_loss = None
    if triton_grpo_loss is not None:

        def liger():
            out = triton_grpo_loss(logits, old, ref, ids, adv, mask, temperature=1.0, beta=0.04,
                                   eps_low=0.2, eps_high=0.2, inplace=False, loss_type="dapo",
                                   reduce=True)
            loss = out[0] if isinstance(out, tuple) else out
            loss.backward()
            logits.grad = None

        report("grpo_loss_fwd_bwd", "liger", label, liger)

    def eager():
        lp = F.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        c1 = torch.exp(lp - old)
        c2 = torch.clamp(c1, 0.8, 1.2)
        a = adv.unsqueeze(1)
        per = -torch.min(c1 * a, c2 * a)
        diff = ref - lp
        per = per + 0.04 * (torch.exp(diff) - diff - 1)
        m = mask.float()
        loss = (per * m).sum() / m.sum().clamp(min=1)
        loss.backward()
        logits.grad = None

    report("grpo_loss_fwd_bwd", "torch", label, eager)


def fused_grpo_rows(dtype):
    b, l, h, v = 4, 1024, 4096, 128256
    g = torch.Generator(device=DEV).manual_seed(1)
    x = (torch.randn(b, l, h, device=DEV, generator=g) * 0.5).to(dtype).requires_grad_()
    w = (torch.randn(v, h, device=DEV, generator=g) * 0.02).to(dtype).requires_grad_()
    ids = torch.randint(0, v, (b, l), device=DEV, generator=g)
    adv = torch.randn(b, device=DEV, generator=g)
    logp = torch.full((b, l), -11.0, device=DEV)
    mask = torch.ones(b, l, device=DEV, dtype=torch.int64)
    label = "bf16" if dtype == torch.bfloat16 else "f32"
    try:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
    except Exception as err:
        print(f"fused_linear_grpo liger: import failed: {err}")
        return
    module = LigerFusedLinearGRPOLoss(beta=0.04, use_ref_model=False, loss_type="dapo")

    def liger():
        out = module(x, w, ids, mask, adv, ref_per_token_logps=logp, old_per_token_logps=logp)
        loss = out[0] if isinstance(out, tuple) else out
        loss.backward()
        x.grad = None
        w.grad = None

    report("fused_linear_grpo_fwd_bwd", "liger", label, liger)


def dpo_rows(dtype):
    pairs, t, h, v = 2, 1024, 4096, 128256
    g = torch.Generator(device=DEV).manual_seed(2)
    x = (torch.randn(2 * pairs, t, h, device=DEV, generator=g) * 0.5).to(dtype).requires_grad_()
    w = (torch.randn(v, h, device=DEV, generator=g) * 0.02).to(dtype).requires_grad_()
    ref_w = w.detach().clone()
    target = torch.randint(0, v, (2 * pairs, t), device=DEV, generator=g)
    label = "bf16" if dtype == torch.bfloat16 else "f32"
    try:
        from liger_kernel.chunked_loss import LigerFusedLinearDPOLoss
    except Exception as err:
        print(f"preference_dpo liger: import failed: {err}")
        return
    module = LigerFusedLinearDPOLoss(beta=0.1, use_ref_model=True)

    def liger():
        out = module(w, x, target, ref_input=x.detach(), ref_weight=ref_w)
        loss = out[0] if isinstance(out, tuple) else out
        loss.backward()
        x.grad = None
        w.grad = None

    report("preference_dpo_fwd_bwd", "liger", label, liger)


for dt in (torch.float32, torch.bfloat16):
    for section in (grpo_rows, fused_grpo_rows, dpo_rows):
        try:
            section(dt)
        except Exception as err:
            print(f"{section.__name__} {dt}: {type(err).__name__}: {err}", flush=True)
        torch.cuda.empty_cache()

with open(os.path.join(OUT, "peers_losses.jsonl"), "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
