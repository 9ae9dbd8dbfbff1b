"""Timing shared by the peer scripts in this folder: the median of Triton's `do_bench` after
0.3 s of busy warm-up (so the GPU's clocks are up), in milliseconds."""
import time

import torch
import triton.testing as tt


def median_ms(fn):
    start = time.time()
    while time.time() - start < 0.3:
        fn()
    torch.cuda.synchronize()
    return tt.do_bench(fn, warmup=25, rep=200, return_mode="median")
