#!/usr/bin/env python3
"""Plots the variant rows of bench_attention.py (--dropout / --alibi) from their CSVs,
without torch: TFLOP/s against seqlen per (head dim, causal), one line per
implementation (ours, ours_plain = ours without the variant, and the SDPA anchors).

    python bench/gpu/plot_variants.py bench/results/gpu_dropout_forward.csv [more.csv ...]
Writes <csv stem>.png beside each CSV.
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(path):
    rows = list(csv.DictReader(open(path)))
    panels = sorted({(int(r["head_dim"]), r["causal"]) for r in rows})
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for axis, (head_dim, causal) in zip(axes.flat, panels):
        selected = [r for r in rows if int(r["head_dim"]) == head_dim and r["causal"] == causal]
        for impl in dict.fromkeys(r["impl"] for r in selected):
            points = [(int(r["seqlen"]), float(r["tflops"])) for r in selected if r["impl"] == impl and r["tflops"] != "nan"]
            if points:
                axis.plot(*zip(*sorted(points)), marker="o", label=impl)
        axis.set_title(f"d{head_dim} {'causal' if causal == 'True' else 'full'} {selected[0]['pass']}", fontsize=9)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("seqlen")
        axis.set_ylabel("TFLOP/s (FLOPs as without the variant)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    first = rows[0]
    figure.suptitle(f"{first['variant']} {first['dtype']} — {first['device']} — {first['date']}")
    figure.tight_layout()
    out = os.path.splitext(path)[0] + ".png"
    figure.savefig(out, dpi=100)
    print("wrote", out)


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        plot(argument)
