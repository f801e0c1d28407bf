#!/usr/bin/env python3
"""bench/cpu/compare_torch.py — our CPU forward beside PyTorch's CPU
scaled_dot_product_attention, same machine, same thread count, same run.

For each thread count and mask it runs our benchmark binary (bench/cpu/
cpu_forward_bench, float32) as a child process and PyTorch SDPA in this process
(torch.set_num_threads(N), inputs torch.randn [batch, heads, seqlen, head_dim]),
both as the median of --repeats timed runs after a warm-up. Both get the same
memory layout: our binary stores [batch, heads, seqlen, head_dim] too (--layout
bhsd) and passes flashattn strided [batch, seqlen, heads, head_dim] views of it;
--layout bshd times flashattn's native layout instead. FLOPs = 4*B*H*N*N*d, halved for causal (BENCHMARKS.md).

Writes --csv (both numbers and ours/torch), a PNG plot (--png, needs matplotlib),
and the peak RSS of our forward at --rss-seqlen (getrusage of a child process), so
memory that grew with seqlen^2 would show.

Example (on the 16-core host):
  cmake -S . -B build -G Ninja -DFLASHATTN_CUDA=OFF -DFLASHATTN_NATIVE=OFF && ninja -C build cpu_forward_bench
  python3 bench/cpu/compare_torch.py --bench-binary build/bench/cpu/cpu_forward_bench --threads 1,2,16
"""
import argparse
import csv
import os
import resource
import statistics
import subprocess
import sys
import time


def parse_int_list(text):
    return [int(x) for x in text.split(",") if x]


def flops(batch, heads, seqlen, head_dim, causal):
    return 4.0 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)


def run_ours(binary, args, seqlen, causal, threads):
    command = [binary, "--batch", str(args.batch), "--heads", str(args.heads), "--head-dim", str(args.head_dim),
               "--seqlens", str(seqlen), "--threads", str(threads), "--repeats", str(args.repeats),
               "--layout", args.layout]
    if causal:
        command.append("--causal")
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    if result.stderr.strip() and not getattr(run_ours, "said_kernels", False):
        print(result.stderr.strip())  # which vector kernels the binary chose
        run_ours.said_kernels = True
    rows = list(csv.DictReader(result.stdout.splitlines()))
    if len(rows) != 1:
        raise RuntimeError(f"unexpected output from {' '.join(command)}:\n{result.stdout}")
    return float(rows[0]["time_ms"])


