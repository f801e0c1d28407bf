"""Plot of the decode benchmark (issue 6): bandwidth of forward_with_kvcache
(bench/gpu/decode_bench.cu CSV: contiguous, paged 16, paged 256; the rows of the
library's own kernel choice, kernel "auto", where the CSV has a kernel column) beside
the SDPA anchors of the same run (bench/gpu/decode_anchor.py CSV), one group of bars
per shape, the device copy rate of the run as the ceiling.

    python bench/gpu/decode_plot.py gpu_decode.csv gpu_decode_anchor.csv gpu_decode.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_csv(path):
    with open(path) as f:
        lines = [line for line in f if not line.startswith("#")]
    return list(csv.DictReader(lines))


def copy_rate(path):
    with open(path) as f:
        first = f.readline()
    for field in first.split():
        if field.startswith("copy_tbps="):
            return float(field.split("=")[1])
    return None


def main():
    ours_path, anchor_path, out_path = sys.argv[1:4]
    ours, anchor = read_csv(ours_path), read_csv(anchor_path)
    ours = [r for r in ours if r.get("kernel", "auto") == "auto"]
    shapes = []
    for row in ours:
        shape = (int(row["batch"]), int(row["kv_len"]))
        if shape not in shapes:
            shapes.append(shape)
    series = {
        "ours contiguous": {(int(r["batch"]), int(r["kv_len"])): float(r["bandwidth_tbps"]) for r in ours if r["layout"] == "contiguous"},
        "ours paged 16": {(int(r["batch"]), int(r["kv_len"])): float(r["bandwidth_tbps"]) for r in ours if r["page_size"] == "16"},
        "ours paged 256": {(int(r["batch"]), int(r["kv_len"])): float(r["bandwidth_tbps"]) for r in ours if r["page_size"] == "256"},
        "SDPA FLASH (FA2)": {(int(r["batch"]), int(r["kv_len"])): float(r["bandwidth_tbps"]) for r in anchor if r["backend"] == "sdpa_flash"},
        "SDPA cuDNN": {(int(r["batch"]), int(r["kv_len"])): float(r["bandwidth_tbps"]) for r in anchor if r["backend"] == "sdpa_cudnn"},
    }
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for k, (name, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(shapes))]
        ax.bar(xs, [values.get(s, 0.0) for s in shapes], width, label=name)
    ceiling = copy_rate(ours_path)
    if ceiling:
        ax.axhline(ceiling, color="black", linestyle="--", linewidth=1, label=f"device copy {ceiling:.2f} TB/s")
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"B{b}, KV {kv // 1024}k" for b, kv in shapes])
    ax.set_ylabel("TB/s of K+V read")
    ax.set_title("Decode with a KV cache: bf16, 32 q / 8 kv heads, d128, one query token, L2-cold")
    ax.legend(fontsize=8, ncol=3, loc="lower right")
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)


if __name__ == "__main__":
    main()
