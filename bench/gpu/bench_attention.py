#!/usr/bin/env python3
"""GPU attention benchmark: ours against PyTorch SDPA's FlashAttention-2 and cuDNN.

The method of shared/BENCHMARKS.md, in one process on the same inputs:
  - inputs torch.randn in SDPA's layout [batch, heads, seqlen, head_dim]; ours takes
    flash_attn's [batch, seqlen, heads, head_dim], converted outside the timed region;
  - timer triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median");
  - FLOPs: forward 4*B*H*Nq*Nk*d, halved for causal; backward 2.5x the forward, timed
    alone (torch.autograd.grad of a saved output);
  - anchors: scaled_dot_product_attention restricted by torch.nn.attention.sdpa_kernel
    to FLASH_ATTENTION ("fa2") and to CUDNN_ATTENTION ("cudnn").
Every implementation is checked against the FA2 anchor (cuDNN if FA2 is unavailable)
before it is timed, so a wrong kernel is never reported fast; an implementation that
raises is recorded as unavailable, not a crash.

  python bench/gpu/bench_attention.py                 # forward, every sweep
  python bench/gpu/bench_attention.py --backward      # forward and backward
  python bench/gpu/bench_attention.py --passes bwd --sweeps seed004 --quick
  python bench/gpu/bench_attention.py --dropout 0.1 --impls fa2,cudnn,ours,ours_plain
  python bench/gpu/bench_attention.py --alibi --impls ours,ours_plain
  python bench/gpu/bench_attention.py --alibi --impls ours_flash2,ours_flash2_plain   # the sm80 forward
  FLASHATTN_CUDA_BWD_SM90=0 python bench/gpu/bench_attention.py --alibi --passes bwd --impls ours,ours_plain
With --dropout P every implementation (anchors too) drops with probability P; the masks
differ between implementations, so results are not compared, only timed ("ok
(unchecked: dropout)"); ours_plain is ours without dropout/ALiBi in the same run, for
the cost. FLOPs are counted as without dropout/ALiBi.
Writes <out-dir>/gpu_forward.csv, gpu_backward.csv and a PNG plot per pass.
"""

import argparse
import csv
import datetime
import math
import os
import sys
import traceback

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

SEQLENS_SEED004 = (1024, 2048, 4096, 8192, 16384)
SEQLENS_FA3 = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_SEQLENS = (1024, 4096)
TOKENS_FA3 = 16384  # batch = 16k tokens / seqlen
HIDDEN_FA3 = 2048  # heads = hidden / head_dim


