#!/usr/bin/env bash
# HBM traffic of each rung of the ladder, read off the hardware counters with ncu:
# dram__bytes_read.sum / dram__bytes_write.sum (device memory) and lts__t_bytes.sum
# (all L2 traffic, what the paper's two-level SRAM/HBM model calls HBM accesses when
# the working set does not fit in L2). Each variant runs once (ladder_bench --profile)
# in its own ncu session, so every kernel of the session belongs to it except the
# input fills, which the summary drops. --cache-control all (ncu's default) flushes
# the caches before each kernel: every kernel starts cold. --clock-control none
# leaves the GPU's clocks as they are.
#
# usage: bench/gpu/ladder_ncu.sh LADDER_BENCH OUT_DIR [SEQLEN=2048] [HEAD_DIM=64] [DTYPE=fp16]
# writes OUT_DIR/ncu_<variant>.csv (raw) and OUT_DIR/gpu_ladder_ncu.csv (summary).
set -uo pipefail
bench=${1:?ladder_bench path}
out_dir=${2:?output directory}
seqlen=${3:-2048}
head_dim=${4:-64}
dtype=${5:-fp16}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out_dir"
metrics=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
for variant in naive fa1 ours; do
  # --launch-count bounds the session: 3 input fills + a handful of kernels per variant.
  ncu --clock-control none --cache-control all --metrics "$metrics" --csv --print-units base \
      --launch-count 40 --log-file "$out_dir/ncu_$variant.csv" \
      "$bench" --profile --variants "$variant" --seqlens "$seqlen" --head-dim "$head_dim" --dtype "$dtype" \
      > "$out_dir/ncu_${variant}_stdout.txt" 2>&1 || echo "ncu for $variant exited with $?"
done
python3 "$here/ladder_ncu_summary.py" --seqlen "$seqlen" --head-dim "$head_dim" --dtype "$dtype" \
    --out "$out_dir/gpu_ladder_ncu.csv" "$out_dir"/ncu_naive.csv "$out_dir"/ncu_fa1.csv "$out_dir"/ncu_ours.csv
