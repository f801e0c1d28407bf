#!/usr/bin/env python3
"""Mask benchmark (issue 15): ours against FlexAttention, SDPA with a dense boolean
mask and cuDNN with an additive bias, forward and backward - one process, the same
inputs, the same timer and the same checks for every contender.

The masks of the issue's table (top-left aligned, as PyTorch and FlexAttention):
  none, causal, window (sliding window of 1024 keys, causal), document (document-causal:
  8 documents of random length packed in one sequence, the same for every batch item),
and a density sweep: random block masks (128 x 128 blocks, every listed block full, the
diagonal always kept so no row is empty) at 5%-100% of the blocks, where the time should
be linear in the density (seed 003).

Contenders (SDPA layout [batch, heads, seqlen, head_dim] for every one of them):
  ours            flashattn.scaled_dot_product_attention(..., block_mask=) with the built-in
                  element rule (block_mask_from_rule: band / document ids, no bit mask); the
                  sweep's whole-block masks through block_mask_from_dense;
  ours_torch      the same call given torch's BlockMask as it is (partial blocks as bits);
  ours_dense      flashattn.scaled_dot_product_attention(..., attn_mask=<dense bool>): the mask
                  converted to block-sparse form on the GPU at every call (the conversion is
                  in the time), beside cudnn_bias, the dense-mask goal of the issue;
  ours_dense_raw  the same dense bool mask read by the kernels as it is (the conversion
                  turned off): what the conversion buys;
  ours_dense_cxx  the same dense bool mask given to the C++ API as it is (the Python
                  conversion off) with FLASHATTN_DENSE_MASK=blocks: the library's own device
                  conversion (src/cuda/masks, at the kernel's tiles) in the time - what a C++
                  caller gets;
  flex            torch.compile(flex_attention) with torch's create_block_mask (the anchor);
  sdpa_dense      F.scaled_dot_product_attention(attn_mask=<dense bool>) (efficient backend);
  cudnn_bias      F.scaled_dot_product_attention(attn_mask=<additive 0/-inf bias>) on cuDNN.

Method, identical for every contender:
  - inputs: one set of torch.randn q, k, v, dout (bf16) shared by all;
  - forward: the call under torch.no_grad(); backward: the backward pass alone,
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) of an output made once
    (its residuals saved), as shared/BENCHMARKS.md;
  - timer: triton.testing.do_bench(warmup=25, rep=100, median) - CUDA events, L2 flushed
    before each run;
  - check before timing: the allocator's free blocks are filled with NaN first (poisoned,
    so an element a contender leaves unwritten cannot inherit another contender's
    answer), then the result must be finite and within TOLERANCE of the anchor (flex, or
    the first contender that ran); the result of the last timed call is checked too, so
    the timed calls did the work. A wrong result is recorded and not timed; a contender
    that raises is recorded as unavailable with its error, never a crash;
  - FLOPs count the allowed elements only (4·d per allowed score forward, 2.5x that
    backward), as the issue's table.

  python3 bench/gpu/bench_masks.py                     # table + density sweep, fwd + bwd
  python3 bench/gpu/bench_masks.py --quick             # a small smoke run (~1 min)
  python3 bench/gpu/bench_masks.py --masks causal,document --passes bwd --densities=
  python3 bench/gpu/bench_masks.py --densities=; python3 bench/gpu/bench_masks.py --masks= --append
Writes <out-dir>/gpu_masks.csv and gpu_masks.png (--quick: gpu_masks_quick.*), the CSV
rewritten after every mask so a run cut short keeps what it measured.
"""

import argparse
import contextlib
import csv
import datetime
import math
import os
import sys
import time
import traceback

TOLERANCE = {"fwd": 3e-2, "bwd": 5e-2}  # bf16 relative error (max|x - anchor| / max|anchor|)
CSV_COLUMNS = ("mask", "target_density", "density", "batch", "heads", "seqlen", "head_dim", "pass", "impl",
               "time_ms", "tflops", "ratio_vs_flex", "ratio_vs_cudnn_bias", "max_rel_err", "status", "device", "date")
ALL_IMPLS = "flex,ours,ours_torch,ours_dense,ours_dense_raw,ours_dense_cxx,sdpa_dense,cudnn_bias"
FULL = dict(batch=8, heads=16, seqlen=4096, head_dim=128, masks="none,causal,window,document",
            densities="0.05,0.1,0.25,0.5,0.75,1.0", warmup=25, rep=100)
QUICK = dict(batch=1, heads=4, seqlen=1024, head_dim=128, masks="causal,document", densities="0.1,0.5,1.0",
             warmup=5, rep=20)