def sweep_points(name, seqlens):
    """(batch, heads, seqlen, head_dim) of each point of a sweep of BENCHMARKS.md."""
    if name == "seed004":
        return [(4, 48, n, 64) for n in seqlens]
    head_dim = int(name.removeprefix("fa3_d"))
    return [(TOKENS_FA3 // n, HIDDEN_FA3 // head_dim, n, head_dim) for n in seqlens]


SWEEPS = {
    "seed004": ("fp16", SEQLENS_SEED004),
    "fa3_d64": ("bf16", SEQLENS_FA3),
    "fa3_d128": ("bf16", SEQLENS_FA3),
    "fa3_d256": ("bf16", SEQLENS_FA3),
}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# Relative error (max|x - anchor| / max|anchor|) above which a result is WRONG. Two
# correct kernels differ by a few output ulps (fp16 2^-11, bf16 2^-8); gradients
# accumulate over the sequence, so they get more room.
# Measured on the H100 (2026-11-22), cuDNN against FA2: fwd fp16 <= 4.4e-4, bf16 <=
# 6.3e-3; bwd fp16 <= 5.5e-4, bf16 <= 7.6e-3. The limits leave 5x or more room.
TOLERANCE = {("fwd", "fp16"): 5e-3, ("fwd", "bf16"): 3e-2, ("bwd", "fp16"): 1e-2, ("bwd", "bf16"): 4e-2}
FORWARD_IMPLS = ("fa2", "cudnn", "ours")
BACKWARD_IMPLS = ("fa2", "cudnn", "ours", "ours_det")
CSV_COLUMNS = ("sweep", "variant", "dtype", "batch", "heads", "seqlen", "head_dim", "causal", "pass", "impl", "time_ms",
               "tflops", "ratio_vs_fa2", "ratio_vs_cudnn", "max_rel_err", "status", "device", "date")


def load_ours():
    """The flashattn package, or the reason it cannot be used."""
    try:
        import flashattn
        if not flashattn.cuda_available():
            return None, "flashattn imported but its CUDA backend is not available"
        return flashattn, ""
    except Exception as error:  # ImportError, a missing symbol in the native module, ...
        return None, f"import flashattn failed: {error}"


class Problem:
    """One benchmark point: the same random inputs in both layouts."""

    def __init__(self, batch, heads, seqlen, head_dim, dtype, causal, dropout_p=0.0, alibi=False):
        self.batch, self.heads, self.seqlen, self.head_dim = batch, heads, seqlen, head_dim
        self.dtype, self.causal = dtype, causal
        self.dropout_p = dropout_p
        # ALiBi's geometric slopes 2^(-8 h / heads).
        self.alibi_slopes = (torch.exp2(-8.0 * torch.arange(1, heads + 1, device="cuda") / heads).float()
                             if alibi else None)
        shape = (batch, heads, seqlen, head_dim)
        self.q, self.k, self.v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
        self.dout = torch.randn(shape, device="cuda", dtype=dtype)

    def forward_flops(self):
        flops = 4.0 * self.batch * self.heads * self.seqlen * self.seqlen * self.head_dim
        return flops / 2 if self.causal else flops


def to_flash_layout(x):
    """[B, H, N, d] -> [B, N, H, d], contiguous (outside any timed region)."""
    return x.transpose(1, 2).contiguous()


class Implementation:
    """forward(q, k, v) in SDPA layout -> out in SDPA layout; inputs converted once in prepare()."""

    def __init__(self, name, ours_module):
        self.name = name
        self.ours = ours_module
        self.backend = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}.get(name)

    def context(self):
        return sdpa_kernel(self.backend) if self.backend is not None else _null_context()

    def prepare(self, problem, requires_grad):
        """Inputs in this implementation's layout, leaf tensors when gradients are wanted."""
        tensors = (problem.q, problem.k, problem.v)
        if self.backend is None:
            tensors = tuple(to_flash_layout(t) for t in tensors)
        else:
            tensors = tuple(t.clone() for t in tensors) if requires_grad else tensors
        if requires_grad:
            tensors = tuple(t.detach().requires_grad_() for t in tensors)
        return tensors

    def forward(self, problem, q, k, v):
        if self.backend is not None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=problem.causal, dropout_p=problem.dropout_p)
        if self.name in FORCED_ALGORITHM_IMPLS:
            variants = {} if self.name.endswith("_plain") else {"alibi_slopes": problem.alibi_slopes,
                                                                  "dropout_p": problem.dropout_p}
            return forward_with_algorithm(self.ours, q, k, v, problem.causal, FORCED_ALGORITHM_IMPLS[self.name],
                                          **variants)
        deterministic = self.name == "ours_det"
        if self.name == "ours_plain":
            return self.ours.flash_attn_func(q, k, v, causal=problem.causal)
        return self.ours.flash_attn_func(q, k, v, causal=problem.causal, deterministic=deterministic,
                                         dropout_p=problem.dropout_p, alibi_slopes=problem.alibi_slopes)

    def to_sdpa_layout(self, x):
        return x if self.backend is not None else x.transpose(1, 2)

    def dout_for(self, problem):
        return problem.dout if self.backend is not None else to_flash_layout(problem.dout)


