#!/usr/bin/env python3
"""Anchors for flashattn_bwd_timing: PyTorch SDPA's backward (FLASH_ATTENTION = FA2,
CUDNN_ATTENTION) on the shapes of the timing tool's CSV, run in the same device call,
joined into one CSV with the ratios (anchor time / our time; > 1: ours is faster).

Usage: python3 bench/gpu/kernels/bwd_anchors.py timing.csv [min_seqlen] > joined.csv

Timing as bench/gpu/bench_attention.py: torch.autograd.grad of one SDPA output with a
random dO, triton.testing.do_bench median (warmup 25 ms, rep 100 ms). Inputs random
normal (never zeros). Rows of the same shape (default and deterministic) share the
anchors; SDPA has no deterministic FA2 backward, so those rows compare against FA2's
default (atomic dQ) backward.
"""
import csv
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

BACKENDS = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def anchor_ms(backend, batch, heads, seqlen, head_dim, dtype, causal):
    generator = torch.Generator(device="cuda").manual_seed(0)
    shape = (batch, heads, seqlen, head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=generator).requires_grad_() for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=dtype, generator=generator)
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()
    return do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), warmup=25, rep=100,
                    return_mode="median")


def main():
    min_seqlen = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    rows = [row for row in csv.DictReader(line for line in open(sys.argv[1]) if not line.startswith("#"))]
    rows = [row for row in rows if int(row["seqlen"]) >= min_seqlen]
    columns = list(rows[0].keys()) + ["fa2_ms", "cudnn_ms", "ours_vs_fa2", "ours_vs_cudnn"]
    writer = csv.DictWriter(sys.stdout, fieldnames=columns)
    writer.writeheader()
    anchors = {}
    for row in rows:
        dtype = torch.bfloat16 if row["dtype"] == "bfloat16" else torch.float16
        key = (int(row["batch"]), int(row["heads"]), int(row["seqlen"]), int(row["head_dim"]), dtype,
               row["causal"] == "1")
        if key not in anchors:
            anchors[key] = {}
            for name, backend in BACKENDS.items():
                try:
                    anchors[key][name] = anchor_ms(backend, *key)
                except Exception as error:  # an unavailable anchor is a result, not a crash
                    print(f"# {name} {key}: {type(error).__name__}: {error}"[:300], file=sys.stderr)
                    anchors[key][name] = float("nan")
            torch.cuda.empty_cache()
        ours = float(row["ms"])
        row["fa2_ms"] = f"{anchors[key]['fa2']:.4f}"
        row["cudnn_ms"] = f"{anchors[key]['cudnn']:.4f}"
        row["ours_vs_fa2"] = f"{anchors[key]['fa2'] / ours:.3f}"
        row["ours_vs_cudnn"] = f"{anchors[key]['cudnn'] / ours:.3f}"
        writer.writerow(row)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
