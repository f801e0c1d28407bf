#!/usr/bin/env bash
# bench/gpu/run_all.sh — the whole GPU benchmark in one device call (about 8 minutes
# with a warm build cache; see the step limits below):
#   1. build (cmake -G Ninja, ninja -j$JOBS): library + CUDA kernels, ladder_bench and
#      the Python module, in one build tree;
#   2. the Python package: that build's module on PYTHONPATH, else
#      `pip install --no-build-isolation --no-deps .`; if neither imports, the harness
#      reports ours as unavailable and everything else still runs;
#   3. the ladder (naive -> FA1 -> ours) and its HBM traffic under ncu;
#   4. the harness: forward, then backward (ours vs SDPA FA2 and cuDNN);
#   5. results into $OUT: at most 8 files come back from the device, so the CSVs, the
#      PNGs and summary.txt go there one by one and everything (logs too) into
#      results.tar.gz.
# A short summary table is printed last.
#
# Run from anywhere:  bash bench/gpu/run_all.sh
# Environment (all optional):
#   OUT          where results go (default: $OUT of the device machine, else ./build-bench/out)
#   BUILD        build directory (default ./build-bench)
#   JOBS         compile jobs (16)
#   CMAKE_ARGS   extra configure flags, e.g. -DFLASHATTN_CUDA_HEAD_DIMS=64;128;256
#   HARNESS_ARGS extra bench_attention.py flags, e.g. --quick or --sweeps seed004
#   LADDER_ARGS  extra ladder_bench flags (default sweep: fp16, batch 1, 16 heads, d 64, N 512..8192)
#   NCU_SEQLEN   sequence length of the ncu traffic measurement (2048)
#   SKIP_BUILD=1 reuse an existing build tree
#   step limits in seconds: BUILD_LIMIT (300) PIP_LIMIT (180) LADDER_LIMIT (90) NCU_LIMIT (90)
#   FWD_LIMIT (150) BWD_LIMIT (180)
#   TOTAL_LIMIT (560): every step's limit is cut to what is left of it, so the results are
#   copied to $OUT before a 600-second device command is stopped.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$root/build-bench/out}
build=${BUILD:-$root/build-bench}
jobs=${JOBS:-16}
results=$build/results  # staging; copied to $out at the end
mkdir -p "$out" "$results"
started=$(date +%s)
deadline=$(( started + ${TOTAL_LIMIT:-560} ))
step() { echo; echo "=== [$(( $(date +%s) - started ))s] $*"; }
# The smaller of a step's own limit and the time left before the deadline (10 s kept for
# the summary and the copy); at least 1 so `timeout` stops a step that cannot fit at once.
cap() {
  local left=$(( deadline - $(date +%s) - 10 ))
  (( left < 1 )) && left=1
  echo $(( $1 < left ? $1 : left ))
}

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1
  nvcc --version 2>&1 | tail -1
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version(), "triton", triton.__version__)' 2>&1
  git -C "$root" log -1 --format='commit %H %s' 2>&1
  git -C "$root" status --short 2>&1 | head -40
} > "$results/environment.txt"
cat "$results/environment.txt" | head -8

# --- 1. build -------------------------------------------------------------------------------
# The top-level CMakeLists adds bench/gpu under FLASHATTN_WITH_CUDA; until it does, a
# two-line wrapper project adds both the library and bench/gpu.
if grep -q 'add_subdirectory(bench/gpu)' "$root/CMakeLists.txt"; then
  source_dir=$root
else
  source_dir=$build/wrapper
  mkdir -p "$source_dir"
  cat > "$source_dir/CMakeLists.txt" <<WRAPPER
