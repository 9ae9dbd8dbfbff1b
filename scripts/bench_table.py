#!/usr/bin/env python3
"""Markdown table of a `bench` run (bench.json), with peer figures (peers.jsonl) from the same
call where an op, shape, dtype and mode match: Liger and the best PyTorch provider.

usage: bench_table.py bench.json [peers.jsonl]
"""
import json
import sys

DT = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def split_name(name):
    """(op, mode) of a bench row name: "rms_norm fwd", "swiglu_bwd", "softmax_backward",
    "cross_entropy_fwd_bwd" (mode "full"), or a bare forward op."""
    if " " in name:
        op, mode = name.split(None, 1)
        return op, mode
    for suffix, mode in (("_fwd_bwd", "full"), ("_backward", "bwd"), ("_bwd", "bwd"), ("_fwd", "fwd")):
        if name.endswith(suffix):
            return name[: -len(suffix)], mode
    return name, "fwd"


def main():
    bench = json.load(open(sys.argv[1]))
    peers = []
    if len(sys.argv) > 2:
        peers = [json.loads(line) for line in open(sys.argv[2]) if line.strip()]
    print(f"Copy kernel: {bench['copy_gb_per_s']:.0f} GB/s ({bench['adapter']}, {bench['backend']}).\n")
    print("| op | shape | dtype | median | GB/s | % copy | Liger % copy | best PyTorch % copy |")
    print("|---|---|---|---|---|---|---|---|")
    for r in bench["rows"]:
        op, mode = split_name(r["name"])
        match = [p for p in peers if p["op"] == op and p["shape"] == r["shape"]
                 and p["dtype"] == DT.get(r["dtype"], r["dtype"]) and p["mode"] == mode]
        liger = [p["pct_copy"] for p in match if p["provider"] == "liger" and p["pct_copy"]]
        torch = [(p["pct_copy"], p["provider"]) for p in match
                 if p["provider"] != "liger" and p["pct_copy"]]
        best = max(torch) if torch else None
        us = r["median_s"] * 1e6
        print(f"| {r['name']} | {r['shape']} | {r['dtype']} | {us:.1f} µs | {r['gb_per_s']:.0f} | "
              f"{r['pct_of_copy']:.1f} | {liger[0] if liger else '—'} | "
              f"{f'{best[0]} ({best[1]})' if best else '—'} |")


if __name__ == "__main__":
    main()