def run_torch(torch, args, seqlen, causal, threads):
    torch.set_num_threads(threads)
    shape = (args.batch, args.heads, seqlen, args.head_dim)
    q, k, v = (torch.randn(shape, dtype=torch.float32) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with torch.no_grad():
        sdpa(q, k, v, is_causal=causal)  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            sdpa(q, k, v, is_causal=causal)
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def peak_rss_of_child(command):
    """Peak resident set of one child process, in MiB (a fresh interpreter runs it, so
    RUSAGE_CHILDREN holds this child alone)."""
    probe = ("import resource, subprocess, sys;"
             "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL);"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    output = subprocess.run([sys.executable, "-c", probe] + command, check=True, capture_output=True, text=True)
    return int(output.stdout.strip()) / 1024.0  # ru_maxrss is KiB on Linux


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib missing: no plot written to {path}", file=sys.stderr)
        return
    configs = sorted({(r["causal"], r["seqlen"]) for r in rows})
    thread_counts = sorted({r["threads"] for r in rows})
    figure, axes = plt.subplots(1, len(configs), figsize=(4.2 * len(configs), 4), squeeze=False)
    for axis, (causal, seqlen) in zip(axes[0], configs):
        ours = [next(r["ours_gflops"] for r in rows if (r["causal"], r["seqlen"], r["threads"]) == (causal, seqlen, t)) for t in thread_counts]
        theirs = [next(r["torch_gflops"] for r in rows if (r["causal"], r["seqlen"], r["threads"]) == (causal, seqlen, t)) for t in thread_counts]
        positions = range(len(thread_counts))
        axis.bar([p - 0.2 for p in positions], ours, width=0.4, label="flashattn flash2")
        axis.bar([p + 0.2 for p in positions], theirs, width=0.4, label="PyTorch SDPA")
        axis.set_xticks(list(positions), [f"{t} thr" for t in thread_counts])
        axis.set_title(f"N={seqlen} {'causal' if causal else 'full'}")
        axis.set_ylabel("GFLOP/s")
        axis.legend(fontsize=8)
    figure.suptitle("CPU forward, fp32, batch 1, 16 heads, head_dim 64")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench-binary", default="build/bench/cpu/cpu_forward_bench")
    parser.add_argument("--threads", type=parse_int_list, default=[1, 2, 16])
    parser.add_argument("--seqlens", type=parse_int_list, default=[1024, 4096])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layout", choices=["bhsd", "bshd"], default="bhsd",
                        help="memory layout of our inputs (bhsd = PyTorch's, the fair comparison)")
    parser.add_argument("--no-torch", action="store_true", help="ours only (no PyTorch on this machine)")
    parser.add_argument("--rss-seqlen", type=int, default=32768, help="0 = skip the memory measurement")
    parser.add_argument("--csv", default="bench/results/cpu_forward.csv")
    parser.add_argument("--png", default="bench/results/cpu_forward.png")
    parser.add_argument("--rss-csv", default="bench/results/cpu_forward_rss.csv")
    args = parser.parse_args()

    torch = None
    if not args.no_torch:
        import torch  # noqa: F811 — imported here so --no-torch works without it

    rows = []
    for threads in args.threads:
        for causal in (False, True):
            for seqlen in args.seqlens:
                work = flops(args.batch, args.heads, seqlen, args.head_dim, causal)
                ours_ms = run_ours(args.bench_binary, args, seqlen, causal, threads)
                torch_ms = run_torch(torch, args, seqlen, causal, threads) if torch else float("nan")
                row = {"threads": threads, "seqlen": seqlen, "causal": causal,
                       "ours_ms": ours_ms, "ours_gflops": work / (ours_ms * 1e6),
                       "torch_ms": torch_ms, "torch_gflops": work / (torch_ms * 1e6),
                       "ratio": torch_ms / ours_ms}
                rows.append(row)
                print(f"threads {threads:2d}  N {seqlen:6d}  {'causal' if causal else 'full  '}  "
                      f"ours {row['ours_gflops']:7.1f} GFLOP/s  torch {row['torch_gflops']:7.1f} GFLOP/s  "
                      f"ratio {row['ratio']:.2f}x", flush=True)

    os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
    with open(args.csv, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["threads", "seqlen", "causal", "ours_ms", "ours_gflops", "torch_ms", "torch_gflops", "ours_over_torch"])
        for r in rows:
            writer.writerow([r["threads"], r["seqlen"], int(r["causal"]), f"{r['ours_ms']:.3f}", f"{r['ours_gflops']:.2f}",
                             f"{r['torch_ms']:.3f}", f"{r['torch_gflops']:.2f}", f"{r['ratio']:.3f}"])
    if args.rss_seqlen > 0:
        threads = max(args.threads)
        command = [args.bench_binary, "--batch", str(args.batch), "--heads", str(args.heads), "--head-dim", str(args.head_dim),
                   "--seqlens", str(args.rss_seqlen), "--threads", str(threads), "--repeats", "1", "--causal"]
        rss = peak_rss_of_child(command)
        inputs_mib = 4 * args.batch * args.rss_seqlen * args.heads * args.head_dim * 4 / 2**20  # q, k, v, out (fp32)
        scores_mib = args.batch * args.heads * args.rss_seqlen ** 2 * 4 / 2**20  # one materialised fp32 S
        print(f"peak RSS at N={args.rss_seqlen}: {rss:.0f} MiB (q/k/v/out alone: {inputs_mib:.0f} MiB; "
              f"one N x N score matrix would be {scores_mib:.0f} MiB)")
        with open(args.rss_csv, "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["seqlen", "causal", "threads", "peak_rss_mib", "qkv_out_mib", "one_nxn_scores_mib"])
            writer.writerow([args.rss_seqlen, 1, threads, f"{rss:.1f}", f"{inputs_mib:.1f}", f"{scores_mib:.1f}"])
    plot(rows, args.png)
    print(f"wrote {args.csv}, {args.png}" + (f" and {args.rss_csv}" if args.rss_seqlen > 0 else ""))


if __name__ == "__main__":
    main()