cmake_minimum_required(VERSION 3.25)
project(flashattn_bench LANGUAGES CXX CUDA)
add_subdirectory("$root" flashattn)
add_subdirectory("$root/bench/gpu" bench_gpu)
WRAPPER
fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  step "build ($source_dir -> $build/tree)"
  read -r -a cmake_extra <<< "${CMAKE_ARGS:-}"  # whitespace-separated flags; ';' lists stay one flag
  build_start=$(date +%s)
  {
    timeout "$(cap 120)" cmake -S "$source_dir" -B "$build/tree" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90a-real -DFLASHATTN_BUILD_PYTHON=ON -DFLASHATTN_BUILD_TESTS=OFF \
        -DFLASHATTN_BUILD_TOOLS=OFF -DPython_EXECUTABLE="$(command -v python3)" "${cmake_extra[@]}" &&
      timeout "$(cap "${BUILD_LIMIT:-300}")" ninja -C "$build/tree" -j "$jobs" -k 0
  } > "$results/build.log" 2>&1
  build_status=$?
  echo "build exit $build_status, wall time $(( $(date +%s) - build_start )) s, $(grep -c FAILED "$results/build.log") failed steps"
  grep -A12 FAILED "$results/build.log" | head -40
fi
ladder_bench=$(find "$build/tree/" -name ladder_bench -type f -perm -u+x 2>/dev/null | head -1)

# --- 2. the Python package ------------------------------------------------------------------
step "python package"
module_dir=$(dirname "$(dirname "$(find "$build/tree/" -path '*python/flashattn/_C*.so' 2>/dev/null | head -1)")" 2>/dev/null)
if [ -n "$module_dir" ] && PYTHONPATH="$module_dir" python3 -c 'import flashattn' 2>/dev/null; then
  export PYTHONPATH="$module_dir${PYTHONPATH:+:$PYTHONPATH}"
  echo "using the build tree's module: $module_dir"
elif timeout "$(cap "${PIP_LIMIT:-180}")" python3 -m pip install --no-build-isolation --no-deps -q . > "$results/pip.log" 2>&1 \
     && python3 -c 'import flashattn' 2>/dev/null; then
  echo "pip install . succeeded"
else
  echo "flashattn not importable: the harness reports ours as unavailable (see pip.log)"
fi
python3 -c 'import flashattn; print("flashattn", flashattn.__version__, "cuda_available", flashattn.cuda_available())' 2>&1 | tail -1

# --- 3. the ladder and its HBM traffic --------------------------------------------------------
if [ -n "$ladder_bench" ]; then
  step "ladder ($ladder_bench)"
  # shellcheck disable=SC2086
  timeout "$(cap "${LADDER_LIMIT:-90}")" "$ladder_bench" --csv "$results/gpu_ladder.csv" --md "$results/gpu_ladder.md" \
      ${LADDER_ARGS:-} 2>&1 | tee "$results/ladder.log"
  # The memory rows of shared/BENCHMARKS.md (bf16, d 128): naive's O(N^2) against ours' O(N).
  timeout "$(cap 60)" "$ladder_bench" --dtype bf16 --head-dim 128 --seqlens 4096,16384 --variants naive,ours \
      --csv "$results/gpu_ladder_d128.csv" --md "$results/gpu_ladder_d128.md" 2>&1 | tee -a "$results/ladder.log"
  step "ncu HBM traffic (N=${NCU_SEQLEN:-2048})"
  timeout "$(cap "${NCU_LIMIT:-90}")" bash "$root/bench/gpu/ladder_ncu.sh" "$ladder_bench" "$results/ncu" "${NCU_SEQLEN:-2048}" \
      2>&1 | tee "$results/ncu.log"
  cp "$results/ncu/gpu_ladder_ncu.csv" "$results/" 2>/dev/null
else
  echo "ladder_bench was not built: see build.log"
fi

