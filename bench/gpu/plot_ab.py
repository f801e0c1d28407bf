#!/usr/bin/env python3
"""Plots an A/B results CSV of bench/results (one setting of a switch per process, its
name in the first column, e.g. `grid` or `partial_blocks`), without torch:

  * bench_attention.py rows (seqlen varies): TFLOP/s against seqlen per (head dim, causal),
    one line per (setting, implementation);
  * bench_masks.py rows (one shape, several masks): TFLOP/s per mask, one bar per
    (setting, implementation).

    python bench/gpu/plot_ab.py bench/results/hopper_bwd/h200_2026-11-27_dynamic_grid.csv [more.csv ...]
Writes <csv stem>.png beside each CSV. Anchors measured once per process appear once per
setting: their spread is the run-to-run noise of the comparison.
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    setting = next(iter(rows[0]))  # the first column names the switch's setting
    return setting, [r for r in rows if r.get("tflops", "nan") not in ("", "nan")]


def plot_sweep(path, setting, rows):
    panels = sorted({(int(r["head_dim"]), r["causal"]) for r in rows})
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for axis, (head_dim, causal) in zip(axes.flat, panels):
        selected = [r for r in rows if int(r["head_dim"]) == head_dim and r["causal"] == causal]
        for key in dict.fromkeys((r[setting], r["impl"]) for r in selected):
            points = sorted((int(r["seqlen"]), float(r["tflops"])) for r in selected if (r[setting], r["impl"]) == key)
            axis.plot(*zip(*points), marker="o", linestyle="-" if key[1] == "ours" else ":", label=f"{key[1]} ({key[0]})")
        axis.set_title(f"d{head_dim} {'causal' if causal == 'True' else 'full'} {selected[0]['pass']}", fontsize=9)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("seqlen")
        axis.set_ylabel("TFLOP/s")
        axis.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    return figure


def plot_masks(path, setting, rows):
    masks = list(dict.fromkeys(r["mask"] for r in rows))
    keys = list(dict.fromkeys((r[setting], r["impl"]) for r in rows))
    figure, axis = plt.subplots(figsize=(1.8 + 1.6 * len(masks), 3.6))
    width = 0.8 / len(keys)
    for index, key in enumerate(keys):
        values = {r["mask"]: float(r["tflops"]) for r in rows if (r[setting], r["impl"]) == key}
        axis.bar([m + index * width for m in range(len(masks))], [values.get(mask, 0.0) for mask in masks], width,
                 label=f"{key[1]} ({key[0]})")
    axis.set_xticks([m + 0.4 - width / 2 for m in range(len(masks))], masks)
    axis.set_ylabel("TFLOP/s")
    first = rows[0]
    axis.set_title(f"B{first['batch']} H{first['heads']} N{first['seqlen']} d{first['head_dim']} {first['pass']}",
                   fontsize=9)
    axis.legend(fontsize=7)
    axis.grid(axis="y", alpha=0.3)
    return figure


def main(paths):
    for path in paths:
        setting, rows = read(path)
        is_sweep = len({r["seqlen"] for r in rows}) > 1
        figure = (plot_sweep if is_sweep else plot_masks)(path, setting, rows)
        figure.tight_layout()
        out = os.path.splitext(path)[0] + ".png"
        figure.savefig(out, dpi=110)
        print("wrote", out)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