torch = F = None  # imported in main(), so that --help needs neither torch nor a GPU


def document_ids(seqlen, documents, seed):
    """Document id per token: `documents` documents of random lengths (>= 1) in one sequence."""
    generator = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(seqlen - 1, generator=generator)[: documents - 1].sort().values + 1
    ids = torch.zeros(seqlen, dtype=torch.int32)
    ids[cuts] = 1
    return ids.cumsum(0).to(torch.int32)


class MaskCase:
    """One mask: torch mask_mod, our rule arguments, the dense boolean mask [1, 1, N, N]."""

    def __init__(self, name, seqlen, device, dtype, density=None, window=1024, seed=0):
        self.name, self.target_density, self.seqlen = name, density, seqlen
        n = seqlen
        rows = torch.arange(n, device=device)[:, None]
        cols = torch.arange(n, device=device)[None, :]
        self.rule = {}
        if name == "none":
            self.mask_mod = lambda b, h, q, kv: q >= 0
            dense = torch.ones(n, n, dtype=torch.bool, device=device)
        elif name == "causal":
            self.mask_mod = lambda b, h, q, kv: q >= kv
            self.rule = {"causal": True}
            dense = rows >= cols
        elif name == "window":
            self.mask_mod = lambda b, h, q, kv: (q >= kv) & (q - kv <= window)
            self.rule = {"window": (window, 0)}
            dense = (rows >= cols) & (rows - cols <= window)
        elif name == "document":
            docs = document_ids(n, 8, seed).to(device)
            self.mask_mod = lambda b, h, q, kv: (docs[q] == docs[kv]) & (q >= kv)
            self.rule = {"causal": True, "q_document_ids": docs[None], "k_document_ids": docs[None]}
            dense = (docs[:, None] == docs[None, :]) & (rows >= cols)
        elif name == "density":
            blocks = (n + 127) // 128
            generator = torch.Generator().manual_seed(seed)
            keep = torch.rand(blocks, blocks, generator=generator) < density
            keep[torch.arange(blocks), torch.arange(blocks)] = True  # no empty row
            block_allowed = keep.to(device)
            self.mask_mod = lambda b, h, q, kv: block_allowed[q // 128, kv // 128]
            dense = keep.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :n].to(device)
        else:
            raise ValueError(f"unknown mask {name!r}")
        self.dense = dense[None, None].contiguous()
        self.allowed = int(dense.sum().item())
        self.bias = torch.zeros(self.dense.shape, dtype=dtype, device=device).masked_fill(~self.dense, float("-inf"))


class _DenseMaskReadAsItIs:
    """Turns off flashattn's conversion of a dense boolean mask while active."""

    def __init__(self, flashattn):
        from flashattn import sdpa

        self.sdpa, self.saved = sdpa, sdpa._CONVERT_MIN_LENGTH

    def __enter__(self):
        self.sdpa._CONVERT_MIN_LENGTH = 1 << 40

    def __exit__(self, *exc):
        self.sdpa._CONVERT_MIN_LENGTH = self.saved
        return False


class _LibraryDenseMaskBlocks:
    """The library's own dense-mask conversion while active (FLASHATTN_DENSE_MASK=blocks,
    which the library reads once per process, forced through its test hook)."""

    def __init__(self, flashattn):
        self.native = flashattn._C

    def __enter__(self):
        self.native._set_dense_mask_conversion(1)

    def __exit__(self, *exc):
        self.native._set_dense_mask_conversion(-1)
        return False


