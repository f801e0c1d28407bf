#!/usr/bin/env bash
# bench/gpu/decode_device.sh — the decode (issue 6) work of one device call, inside ~400 s:
#   1. build test_cuda_kvcache, test_split_heuristic and decode_bench (kernel head dims
#      HEAD_DIMS, default 128; sm_90a) into /tmp/decode-tree;
#   2. the decode tests (a wrong kernel can hang: every step has its own time limit);
#   3. decode_bench twice (every shape with the library's choice and with each split-KV
#      kernel forced; SWEEP=1: forced split counts too) and the SDPA anchor, back to back;
#   4. compute-sanitizer memcheck (and racecheck on two cases) on the TMA kernel.
# Logs and CSVs go to $OUT. Run it from a source root (the script's ../..); GTEST_ROOT
# points at GoogleTest libraries when the machine lacks them.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-$root/build-dev-decode/out}
tree=${TREE:-/tmp/decode-tree}
logs=${LOGS:-/tmp/decode-logs}  # full logs, packed into $out/logs.tar.gz at the end (few files come back)
mkdir -p "$out" "$logs"
started=$(date +%s)
step() { echo "=== [$(($(date +%s) - started))s] $*" | tee -a "$out/summary.txt"; }
note() { echo "$*" | tee -a "$out/summary.txt"; }

{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader; nvcc --version | tail -1; } \
  > "$out/summary.txt" 2>&1
cat "$out/summary.txt"

step "configure + build (head dims ${HEAD_DIMS:-128})"
cmake -S "$root" -B "$tree" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
  -DFLASHATTN_CUDA_HEAD_DIMS="${HEAD_DIMS:-128}" -DFLASHATTN_BUILD_TESTS=ON -DFLASHATTN_BUILD_TOOLS=OFF -DFLASHATTN_BUILD_PYTHON=OFF \
  ${GTEST_ROOT:+-DGTEST_ROOT=$GTEST_ROOT} > "$logs/build.log" 2>&1
note "configure rc=$?"
(time timeout "${BUILD_LIMIT:-220}" ninja -C "$tree" -j16 -k 0 test_cuda_kvcache test_split_heuristic decode_bench) >> "$logs/build.log" 2>&1
note "build rc=$? $(grep real "$logs/build.log" | tail -1)"
grep -B2 -A12 -E "FAILED|error" "$logs/build.log" | head -40
# Resources of the decode kernels (registers, spills, shared memory) from the binary.
cuobjdump -res-usage "$(find "$tree" -name 'libflashattn*' -type f | head -1)" 2>/dev/null | grep -A1 -E "decode_kernel" \
  | grep -E "Function|REG" | sed 's/^ *//' | paste - - | sed -E 's/.*(tma_decode|mma_decode)_kernelI([^E]*).*REG:([0-9]+).*SHARED:([0-9]+).*/\1 \2 reg \3 static smem \4/' \
  | sort -u > "$out/resources.txt"
cat "$out/resources.txt"

step "tests"
timeout "${TEST_LIMIT:-45}" "$tree/tests/cuda/test_cuda_kvcache" > "$logs/tests.log" 2>&1
note "test_cuda_kvcache rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/tests.log" | tr '\n' ' ')"
grep -E -A6 "Failure|FAILED|error" "$logs/tests.log" | head -40; tail -3 "$logs/tests.log"
timeout 20 "$tree/tests/core/test_split_heuristic" --gtest_brief=1 > "$logs/tests_core.log" 2>&1
note "test_split_heuristic rc=$? $(grep -E '^\[  PASSED' "$logs/tests_core.log")"

step "decode_bench"
decode_bench=$(find "$tree" -name decode_bench -type f -perm -u+x | head -1)
timeout "${BENCH_LIMIT:-90}" "$decode_bench" "$out/gpu_decode.csv" ${SWEEP:+"$out/gpu_decode_sweep.csv"} > "$logs/decode.log" 2>&1
note "decode_bench rc=$?"
# The same binary again: the run-to-run spread of every number above.
timeout "${BENCH_LIMIT:-90}" "$decode_bench" "$out/gpu_decode_run2.csv" > "$logs/decode_run2.log" 2>&1
note "decode_bench (second run) rc=$?"
step "SDPA anchor"
timeout "${ANCHOR_LIMIT:-45}" python3 "$root/bench/gpu/decode_anchor.py" "$out/gpu_decode_anchor.csv" >> "$logs/decode.log" 2>&1
note "decode_anchor rc=$?"
cat "$logs/decode.log"

step "compute-sanitizer memcheck (TMA cases)"
filter='BothKernels/KVCacheCudaKernel.*/134:BothKernels/KVCacheCudaKernel.*/135:BothKernels/KVCacheCudaKernel.*/20?:BothKernels/KVCacheCudaKernel.*/21?:KVCacheCudaKernels.ZeroLength*'
timeout "${SANITIZER_LIMIT:-45}" compute-sanitizer --tool memcheck --error-exitcode 3 "$tree/tests/cuda/test_cuda_kvcache" --gtest_brief=1 \
  --gtest_filter="$filter" > "$logs/sanitizer.log" 2>&1
note "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$logs/sanitizer.log" | tail -1) $(grep -E "^\[  PASSED" "$logs/sanitizer.log")"
timeout "${RACECHECK_LIMIT:-40}" compute-sanitizer --tool racecheck --error-exitcode 3 "$tree/tests/cuda/test_cuda_kvcache" --gtest_brief=1 \
  --gtest_filter='BothKernels/KVCacheCudaKernel.*/134:BothKernels/KVCacheCudaKernel.*/210' > "$logs/racecheck.log" 2>&1
note "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$logs/racecheck.log" | tail -1) $(grep -E "^\[  PASSED" "$logs/racecheck.log")"
step "done"
tar -czf "$out/logs.tar.gz" -C "$logs" .
