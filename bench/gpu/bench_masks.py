#!/usr/bin/env python3
"""Mask benchmark (issue 15): ours against FlexAttention, SDPA with a dense boolean
mask and cuDNN with an additive bias — one process, the same inputs, the same timer.

The masks of the issue's table (top-left aligned, as PyTorch and FlexAttention):
  none, causal, window (sliding window of 1024 keys, causal), document (document-causal:
  8 documents of random length packed in one sequence, the same for every batch item),
and a density sweep: random block masks (128 x 128 blocks, every listed block full) at
5%-100% of the blocks, where the time should be linear in the density (seed 003).

Implementations (SDPA layout [batch, heads, seqlen, head_dim] for every one of them):
  ours        flashattn.scaled_dot_product_attention(..., block_mask=) with the built-in
              element rule (block_mask_from_rule: band / document ids, no bit mask);
  ours_torch  the same call given torch's BlockMask as it is (partial blocks as bits);
  ours_dense  flashattn.scaled_dot_product_attention(..., attn_mask=<dense bool>);
  flex        torch.compile(flex_attention) with torch's create_block_mask;
  sdpa_dense  F.scaled_dot_product_attention(attn_mask=<dense bool>) (efficient backend);
  cudnn_bias  F.scaled_dot_product_attention(attn_mask=<additive 0/-inf bias>) on cuDNN.
Timer: triton.testing.do_bench(warmup=25, rep=100, median); the backward is
torch.autograd.grad of a saved output, timed alone. FLOPs count the allowed elements
only (4·d per allowed score forward, 2.5x that backward), as the issue's table.
Every series is checked against FlexAttention (sdpa_dense where Flex is missing)
before it is timed; a wrong or failing one is recorded, not timed.

  python bench/gpu/bench_masks.py                       # table + density sweep, fwd + bwd
  python bench/gpu/bench_masks.py --masks causal,document --passes fwd --quick
Writes <out-dir>/gpu_masks.csv and gpu_masks.png.
"""

import argparse
import csv
import datetime
import math
import os
import traceback

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

TOLERANCE = {"fwd": 3e-2, "bwd": 5e-2}  # bf16 relative error (max|x - anchor| / max|anchor|)
CSV_COLUMNS = ("mask", "density", "batch", "heads", "seqlen", "head_dim", "pass", "impl", "time_ms", "tflops",
               "ratio_vs_flex", "max_rel_err", "status", "device", "date")


def document_ids(seqlen, documents, seed):
    """Document id per token: `documents` documents of random lengths (>= 1) in one sequence."""
    generator = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(seqlen - 1, generator=generator)[: documents - 1].sort().values + 1
    ids = torch.zeros(seqlen, dtype=torch.int32)
    ids[cuts] = 1
    return ids.cumsum(0).to(torch.int32)


