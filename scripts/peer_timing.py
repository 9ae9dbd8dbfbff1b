"""Timing shared by the peer scripts in this folder: the median of Triton's `do_bench` after
0.3 s of busy warm-up (so the GPU's clocks are up), in milliseconds; and PyTorch's copy
bandwidth, the peers' "% of copy" reference."""
import time

import torch
import triton.testing as tt


def median_ms(fn):
    start = time.time()
    while time.time() - start < 0.3:
        fn()
    torch.cuda.synchronize()
    return tt.do_bench(fn, warmup=25, rep=200, return_mode="median")


def copy_gbs(device="cuda"):
    """GB/s of PyTorch's copy of 512 MiB (read + write), timed as above."""
    src = torch.empty(16384 * 8192, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / ms / 1e6