# --- 4. the harness -------------------------------------------------------------------------
export PYTHONUNBUFFERED=1
for pass in fwd bwd; do
  limit=$(cap "$([ $pass = fwd ] && echo "${FWD_LIMIT:-150}" || echo "${BWD_LIMIT:-180}")")
  step "harness $pass (limit ${limit}s)"
  # shellcheck disable=SC2086
  timeout "$limit" python3 "$root/bench/gpu/bench_attention.py" --passes $pass --out-dir "$results" ${HARNESS_ARGS:-} \
      > "$results/harness_$pass.log" 2>&1
  echo "exit $?; $(grep -c '' "$results/harness_$pass.log") log lines"
  grep -m3 -i 'error\|traceback' "$results/harness_$pass.log"
done

# --- 5. results -------------------------------------------------------------------------------
step "summary"
python3 - "$results" <<'SUMMARY' 2>&1 | tee "$results/summary.txt"
import csv, os, sys
results = sys.argv[1]

def read(name):
    path = os.path.join(results, name)
    return list(csv.DictReader(open(path))) if os.path.exists(path) else []

def num(x, fmt):
    width = int(fmt.split(".")[0] or 0)
    try:
        v = float(x)
        return format(v, fmt) if v == v else "-".rjust(width)
    except (TypeError, ValueError):
        return "-".rjust(width)

for ladder in (read("gpu_ladder.csv"), read("gpu_ladder_d128.csv")):
    if not ladder:
        continue
    print(f"ladder ({ladder[0]['device']}, {ladder[0]['dtype']}, B{ladder[0]['batch']} H{ladder[0]['heads']} d{ladder[0]['head_dim']}):")
    print(f"{'N':>6} {'variant':7} {'ms':>10} {'TFLOP/s':>8} {'extra MiB':>10} {'err O':>8}  status")
    for r in ladder:
        print(f"{r['seqlen']:>6} {r['variant']:7} {num(r['time_ms'], '10.4f')} {num(r['tflops'], '8.2f')} "
              f"{num(float(r['extra_bytes_counted']) / 2**20, '10.2f')} {num(r['max_error_out'], '8.1e')}  {r['status'][:60]}")
ncu = [r for r in read("gpu_ladder_ncu.csv") if r["kind"] == "total"]
if ncu:
    print(f"HBM traffic at N={ncu[0]['seqlen']} (MiB): " + "; ".join(
        f"{r['variant']} read {int(r['dram__bytes_read.sum']) / 2**20:.1f} write {int(r['dram__bytes_write.sum']) / 2**20:.1f} "
        f"L2 {int(r['lts__t_bytes.sum']) / 2**20:.1f}" for r in ncu))
for name in ("gpu_forward.csv", "gpu_backward.csv"):
    rows = read(name)
    if not rows:
        print(f"{name}: missing"); continue
    print(f"{name} ({rows[0]['device']}, {rows[0]['date']}): TFLOP/s; ours/fa2 and ours/cudnn time ratios (>1 = ours faster)")
    points = {}
    for r in rows:
        points.setdefault((r["sweep"], r["seqlen"], r["causal"]), {})[r["impl"]] = r
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    print(f"{'sweep':9} {'N':>6} {'causal':6} " + " ".join(f"{i:>8}" for i in impls) + f" {'vs fa2':>7} {'vs cudnn':>8}  ours status")
    for (sweep, n, causal), by in points.items():
        ours = by.get("ours", {})
        print(f"{sweep:9} {n:>6} {causal:6} " + " ".join(num(by.get(i, {}).get("tflops"), "8.1f") for i in impls)
              + f" {num(ours.get('ratio_vs_fa2'), '7.2f')} {num(ours.get('ratio_vs_cudnn'), '8.2f')}  {ours.get('status', '')[:40]}")
SUMMARY

tar -czf "$out/results.tar.gz" -C "$results" . 2>/dev/null
for file in gpu_ladder.csv gpu_ladder_ncu.csv gpu_forward.csv gpu_backward.csv gpu_forward.png gpu_backward.png summary.txt; do
  [ -f "$results/$file" ] && cp "$results/$file" "$out/"
done
echo "total $(( $(date +%s) - started ))s; in $out: $(ls "$out" | tr '\n' ' ')"