def make_series(name, flashattn, case, device):
    """forward(q, k, v) -> out for one contender, or raises why it cannot run."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    n = case.seqlen
    if name == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        compiled = torch.compile(flex_attention)
        block_mask = create_block_mask(case.mask_mod, None, None, n, n, device=device)
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
        raise RuntimeError("flashattn is not importable or has no usable backend for this device")
    if name == "ours_dense":
        return lambda q, k, v: flashattn.scaled_dot_product_attention(q, k, v, attn_mask=case.dense)
    if name == "ours_dense_raw":
        raw = _DenseMaskReadAsItIs(flashattn)

        def run(q, k, v):
            with raw:
                return flashattn.scaled_dot_product_attention(q, k, v, attn_mask=case.dense)
        return run
    if name == "ours_dense_cxx":  # run_contender sets FLASHATTN_DENSE_MASK=blocks around fwd and bwd
        raw = _DenseMaskReadAsItIs(flashattn)

        def run(q, k, v):
            with raw:
                return flashattn.scaled_dot_product_attention(q, k, v, attn_mask=case.dense)
        return run
    if name == "ours_torch":
        from torch.nn.attention.flex_attention import create_block_mask

        block_mask = create_block_mask(case.mask_mod, None, None, n, n, device=device)
        return lambda q, k, v: flashattn.scaled_dot_product_attention(q, k, v, block_mask=block_mask)
    if name == "ours":
        if case.name == "density":
            block_mask = flashattn.block_mask_from_dense(case.dense)  # whole blocks: every listed block is full
        else:
            block_mask = flashattn.block_mask_from_rule(None, None, n, n, **case.rule).to(device)
        return lambda q, k, v: flashattn.scaled_dot_product_attention(q, k, v, block_mask=block_mask)
    raise ValueError(f"unknown contender {name!r}")


def relative_error(x, anchor):
    scale = anchor.float().abs().max().item()
    return (x.float() - anchor.float()).abs().max().item() / (scale if scale > 0 else 1.0)


def poison_free_memory(like, count=6):
    """Fill blocks of the caching allocator with NaN and free them, so the next outputs
    of these sizes most likely land on NaN memory instead of an earlier contender's
    result (an unwritten element then shows as non-finite)."""
    blocks = [torch.full(like.shape, float("nan"), dtype=like.dtype, device=like.device) for _ in range(count)]
    blocks += [torch.full(like.shape[:3], float("nan"), dtype=torch.float32, device=like.device)
               for _ in range(count)]  # LSE-sized
    del blocks


class Timer:
    """The same timer for every contender: do_bench (CUDA events, median) on a GPU; on
    the CPU (--device cpu, a smoke test of this script only) a wall-clock median."""

    def __init__(self, device, warmup, rep):
        self.device, self.warmup, self.rep = device, warmup, rep

    def __call__(self, fn):
        if self.device == "cuda":
            from triton.testing import do_bench

            return do_bench(fn, warmup=self.warmup, rep=self.rep, return_mode="median")
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return sorted(times)[1]


def measure(forward, inputs, dout, pass_name, timer):
    """(checked value, last timed value, time_ms): values are out (fwd) or (dq, dk, dv)
    (bwd). The checked value is computed on poisoned memory before the timing."""
    last = {}
    if pass_name == "fwd":
        with torch.no_grad():
            poison_free_memory(inputs[0])
            value = (forward(*inputs),)

            def run():
                last["value"] = forward(*inputs)

            time_ms = timer(run)
        return value, (last["value"],), time_ms
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = forward(*leaves)
    poison_free_memory(inputs[0])
    value = torch.autograd.grad(out, leaves, dout, retain_graph=True)

    def run():
        last["value"] = torch.autograd.grad(out, leaves, dout, retain_graph=True)

    time_ms = timer(run)
    return value, last["value"], time_ms


def check(values, anchor, pass_name):
    """(max relative error vs the anchor or nan, problem or None)."""
    for x in values:
        if not torch.isfinite(x).all().item():
            return math.nan, "non-finite elements (unwritten or NaN)"
    if anchor is None:
        return math.nan, None
    error = max(relative_error(x, a) for x, a in zip(values, anchor))
    if not error <= TOLERANCE[pass_name]:
        return error, f"rel err {error:.3g} > {TOLERANCE[pass_name]:g}"
    return error, None


def short(exc):
    text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"


def run_contender(impl, flashattn, case, inputs, dout, pass_name, timer, anchor):
    """(row fields, values or None): one contender on one (mask, pass)."""
    library = _LibraryDenseMaskBlocks(flashattn) if impl == "ours_dense_cxx" else contextlib.nullcontext()
    try:
        with library:
            forward = make_series(impl, flashattn, case, inputs[0].device.type)
            values, last_values, time_ms = measure(forward, inputs, dout, pass_name, timer)
    except Exception as exc:  # noqa: BLE001 - an unavailable contender is a row, not a crash
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # an OOM must not starve the next contender
        return dict(time_ms=math.nan, error=math.nan, status=f"unavailable: {short(exc)}"), None
    error, problem = check(values, anchor, pass_name)
    if problem is None:
        _, problem_last = check(last_values, values, pass_name)
        if problem_last is not None:
            problem = f"the timed calls' result differs from the checked one: {problem_last}"
    if problem is not None:
        return dict(time_ms=math.nan, error=error, status=f"WRONG ({problem}; not timed)"), None
    return dict(time_ms=time_ms, error=error, status="ok (anchor)" if anchor is None else "ok"), values


def number(x, digits):
    return "nan" if x != x else f"{x:.{digits}f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, help=f"default {FULL['batch']} ({QUICK['batch']} with --quick)")
    parser.add_argument("--heads", type=int, help=f"default {FULL['heads']} ({QUICK['heads']} with --quick)")
    parser.add_argument("--seqlen", type=int, help=f"default {FULL['seqlen']} ({QUICK['seqlen']} with --quick)")
    parser.add_argument("--head-dim", type=int, help=f"default {FULL['head_dim']}")
    parser.add_argument("--masks", help=f"comma list of none,causal,window,document (default {FULL['masks']}; "
                                        f"{QUICK['masks']} with --quick)")
    parser.add_argument("--densities", help=f"block densities of the sweep, empty = no sweep (default "
                                            f"{FULL['densities']}; {QUICK['densities']} with --quick)")
    parser.add_argument("--impls", default=ALL_IMPLS, help=f"contenders, the first that runs is the anchor "
                                                           f"(default {ALL_IMPLS})")
    parser.add_argument("--passes", default="fwd,bwd", help="fwd, bwd or both (default fwd,bwd)")
    parser.add_argument("--warmup", type=int, help="do_bench warmup in ms (default 25; 5 with --quick)")
    parser.add_argument("--rep", type=int, help="do_bench repetition time in ms (default 100; 20 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a small smoke run: B1 H4 N1024, two masks, three "
                                                             "densities, short timing; writes gpu_masks_quick.*")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a smoke test of this script on CPU tensors (flashattn's CPU backend, "
                             "wall-clock timer, meaningless numbers); default cuda")
    parser.add_argument("--out-dir", default="bench/results")
    parser.add_argument("--append", action="store_true",
                        help="keep the rows already in the CSV except those measured again (same mask, density, "
                             "pass, contender and shape): one table from several shorter runs")
    args = parser.parse_args()
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    global torch, F
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as exc:
        sys.exit(f"bench_masks: needs PyTorch ({exc})")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_masks: no CUDA device visible to torch (use --device cpu for a smoke test of the script)")
    try:
        import flashattn
        if args.device == "cuda" and not flashattn.cuda_available():
            print("bench_masks: flashattn has no CUDA backend: its contenders are recorded as unavailable")
            flashattn = None
    except Exception as exc:  # noqa: BLE001 - reported, its series recorded as unavailable
        print(f"bench_masks: flashattn not importable ({short(exc)}): its contenders are recorded as unavailable")
        flashattn = None

    # Every (mask, pass) compiles flex_attention anew (its mask_mod and grad mode are in the
    # graph): past dynamo's recompile limit (8) it would fall back to eager flex_attention,
    # the materialising reference, and "flex" would time that.
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 1024)
    for limit in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 4096)

    # The backward is timed by repeated autograd.grad(..., retain_graph=True) of one saved
    # output (the same for every contender). AOTAutograd's donated buffers forbid that for
    # compiled functions ("requires retain_graph=False"): Flex's backward was unavailable
    # on some masks without this switch.
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "donated_buffer"):
        functorch_config.donated_buffer = False

    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    date = datetime.date.today().isoformat()
    timer = Timer(args.device, args.warmup, args.rep)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    torch.manual_seed(0)
    shape = (args.batch, args.heads, args.seqlen, args.head_dim)
    inputs = tuple(torch.randn(shape, device=args.device, dtype=dtype) for _ in range(3))
    dout = torch.randn(shape, device=args.device, dtype=dtype)
    specs = [(name, None) for name in listed(args.masks)]
    specs += [("density", float(d)) for d in listed(args.densities)]
    impls = listed(args.impls)
    passes = listed(args.passes)
    suffix = "_quick" if args.quick else ""
    os.makedirs(args.out_dir, exist_ok=True)
    csv_path = os.path.join(args.out_dir, f"gpu_masks{suffix}.csv")
    kept = []
    if args.append and os.path.exists(csv_path):
        with open(csv_path, newline="") as f:
            kept = [{column: row.get(column) or "" for column in CSV_COLUMNS} for row in csv.DictReader(f)]
    print(f"bench_masks: {device}, bf16 B{args.batch} H{args.heads} N{args.seqlen} d{args.head_dim}, "
          f"do_bench({args.warmup}, {args.rep}), contenders {','.join(impls)}", flush=True)
    rows = []
    for name, density in specs:
        try:
            case = MaskCase(name, args.seqlen, args.device, dtype, density=density)
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: mask not built ({short(exc)}); skipped", flush=True)
            continue
        allowed_fraction = case.allowed / args.seqlen ** 2
        for pass_name in passes:
            flops = 4.0 * args.batch * args.heads * case.allowed * args.head_dim * (2.5 if pass_name == "bwd" else 1.0)
            anchor, results = None, {}
            for impl in impls:
                result, values = run_contender(impl, flashattn, case, inputs, dout, pass_name, timer, anchor)
                if anchor is None and values is not None:
                    anchor = values
                results[impl] = result
            flex_ms = results.get("flex", {}).get("time_ms", math.nan)
            cudnn_ms = results.get("cudnn_bias", {}).get("time_ms", math.nan)
            for impl in impls:
                result = results[impl]
                time_ms = result["time_ms"]
                row = {"mask": name, "target_density": "" if density is None else f"{density:g}",
                       "density": f"{allowed_fraction:.4f}", "batch": args.batch, "heads": args.heads,
                       "seqlen": args.seqlen, "head_dim": args.head_dim, "pass": pass_name, "impl": impl,
                       "time_ms": number(time_ms, 4), "tflops": number(flops / (time_ms * 1e-3) / 1e12, 1),
                       "ratio_vs_flex": number(flex_ms / time_ms, 3),
                       "ratio_vs_cudnn_bias": number(cudnn_ms / time_ms, 3),
                       "max_rel_err": f"{result['error']:.3g}", "status": result["status"], "device": device,
                       "date": date}
                rows.append(row)
                print(f"{name:9s} {row['target_density']:>5s} {row['density']:>7s} {pass_name} {impl:15s} "
                      f"{row['time_ms']:>9s} ms {row['tflops']:>7s} TF/s  x{row['ratio_vs_flex']:>6s} vs flex  "
                      f"x{row['ratio_vs_cudnn_bias']:>6s} vs cudnn_bias  {row['status']}", flush=True)
        table = merged(kept, rows)
        with open(csv_path, "w", newline="") as f:  # after every mask: a run cut short keeps its rows
            writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            writer.writeheader()
            writer.writerows(table)
    print("wrote", csv_path)
    plot(merged(kept, rows), os.path.join(args.out_dir, f"gpu_masks{suffix}.png"))


def listed(text):
    """The names of a comma list; empty (also '""' from an unquoting shell variable) = none."""
    return [name for name in text.strip("\"'").split(",") if name.strip("\"' ")]


def merged(kept, rows):
    """The kept rows less those measured again, then the new rows."""
    key = lambda r: tuple(str(r[c]) for c in ("mask", "target_density", "batch", "heads", "seqlen", "head_dim",  # noqa: E731
                                              "pass", "impl"))
    measured = {key(r) for r in rows}
    return [r for r in kept if key(r) not in measured] + rows


def as_float(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    passes = sorted({r["pass"] for r in rows}, reverse=True)  # fwd, bwd
    if not passes:
        print("no rows: no plot")
        return
    figure, axes = plt.subplots(2, len(passes), figsize=(7 * len(passes), 8), squeeze=False)
    for column, pass_name in enumerate(passes):
        table = [r for r in rows if r["pass"] == pass_name and r["mask"] != "density"]
        masks = list(dict.fromkeys(r["mask"] for r in table))
        impls = list(dict.fromkeys(r["impl"] for r in table))
        axis = axes[0][column]
        width = 0.8 / max(1, len(impls))
        for i, impl in enumerate(impls):
            values = [next((as_float(r["tflops"]) for r in table if r["mask"] == m and r["impl"] == impl), math.nan)
                      for m in masks]
            axis.bar([x + i * width for x in range(len(masks))], [0 if v != v else v for v in values], width,
                     label=impl)
        axis.set_xticks([x + width * (len(impls) - 1) / 2 for x in range(len(masks))], masks)
        axis.set_ylabel("TFLOP/s (allowed entries)")
        axis.set_title(f"{pass_name}: masks (0 = unavailable or wrong)", fontsize=9)
        if impls:
            axis.legend(fontsize=7, ncol=2)
        sweep = [r for r in rows if r["pass"] == pass_name and r["mask"] == "density"]
        axis = axes[1][column]
        for impl in dict.fromkeys(r["impl"] for r in sweep):
            points = sorted((as_float(r["density"]), as_float(r["time_ms"])) for r in sweep
                            if r["impl"] == impl and as_float(r["time_ms"]) == as_float(r["time_ms"]))
            if points:
                axis.plot(*zip(*points), marker="o", label=impl)
        axis.set_xlabel("density (allowed fraction of the score matrix)")
        axis.set_ylabel("time (ms)")
        axis.set_title(f"{pass_name}: block density sweep (linear = time follows the visited blocks)", fontsize=9)
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7, ncol=2)
    first = rows[0]
    figure.suptitle(f"masks B{first['batch']} H{first['heads']} N{first['seqlen']} d{first['head_dim']} "
                    f"(fwd; bwd = backward pass alone) - {first['device']} - {first['date']}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print("wrote", path)


if __name__ == "__main__":
    main()