# Forward-only series that force one CUDA kernel of ours (the default "ours" runs
# algorithm "automatic"): ours_flash2 = the mma.sync kernel, ours_flash3 = the Hopper kernel,
# with --alibi/--dropout like "ours"; the *_plain ones without them (the cost, as ours_plain).
FORCED_ALGORITHM_IMPLS = {"ours_flash2": "flash2", "ours_flash3": "flash3",
                          "ours_flash2_plain": "flash2", "ours_flash3_plain": "flash3"}


def forward_with_algorithm(ours, q, k, v, causal, algorithm, alibi_slopes=None, dropout_p=0.0):
    """flash_attn_func's forward (output allocated per call, like every other series) with a forced algorithm."""
    out = torch.empty_like(q)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), device=q.device, dtype=torch.float32)
    ours._C.forward(q, k, v, out, lse, None, None, 0, 0, None, causal, -1, -1, 0.0, algorithm, 0,
                    torch.cuda.current_stream().cuda_stream, alibi_slopes=alibi_slopes, dropout_p=dropout_p)
    return out


class _null_context:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def relative_error(x, anchor):
    scale = anchor.float().abs().max().item()
    return (x.float() - anchor.float()).abs().max().item() / (scale if scale > 0 else 1.0)


def bench(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def check_against(anchor, value, pass_name, problem):
    """(max_rel_err, status) of value against the anchor; status None when it may be timed."""
    if problem.dropout_p > 0 or problem.alibi_slopes is not None:
        return math.nan, None  # masks/biases differ between implementations: timed, not compared
    if anchor is None:
        return math.nan, "unchecked (no anchor available; not timed)"
    values = value if isinstance(value, tuple) else (value,)
    anchors = anchor if isinstance(anchor, tuple) else (anchor,)
    error = max(relative_error(x, a) for x, a in zip(values, anchors))
    tolerance = TOLERANCE[(pass_name, dtype_name(problem.dtype))]
    if not error <= tolerance:
        return error, f"WRONG (rel err {error:.3g} > {tolerance:g}; not timed)"
    return error, None


def run_forward(impl, problem, anchor_out, is_reference):
    """(time_ms, max_rel_err, status, out in SDPA layout)."""
    q, k, v = impl.prepare(problem, requires_grad=False)
    with impl.context():
        out = impl.forward(problem, q, k, v)
        torch.cuda.synchronize()
        out_sdpa = impl.to_sdpa_layout(out)
        error, status = (0.0, None) if is_reference else check_against(anchor_out, out_sdpa, "fwd", problem)
        if status is not None:
            return math.nan, error, status, out_sdpa
        time_ms = bench(lambda: impl.forward(problem, q, k, v))
    return time_ms, error, "ok (reference)" if is_reference else "ok", out_sdpa


def run_backward(impl, problem, anchor_grads, is_reference):
    """(time_ms, max_rel_err over dq/dk/dv, status, grads in SDPA layout)."""
    q, k, v = impl.prepare(problem, requires_grad=True)
    with impl.context():
        out = impl.forward(problem, q, k, v)
    dout = impl.dout_for(problem)
    grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()
    grads_sdpa = tuple(impl.to_sdpa_layout(g) for g in grads)
    error, status = (0.0, None) if is_reference else check_against(anchor_grads, grads_sdpa, "bwd", problem)
    if status is not None:
        return math.nan, error, status, grads_sdpa
    time_ms = bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    return time_ms, error, "ok (reference)" if is_reference else "ok", grads_sdpa


def dtype_name(dtype):
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]


def short_error(error):
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text[:200]


