#!/usr/bin/env python3
"""Summarises an `ncu --page source --csv --print-source sass` export (bench/gpu/ncu_source.sh):
the SASS instructions with the most warp-stall samples, each with its share of all samples
and its largest stall reasons, then the totals per stall reason.

    python3 bench/gpu/ncu_source_summary.py report.csv [--top 40]

The column names differ between Nsight Compute versions: the sample columns are found by
name ("Warp Stall Sampling (All Samples)" for the total; the per-reason columns are those
whose names start with "stall_" or contain "Stall"), the instruction by "Source".
"""
import argparse
import csv
import sys


def number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    with open(args.csv, newline="") as f:
        lines = [line for line in f if line.strip() and not line.startswith("==")]
    # ncu writes a "Kernel Name" line before the header of each kernel's table: start at the header.
    header = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), 0)
    lines = lines[header:]
    rows = list(csv.DictReader(lines))
    if not rows:
        sys.exit(f"{args.csv}: no rows")
    columns = list(rows[0].keys())
    total_column = next((c for c in columns if "Sampling (All" in c), None) or \
        next((c for c in columns if "Sampling" in c), None)
    if total_column is None:
        sys.exit(f"{args.csv}: no warp-stall sampling column among {columns[:12]}...")
    source_column = next((c for c in columns if c.strip().lower() == "source"), columns[1])
    address_column = next((c for c in columns if "Address" in c), columns[0])
    reason_columns = [c for c in columns if c != total_column and (c.startswith("stall_") or "Stall" in c)
                      and "Sampling" not in c and "Not Issued" not in c]
    total = sum(number(r[total_column]) for r in rows) or 1.0
    print(f"{len(rows)} instructions, {total:.0f} samples ({total_column})")
    for row in sorted(rows, key=lambda r: -number(r[total_column]))[:args.top]:
        samples = number(row[total_column])
        reasons = sorted(((number(row[c]), c) for c in reason_columns), reverse=True)[:3]
        named = ", ".join(f"{c.replace('stall_', '')} {v / samples:.0%}" for v, c in reasons if v > 0 and samples > 0)
        print(f"{samples / total:6.1%}  {row[address_column]:>8}  {row[source_column].strip()[:70]:70}  {named}")
    if reason_columns:
        print("-- per reason")
        sums = sorted(((sum(number(r[c]) for r in rows), c) for c in reason_columns), reverse=True)
        for value, column in sums[:12]:
            print(f"{value / total:6.1%}  {column}")


if __name__ == "__main__":
    main()
