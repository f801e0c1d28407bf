"""Collects bench_attention.py's printed lines from several runs into one CSV (and a PNG).

The device returns a limited number of files per call, so a call that times several
configurations (environment switches, trees) may bring back only the harness logs; their
lines hold everything the per-run CSVs do. Usage:
  harness_logs_to_csv.py OUT.csv [--plot OUT.png] RUN=LOG [RUN=LOG ...]
RUN names the configuration (e.g. "bwd overlapped (default)"). The plot shows ours / cuDNN
per shape and pass for every run that timed cuDNN beside ours.
"""
import csv
import re
import sys

LINE = re.compile(r"^\s+(\S+) N=(\d+) d=(\d+) causal=(\w+) (fwd|bwd) (\S+)\s+([\d.]+) ms ([\d.]+) TFLOP/s")


def read_runs(pairs):
    rows = []
    header = ""
    for pair in pairs:
        run, path = pair.split("=", 1)
        for line in open(path):
            if line.startswith("device "):
                header = line.strip()
            match = LINE.match(line)
            if match:
                sweep, n, d, causal, pass_, impl, ms, tflops = match.groups()
                rows.append(dict(run=run, sweep=sweep, seqlen=int(n), head_dim=int(d), causal=causal == "True",
                                 pass_=pass_, impl=impl, time_ms=float(ms), tflops=float(tflops)))
    return rows, header


def write_csv(path, rows, header):
    with open(path, "w", newline="") as out:
        out.write(f"# {header}\n")
        writer = csv.writer(out)
        writer.writerow(["run", "sweep", "seqlen", "head_dim", "causal", "pass", "impl", "time_ms", "tflops",
                         "ours_over_cudnn"])
        cudnn = {(r["run"], r["sweep"], r["seqlen"], r["causal"], r["pass_"]): r["tflops"]
                 for r in rows if r["impl"] == "cudnn"}
        for r in rows:
            anchor = cudnn.get((r["run"], r["sweep"], r["seqlen"], r["causal"], r["pass_"]))
            ratio = f"{r['tflops'] / anchor:.3f}" if anchor and r["impl"] != "cudnn" else ""
            writer.writerow([r["run"], r["sweep"], r["seqlen"], r["head_dim"], r["causal"], r["pass_"], r["impl"],
                             r["time_ms"], r["tflops"], ratio])


def plot(path, rows, header):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cudnn = {(r["run"], r["sweep"], r["seqlen"], r["causal"], r["pass_"]): r["tflops"]
             for r in rows if r["impl"] == "cudnn"}
    ours = [r for r in rows if r["impl"] == "ours" and (r["run"], r["sweep"], r["seqlen"], r["causal"], r["pass_"]) in cudnn]
    passes = sorted({r["pass_"] for r in ours}, reverse=True)
    fig, axes = plt.subplots(len(passes), 1, figsize=(12, 4 * len(passes)), squeeze=False)
    for ax, pass_ in zip(axes[:, 0], passes):
        shapes = sorted({(r["head_dim"], r["causal"], r["seqlen"]) for r in ours if r["pass_"] == pass_})
        runs = [run for run in dict.fromkeys(r["run"] for r in ours if r["pass_"] == pass_)]
        width = 0.8 / max(len(runs), 1)
        for i, run in enumerate(runs):
            ratio = {(r["head_dim"], r["causal"], r["seqlen"]): r["tflops"] / cudnn[(r["run"], r["sweep"], r["seqlen"], r["causal"], r["pass_"])]
                     for r in ours if r["run"] == run and r["pass_"] == pass_}
            ax.bar([x + i * width for x in range(len(shapes))], [ratio.get(s, 0) for s in shapes], width, label=run)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(1.05, color="gray", linestyle="--", linewidth=0.8)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))])
        ax.set_xticklabels([f"d{d}{' causal' if c else ''}\n{n // 1024}k" for d, c, n in shapes], fontsize=7)
        ax.set_ylabel(f"{pass_}: ours / cuDNN")
        ax.set_ylim(0.4, 1.15)
        ax.legend(fontsize=7, loc="lower right", ncol=2)
    fig.suptitle(header, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    args = sys.argv[1:]
    out_csv = args.pop(0)
    out_png = None
    if args and args[0] == "--plot":
        args.pop(0)
        out_png = args.pop(0)
    rows, header = read_runs(args)
    write_csv(out_csv, rows, header)
    if out_png:
        plot(out_png, rows, header)
    print(f"{len(rows)} rows from {len(args)} runs -> {out_csv}{' and ' + out_png if out_png else ''}")


if __name__ == "__main__":
    main()