def measure_point(pass_name, impls, problem, ours_module, ours_reason):
    """Rows (dicts) for every implementation at one point; anchors first."""
    results = {}
    anchor = None
    for name in impls:
        row = {"impl": name, "time_ms": math.nan, "max_rel_err": math.nan}
        if name.startswith("ours") and ours_module is None:
            row["status"] = f"unavailable ({ours_reason})"
            results[name] = row
            continue
        impl = Implementation(name, ours_module)
        # The first anchor that runs is the reference every later implementation is checked against.
        is_reference = anchor is None and name in ("fa2", "cudnn")
        try:
            run = run_forward if pass_name == "fwd" else run_backward
            time_ms, error, status, value = run(impl, problem, anchor, is_reference)
            row.update(time_ms=time_ms, max_rel_err=error, status=status)
            if is_reference:
                anchor = value
        except Exception as error:  # any failure is a result, not a crash
            row["status"] = f"unavailable ({short_error(error)})"
            if isinstance(error, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
        results[name] = row
    flops = problem.forward_flops() * (2.5 if pass_name == "bwd" else 1.0)
    for row in results.values():
        row["tflops"] = flops / (row["time_ms"] * 1e-3) / 1e12 if row["time_ms"] == row["time_ms"] else math.nan
    for row in results.values():
        for anchor_name, column in (("fa2", "ratio_vs_fa2"), ("cudnn", "ratio_vs_cudnn")):
            anchor_time = results.get(anchor_name, {}).get("time_ms", math.nan)
            row[column] = anchor_time / row["time_ms"] if row["time_ms"] == row["time_ms"] else math.nan
    return [results[name] for name in impls]


def write_csv(path, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: (f"{row[key]:.6g}" if isinstance(row[key], float) else row[key])
                             for key in CSV_COLUMNS})


