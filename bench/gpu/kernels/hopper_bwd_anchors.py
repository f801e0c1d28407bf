#!/usr/bin/env python3
"""Anchors for flashattn_hopper_bwd_timing: PyTorch SDPA's backward (FLASH_ATTENTION =
FA2, CUDNN_ATTENTION) on the shapes of the timing tool's CSV, in the same device call,
joined into one CSV with the ratios (anchor time / our time; > 1 means we are faster).

Usage: python3 bench/gpu/kernels/hopper_bwd_anchors.py timing.csv > joined.csv

Timing as bench/gpu/bench_attention.py: torch.autograd.grad of one SDPA output with
a random dO, triton.testing.do_bench median (warmup 25 ms, rep 100 ms). Inputs are
random normal (never zeros). FLOPs = 2.5 x forward, halved for causal. A dropout_p
column (the timing tool's --dropout) runs SDPA with that dropout.
"""
import csv
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

BACKENDS = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def anchor_ms(backend, batch, heads, seqlen, head_dim, dtype, causal, dropout_p):
    generator = torch.Generator(device="cuda").manual_seed(0)
    shape = (batch, heads, seqlen, head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=generator).requires_grad_() for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=dtype, generator=generator)
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout_p)
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()
    return do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), warmup=25, rep=100,
                    return_mode="median")


def main():
    rows = [row for row in csv.DictReader(line for line in open(sys.argv[1]) if not line.startswith("#"))]
    columns = list(rows[0].keys()) + ["fa2_ms", "cudnn_ms", "sm90_vs_fa2", "sm90_vs_cudnn", "fa2_class_vs_fa2",
                                      "sm90_vs_fa2_class"]
    writer = csv.DictWriter(sys.stdout, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        dtype = torch.bfloat16 if row["dtype"] == "bfloat16" else torch.float16
        args = (int(row["batch"]), int(row["heads"]), int(row["seqlen"]), int(row["head_dim"]), dtype,
                row["causal"] == "1", float(row.get("dropout_p", 0) or 0))
        for name, backend in BACKENDS.items():
            try:
                row[f"{name}_ms"] = f"{anchor_ms(backend, *args):.4f}"
            except Exception as error:  # an unavailable anchor is a result, not a crash
                print(f"# {name} {args}: {type(error).__name__}: {error}"[:300], file=sys.stderr)
                row[f"{name}_ms"] = "nan"
        sm90, fa2_class = float(row["sm90_ms"]), float(row["fa2_class_ms"])
        fa2, cudnn = float(row["fa2_ms"]), float(row["cudnn_ms"])
        row["sm90_vs_fa2"] = f"{fa2 / sm90:.3f}"
        row["sm90_vs_cudnn"] = f"{cudnn / sm90:.3f}"
        row["fa2_class_vs_fa2"] = f"{fa2 / fa2_class:.3f}"
        row["sm90_vs_fa2_class"] = f"{fa2_class / sm90:.3f}"
        writer.writerow(row)
        sys.stdout.flush()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
