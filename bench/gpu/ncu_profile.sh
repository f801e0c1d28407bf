#!/usr/bin/env bash
# Nsight Compute on one kernel per problem of bench/gpu/ncu_problems.py: speed of light,
# compute workload (pipe utilisation), scheduler and warp-state statistics (stall reasons),
# one launch after two warm-up calls, clocks as they are. Writes OUT_DIR/ncu_<problem>.csv
# (ncu --page details) and prints the headline metrics.
# usage: bench/gpu/ncu_profile.sh OUT_DIR KERNEL_REGEX PROBLEM...   (PYTHONPATH: the built python/)
set -uo pipefail
out_dir=${1:?output directory}; kernel=${2:?kernel name regex}; shift 2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out_dir"
for problem in "$@"; do
  ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
      --section WarpStateStats --section LaunchStats --section Occupancy \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio\$,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active\$,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active\$" \
      --csv --page details --print-units base --log-file "$out_dir/ncu_$problem.csv" \
      python3 "$here/ncu_problems.py" "$problem" > "$out_dir/ncu_${problem}_stdout.txt" 2>&1 \
    || echo "ncu for $problem exited with $?"
  echo "== $problem"
  grep -E '"(Duration|Compute \(SM\) Throughput|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Stall [A-Za-z ]+|Executed Ipc Active|Registers Per Thread|Warp Cycles Per Issued Instruction)"|stalled_|pipe_' \
      "$out_dir/ncu_$problem.csv" | awk -F'","' '{v=$NF; gsub(/"/,"",v); if ($(NF-2) !~ /stalled_|pipe_/ || v+0 > 0.05) print $(NF-2) " = " v}' | head -60
done