class MaskCase:
    """One mask: torch mask_mod, our rule arguments, the dense boolean mask [1, 1, N, N]."""

    def __init__(self, name, seqlen, density=1.0, window=1024, seed=0):
        self.name, self.density, self.seqlen = name, density, seqlen
        n = seqlen
        rows = torch.arange(n, device="cuda")[:, None]
        cols = torch.arange(n, device="cuda")[None, :]
        self.rule = {}
        self.block_allowed = None
        if name == "none":
            self.mask_mod = lambda b, h, q, kv: q >= 0
            dense = torch.ones(n, n, dtype=torch.bool, device="cuda")
        elif name == "causal":
            self.mask_mod = lambda b, h, q, kv: q >= kv
            self.rule = {"causal": True}
            dense = rows >= cols
        elif name == "window":
            self.mask_mod = lambda b, h, q, kv: (q >= kv) & (q - kv <= window)
            self.rule = {"window": (window, 0)}
            dense = (rows >= cols) & (rows - cols <= window)
        elif name == "document":
            docs = document_ids(n, 8, seed).cuda()
            self.mask_mod = lambda b, h, q, kv: (docs[q] == docs[kv]) & (q >= kv)
            self.rule = {"causal": True, "q_document_ids": docs[None], "k_document_ids": docs[None]}
            dense = (docs[:, None] == docs[None, :]) & (rows >= cols)
        elif name == "density":
            blocks = (n + 127) // 128
            generator = torch.Generator().manual_seed(seed)
            keep = torch.rand(blocks, blocks, generator=generator) < density
            keep[torch.arange(blocks), torch.arange(blocks)] = True  # no empty row
            self.block_allowed = keep.cuda()
            expanded = keep.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :n].cuda()
            self.mask_mod = lambda b, h, q, kv: self.block_allowed[q // 128, kv // 128]
            dense = expanded
        else:
            raise ValueError(f"unknown mask {name!r}")
        self.dense = dense[None, None].contiguous()
        self.allowed = int(dense.sum().item())
        self.bias = torch.zeros(self.dense.shape, dtype=torch.bfloat16, device="cuda").masked_fill(~self.dense,
                                                                                                  float("-inf"))


def make_series(name, flashattn, case, batch, heads):
    """forward(q, k, v) -> out for one implementation, or raises why it cannot run."""
    n = case.seqlen
    if name == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        compiled = torch.compile(flex_attention)
        block_mask = create_block_mask(case.mask_mod, None, None, n, n, device="cuda")
        return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)
    if name == "sdpa_dense":
        def run(q, k, v):
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=case.dense)
        return run
    if name == "cudnn_bias":
        def run(q, k, v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=case.bias)
        return run
    if flashattn is None:
        raise RuntimeError("flashattn with CUDA is not available")
    if name == "ours_dense":
        return lambda q, k, v: flashattn.scaled_dot_product_attention(q, k, v, attn_mask=case.dense)
    if name == "ours_torch":
        from torch.nn.attention.flex_attention import create_block_mask

        block_mask = create_block_mask(case.mask_mod, None, None, n, n, device="cuda")
        return lambda q, k, v: flashattn.scaled_dot_product_attention(q, k, v, block_mask=block_mask)
    if name == "ours":
        if case.name == "density":
            block_mask = flashattn.block_mask_from_dense(case.dense)  # whole blocks: every listed block is full
        else:
            block_mask = flashattn.block_mask_from_rule(None, None, n, n, **case.rule).to("cuda")
        return lambda q, k, v: flashattn.scaled_dot_product_attention(q, k, v, block_mask=block_mask)
    raise ValueError(f"unknown implementation {name!r}")


def relative_error(x, anchor):
    scale = anchor.float().abs().max().item()
    return (x.float() - anchor.float()).abs().max().item() / (scale if scale > 0 else 1.0)