def plot(path, rows, pass_name, device, date):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as error:
        print(f"plot skipped: {short_error(error)}")
        return
    panels = sorted({(row["sweep"], row["causal"]) for row in rows}, key=lambda p: (list(SWEEPS).index(p[0]), p[1]))
    if not panels:
        return
    columns = min(4, len(panels))
    rows_of_panels = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(rows_of_panels, columns, figsize=(4.2 * columns, 3.4 * rows_of_panels), squeeze=False)
    for axis, (sweep, causal) in zip(axes.flat, panels):
        selected = [r for r in rows if r["sweep"] == sweep and r["causal"] == causal]
        for impl in dict.fromkeys(r["impl"] for r in selected):
            points = [(r["seqlen"], r["tflops"]) for r in selected if r["impl"] == impl and r["tflops"] == r["tflops"]]
            if points:
                axis.plot(*zip(*points), marker="o", label=impl)
        first = selected[0]
        axis.set_title(f"{sweep} {first['dtype']} d{first['head_dim']} {'causal' if causal else 'full'}", fontsize=9)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("seqlen")
        axis.set_ylabel("TFLOP/s")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(panels):]:
        axis.axis("off")
    title = "forward" if pass_name == "fwd" else "backward (2.5x forward FLOPs)"
    figure.suptitle(f"Attention {title} — {device} — {date}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def print_table(rows):
    header = f"{'sweep':9} {'dtype':5} {'B':>3} {'H':>3} {'N':>6} {'d':>4} {'causal':6} {'pass':4} {'impl':9} " \
             f"{'ms':>9} {'TFLOP/s':>8} {'/fa2':>6} {'/cudnn':>6}  status"
    print(header)
    for r in rows:
        print(f"{r['sweep']:9} {r['dtype']:5} {r['batch']:>3} {r['heads']:>3} {r['seqlen']:>6} {r['head_dim']:>4} "
              f"{str(r['causal']):6} {r['pass']:4} {r['impl']:9} {r['time_ms']:9.4f} {r['tflops']:8.1f} "
              f"{r['ratio_vs_fa2']:6.2f} {r['ratio_vs_cudnn']:6.2f}  {r['status']}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweeps", default=",".join(SWEEPS), help="comma list of " + ", ".join(SWEEPS))
    parser.add_argument("--passes", default="fwd", help="comma list of fwd, bwd")
    parser.add_argument("--backward", action="store_true", help="add the backward pass (same as --passes fwd,bwd)")
    parser.add_argument("--causal", choices=("both", "true", "false"), default="both")
    parser.add_argument("--impls", default="", help="comma list (default: fa2,cudnn,ours[,ours_det for bwd])")
    parser.add_argument("--seqlens", default="", help="comma list overriding every sweep's sequence lengths")
    parser.add_argument("--quick", action="store_true", help=f"seqlens {QUICK_SEQLENS} only")
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results"))
    parser.add_argument("--prefix", default="gpu_", help="file name prefix of the CSV/PNG outputs")
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout probability of every implementation")
    parser.add_argument("--alibi", action="store_true", help="ours with ALiBi slopes (anchors without)")
    args = parser.parse_args()

    passes = [p for p in args.passes.split(",") if p]
    if args.backward and "bwd" not in passes:
        passes.append("bwd")
    sweeps = [s for s in args.sweeps.split(",") if s]
    for name in sweeps:
        if name not in SWEEPS:
            parser.error(f"unknown sweep {name}")
    for name in passes:
        if name not in ("fwd", "bwd"):
            parser.error(f"unknown pass {name}")
    causal_values = {"both": (False, True), "true": (True,), "false": (False,)}[args.causal]

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark")
        return 1
    device = torch.cuda.get_device_name()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    ours_module, ours_reason = load_ours()
    print(f"device {device}, date {date}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"ours: {'flashattn ' + ours_module.__version__ if ours_module else 'unavailable (' + ours_reason + ')'}",
          flush=True)
    os.makedirs(args.out_dir, exist_ok=True)

    all_rows = []
    for pass_name in passes:
        impls = [i for i in args.impls.split(",") if i] or list(FORWARD_IMPLS if pass_name == "fwd" else BACKWARD_IMPLS)
        rows = []
        for sweep in sweeps:
            dtype_label, seqlens = SWEEPS[sweep]
            if args.seqlens:
                seqlens = tuple(int(n) for n in args.seqlens.split(","))
            elif args.quick:
                seqlens = QUICK_SEQLENS
            for batch, heads, seqlen, head_dim in sweep_points(sweep, seqlens):
                for causal in causal_values:
                    torch.manual_seed(seqlen * 1000 + head_dim + causal)
                    try:
                        problem = Problem(batch, heads, seqlen, head_dim, DTYPES[dtype_label], causal, args.dropout,
                                          args.alibi)
                        measured = measure_point(pass_name, impls, problem, ours_module, ours_reason)
                    except Exception as error:
                        traceback.print_exc()
                        measured = [{"impl": i, "time_ms": math.nan, "tflops": math.nan, "ratio_vs_fa2": math.nan,
                                     "ratio_vs_cudnn": math.nan, "max_rel_err": math.nan,
                                     "status": f"unavailable ({short_error(error)})"} for i in impls]
                    finally:
                        problem = None
                        torch.cuda.empty_cache()
                    for row in measured:
                        variant = "+".join(v for v, on in ((f"dropout{args.dropout:g}", args.dropout > 0),
                                                           ("alibi", args.alibi)) if on) or "none"
                        row.update(sweep=sweep, variant=variant, dtype=dtype_label, batch=batch, heads=heads, seqlen=seqlen,
                                   head_dim=head_dim, causal=causal, device=device, date=date)
                        row["pass"] = pass_name
                        rows.append(row)
                    for row in rows[-len(measured):]:
                        print(f"  {sweep} N={seqlen} d={head_dim} causal={causal} {pass_name} {row['impl']:9} "
                              f"{row['time_ms']:.4f} ms {row['tflops']:.1f} TFLOP/s  err {row['max_rel_err']:.2e}  "
                              f"{row['status']}", flush=True)
        stem = os.path.join(args.out_dir, f"{args.prefix}{'forward' if pass_name == 'fwd' else 'backward'}")
        write_csv(stem + ".csv", rows)
        plot(stem + ".png", rows, pass_name, device, date)
        print(f"wrote {stem}.csv and {stem}.png", flush=True)
        all_rows.extend(rows)

    print()
    print(f"summary — {device} — {date}")
    print_table(all_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
