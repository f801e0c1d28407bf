#!/usr/bin/env bash
# Nsight Compute's warp-stall sampling per SASS instruction for one kernel launch per problem
# of bench/gpu/ncu_problems.py (one launch after two warm-up calls): where in the kernel the
# warps wait, and on what (long scoreboard, barrier, wait, gmma, ...). Writes
# OUT_DIR/ncu_source_<problem>.ncu-rep and .csv (ncu --page source --print-source sass) and
# prints the instructions with the most samples (ncu_source_summary.py). Roles and source lines:
# bench/gpu/ncu_source_lines.py (needs the same kernel built here with -lineinfo).
# usage: bench/gpu/ncu_source.sh OUT_DIR KERNEL_REGEX PROBLEM...   (PYTHONPATH: the built python/)
set -uo pipefail
out_dir=${1:?output directory}; kernel=${2:?kernel name regex}; shift 2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out_dir"
for problem in "$@"; do
  report="$out_dir/ncu_source_$problem"
  ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 2 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --import-source no -f -o "$report" \
      python3 "$here/ncu_problems.py" "$problem" > "${report}_stdout.txt" 2>&1 \
    || echo "ncu for $problem exited with $?"
  ncu -i "$report.ncu-rep" --page source --csv --print-source sass > "$report.csv" 2> "${report}_import.txt" \
    || echo "ncu import for $problem exited with $?"
  echo "== $problem"
  python3 "$here/ncu_source_summary.py" "$report.csv" --top "${NCU_SOURCE_TOP:-40}"
done