def measure(forward, inputs, dout, pass_name):
    """(time_ms, value): value = out (fwd) or (dq, dk, dv) (bwd) for the check."""
    if pass_name == "fwd":
        with torch.no_grad():
            out = forward(*inputs)
            return do_bench(lambda: forward(*inputs), warmup=25, rep=100, return_mode="median"), out
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = forward(*leaves)
    grads = torch.autograd.grad(out, leaves, dout, retain_graph=True)
    time_ms = do_bench(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True), warmup=25, rep=100,
                       return_mode="median")
    return time_ms, grads


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--masks", default="none,causal,window,document")
    parser.add_argument("--densities", default="0.05,0.1,0.25,0.5,0.75,1.0", help="empty = no sweep")
    parser.add_argument("--impls", default="flex,ours,ours_torch,ours_dense,sdpa_dense,cudnn_bias")
    parser.add_argument("--passes", default="fwd,bwd")
    parser.add_argument("--quick", action="store_true", help="batch 2 (a smoke run)")
    parser.add_argument("--out-dir", default="bench/results")
    args = parser.parse_args()
    batch = 2 if args.quick else args.batch
    try:
        import flashattn
        if not flashattn.cuda_available():
            flashattn = None
    except Exception:  # noqa: BLE001 - report below as unavailable series
        flashattn = None
    device = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    torch.manual_seed(0)
    shape = (batch, args.heads, args.seqlen, args.head_dim)
    inputs = tuple(torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    cases = [MaskCase(name, args.seqlen) for name in args.masks.split(",") if name]
    cases += [MaskCase("density", args.seqlen, density=float(d)) for d in args.densities.split(",") if d]
    rows = []
    for case in cases:
        for pass_name in args.passes.split(","):
            flops = 4.0 * batch * args.heads * case.allowed * args.head_dim * (2.5 if pass_name == "bwd" else 1.0)
            anchor, flex_ms = None, math.nan
            for impl in args.impls.split(","):
                status, time_ms, error = "ok", math.nan, math.nan
                try:
                    forward = make_series(impl, flashattn, case, batch, args.heads)
                    time_ms, value = measure(forward, inputs, dout, pass_name)
                    values = value if isinstance(value, tuple) else (value,)
                    if anchor is None:
                        anchor = values
                        status = "ok (anchor)"
                    else:
                        error = max(relative_error(x, a) for x, a in zip(values, anchor))
                        if not error <= TOLERANCE[pass_name]:
                            status, time_ms = f"WRONG (rel err {error:.3g}; not timed)", math.nan
                except Exception as exc:  # noqa: BLE001 - an unavailable series is a row, not a crash
                    status = f"unavailable: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                    if os.environ.get("BENCH_TRACEBACK"):
                        traceback.print_exc()
                if impl == "flex" and not math.isnan(time_ms):
                    flex_ms = time_ms
                tflops = flops / (time_ms * 1e-3) / 1e12 if time_ms == time_ms else math.nan
                row = {"mask": case.name, "density": f"{case.allowed / args.seqlen ** 2:.4f}", "batch": batch,
                       "heads": args.heads, "seqlen": args.seqlen, "head_dim": args.head_dim, "pass": pass_name,
                       "impl": impl, "time_ms": f"{time_ms:.4f}", "tflops": f"{tflops:.1f}",
                       "ratio_vs_flex": f"{flex_ms / time_ms:.3f}" if time_ms == time_ms and flex_ms == flex_ms else "nan",
                       "max_rel_err": f"{error:.3g}", "status": status, "device": device, "date": date}
                rows.append(row)
                print(f"{case.name:9s} {row['density']:>7s} {pass_name} {impl:11s} {row['time_ms']:>9s} ms "
                      f"{row['tflops']:>7s} TF/s  x{row['ratio_vs_flex']:>6s} vs flex  {status}", flush=True)
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "gpu_masks.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print("wrote", path)
    plot(rows, os.path.join(args.out_dir, "gpu_masks.png"))


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    passes = sorted({r["pass"] for r in rows}, reverse=True)
    figure, axes = plt.subplots(2, len(passes), figsize=(5.5 * len(passes), 7), squeeze=False)
    for column, pass_name in enumerate(passes):
        table = [r for r in rows if r["pass"] == pass_name and r["mask"] != "density"]
        masks = list(dict.fromkeys(r["mask"] for r in table))
        impls = list(dict.fromkeys(r["impl"] for r in table))
        axis = axes[0][column]
        width = 0.8 / max(1, len(impls))
        for i, impl in enumerate(impls):
            values = [next((float(r["tflops"]) for r in table if r["mask"] == m and r["impl"] == impl), math.nan)
                      for m in masks]
            axis.bar([x + i * width for x in range(len(masks))], [0 if v != v else v for v in values], width,
                     label=impl)
        axis.set_xticks([x + width * (len(impls) - 1) / 2 for x in range(len(masks))], masks)
        axis.set_ylabel("TFLOP/s (allowed entries)")
        axis.set_title(f"{pass_name}: masks", fontsize=9)
        axis.legend(fontsize=7)
        sweep = [r for r in rows if r["pass"] == pass_name and r["mask"] == "density"]
        axis = axes[1][column]
        for impl in dict.fromkeys(r["impl"] for r in sweep):
            points = sorted((float(r["density"]), float(r["time_ms"])) for r in sweep
                            if r["impl"] == impl and r["time_ms"] != "nan")
            if points:
                axis.plot(*zip(*points), marker="o", label=impl)
        axis.set_xlabel("density (allowed fraction)")
        axis.set_ylabel("time (ms)")
        axis.set_title(f"{pass_name}: block density sweep", fontsize=9)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    if rows:
        first = rows[0]
        figure.suptitle(f"masks bf16 B{first['batch']} H{first['heads']} N{first['seqlen']} d{first['head_dim']} — "
                        f"{first['device']} — {first['date']}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print("wrote", path)


if __name__ == "__main__":
    main()
