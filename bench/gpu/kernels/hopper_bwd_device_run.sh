#!/usr/bin/env bash
# bench/gpu/kernels/hopper_bwd_device_run.sh — one device call for the Hopper backward: build
# (head dims HEAD_DIMS, default "64;128", sm_90a) the backward tests and the timing tool, run the tests (with
# a compute-sanitizer pass on the Hopper cases), time ours (sm90 and FA2-class) and the
# SDPA anchors (FA2, cuDNN) in the same call. Logs/CSVs under $OUT.
#   TIMING_ARGS: arguments of flashattn_hopper_bwd_timing (default "20 --quick")
#   SKIP_TESTS=1: timing only; VARIANT_LIMIT=0 skips the tile-config variants
#   SKIP_OVERLAPPED=1: skips the overlapped/deferred_dk schedules' and the L2-section
#   order's tests, sanitizers and A/B timing (FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE,
#   FLASHATTN_CUDA_HOPPER_BWD_ORDER; kernel.cuh, tile_config.hpp, launch.hpp)
#   SKIP_PERSISTENT=1: skips the persistent grid's tests, sanitizers and per-tile vs
#   persistent timing (FLASHATTN_CUDA_HOPPER_BWD_GRID=persistent, launch.hpp)
# Runs in the tree it lives in: the repo root, or (what the 2026-11-23 runs did, so
# that other work in progress in a shared checkout cannot break the build) a
# `git archive HEAD` snapshot with .device-deps copied in, in an ignored folder named
# in the device call's carry: cd build-hbwd-src && bash bench/gpu/kernels/hopper_bwd_device_run.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
out=${OUT:-$root/build-dev-hbwd/out}
tree=$root/build-dev-hbwd
logs=$tree/logs  # full logs, packed into $out/logs.tar.gz at the end (few files come back)
mkdir -p "$out" "$logs"
log=$out/log.txt
started=$(date +%s)
step() { echo "=== [$(( $(date +%s) - started ))s] $*" | tee -a "$log"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git -C "$root" log -1 --format='commit %h %s' 2>/dev/null || true; } | tee -a "$log"

step "configure + build"
deps=$root/.device-deps
cmake -S . -B "$tree" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
  -DFLASHATTN_CUDA_HEAD_DIMS="${HEAD_DIMS:-64;128}" -DFLASHATTN_BUILD_TESTS=ON -DGTEST_ROOT="$deps/gtest" -DCLI11_INCLUDE_DIR="$deps" \
  > "$logs/build.log" 2>&1
timeout "${BUILD_LIMIT:-200}" ninja -C "$tree" -j16 test_cuda_backward test_cuda_backward_hopper test_cuda_masks_hopper_bwd \
  test_cuda_hopper_bwd_dq_order flashattn_hopper_bwd_timing >> "$logs/build.log" 2>&1
echo "build rc=$?" | tee -a "$log"
grep -B2 -A12 -E "error|FAILED" "$logs/build.log" | head -60 | tee -a "$log"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step "tests"
  timeout "${HOPPER_TEST_LIMIT:-300}" "$tree/tests/cuda/test_cuda_backward_hopper" > "$logs/test_hopper.log" 2>&1
  rc=$?; echo "test_cuda_backward_hopper rc=$rc" | tee -a "$log"; grep -E "FAILED|Failure|error|PASSED|differs|OK \]" "$logs/test_hopper.log" | head -40 | tee -a "$log"
  if [ "$rc" = 124 ]; then tail -20 "$logs/test_hopper.log" | tee -a "$log"; echo "hang: stopping" | tee -a "$log"; tar -czf "$out/logs.tar.gz" -C "$logs" .; exit 1; fi
  timeout "${BACKWARD_LIMIT:-150}" "$tree/tests/cuda/test_cuda_backward" --gtest_brief=1 --gtest_filter="${BACKWARD_FILTER:-*}" > "$logs/test_backward.log" 2>&1
  echo "test_cuda_backward rc=$?" | tee -a "$log"; grep -E "FAILED|Failure|PASSED" "$logs/test_backward.log" | head -20 | tee -a "$log"
  timeout "${SANITIZER_LIMIT:-60}" compute-sanitizer --tool memcheck --error-exitcode 3 "$tree/tests/cuda/test_cuda_backward_hopper" --gtest_brief=1 \
    --gtest_filter='*TailsOfBothSequences*:*Varlen*' > "$logs/sanitizer.log" 2>&1
  echo "memcheck rc=$? $(grep 'ERROR SUMMARY' "$logs/sanitizer.log" | tail -1)" | tee -a "$log"
  timeout "${SANITIZER_LIMIT:-60}" compute-sanitizer --tool racecheck --error-exitcode 3 "$tree/tests/cuda/test_cuda_backward_hopper" --gtest_brief=1 \
    --gtest_filter='*LongQueryRange*' >> "$logs/sanitizer.log" 2>&1
  echo "racecheck rc=$? $(grep 'RACECHECK SUMMARY' "$logs/sanitizer.log" | tail -1)" | tee -a "$log"
fi

if [ "${SKIP_OVERLAPPED:-0}" != 1 ]; then
  step "overlapped schedule: tests, sanitizers, lockstep vs overlapped"
  "$tree/tests/cuda/test_cuda_hopper_bwd_dq_order" --gtest_brief=1 > "$logs/test_dq_order.log" 2>&1
  echo "test_cuda_hopper_bwd_dq_order rc=$?" | tee -a "$log"
  export FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE=overlapped FLASHATTN_CUDA_HOPPER_BWD_ORDER=l2_sections
  for t in test_cuda_backward_hopper test_cuda_masks_hopper_bwd test_cuda_backward; do
    timeout "${HOPPER_TEST_LIMIT:-300}" "$tree/tests/cuda/$t" --gtest_brief=1 > "$logs/overlapped_$t.log" 2>&1
    rc=$?; echo "overlapped $t rc=$rc" | tee -a "$log"; grep -E "FAILED|Failure|PASSED" "$logs/overlapped_$t.log" | head -20 | tee -a "$log"
    if [ "$rc" = 124 ]; then tail -20 "$logs/overlapped_$t.log" | tee -a "$log"; echo "hang: stopping" | tee -a "$log"; tar -czf "$out/logs.tar.gz" -C "$logs" .; exit 1; fi
  done
  for tool in memcheck racecheck synccheck; do
    timeout "${SANITIZER_LIMIT:-60}" compute-sanitizer --tool $tool --error-exitcode 3 "$tree/tests/cuda/test_cuda_backward_hopper" \
      --gtest_brief=1 --gtest_filter='*TailsOfBothSequences*:*Varlen*:*DeterministicModeIsBitwise*' > "$logs/overlapped_$tool.log" 2>&1
    echo "overlapped $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/overlapped_$tool.log" | tail -1)" | tee -a "$log"
  done
  unset FLASHATTN_CUDA_HOPPER_BWD_ORDER
  FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE=deferred_dk timeout "${HOPPER_TEST_LIMIT:-300}" \
    "$tree/tests/cuda/test_cuda_backward_hopper" --gtest_brief=1 > "$logs/deferred_dk_tests.log" 2>&1
  echo "deferred_dk test_cuda_backward_hopper rc=$?" | tee -a "$log"; grep -E "FAILED|Failure|PASSED" "$logs/deferred_dk_tests.log" | head -20 | tee -a "$log"
  unset FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE
  for extra in "" "--deterministic"; do
    timeout "${TIMING_LIMIT:-120}" "$tree/bench/gpu/kernels/flashattn_hopper_bwd_timing" 20 --schedules --quick $extra \
      > "$out/schedules${extra:+_deterministic}.csv" 2>> "$logs/timing.err"
    echo "schedules $extra rc=$?" | tee -a "$log"; cat "$out/schedules${extra:+_deterministic}.csv" | tee -a "$log"
  done
  FLASHATTN_CUDA_HOPPER_BWD_ORDER=l2_sections timeout "${TIMING_LIMIT:-120}" \
    "$tree/bench/gpu/kernels/flashattn_hopper_bwd_timing" 20 --schedules --quick > "$out/schedules_l2_sections.csv" 2>> "$logs/timing.err"
  echo "schedules l2_sections rc=$?" | tee -a "$log"; cat "$out/schedules_l2_sections.csv" | tee -a "$log"
fi

if [ "${SKIP_PERSISTENT:-0}" != 1 ]; then
  step "persistent grid: tests, sanitizers, per-tile vs persistent"
  for grid_ctas in "" 3; do
    for t in test_cuda_backward_hopper test_cuda_masks_hopper_bwd; do
      FLASHATTN_CUDA_HOPPER_BWD_GRID=persistent FLASHATTN_CUDA_HOPPER_BWD_GRID_CTAS=$grid_ctas \
        timeout "${HOPPER_TEST_LIMIT:-300}" "$tree/tests/cuda/$t" --gtest_brief=1 > "$logs/persistent${grid_ctas}_$t.log" 2>&1
      rc=$?; echo "persistent grid ${grid_ctas:-(every SM)} $t rc=$rc" | tee -a "$log"
      grep -E "FAILED|Failure|PASSED" "$logs/persistent${grid_ctas}_$t.log" | head -20 | tee -a "$log"
      if [ "$rc" = 124 ]; then tail -20 "$logs/persistent${grid_ctas}_$t.log" | tee -a "$log"; echo "hang: stopping" | tee -a "$log"; tar -czf "$out/logs.tar.gz" -C "$logs" .; exit 1; fi
    done
  done
  for tool in memcheck racecheck synccheck; do
    FLASHATTN_CUDA_HOPPER_BWD_GRID=persistent FLASHATTN_CUDA_HOPPER_BWD_GRID_CTAS=3 timeout "${SANITIZER_LIMIT:-60}" \
      compute-sanitizer --tool $tool --error-exitcode 3 "$tree/tests/cuda/test_cuda_backward_hopper" --gtest_brief=1 \
      --gtest_filter='*TailsOfBothSequences*:*Varlen*:*PersistentGrid*' > "$logs/persistent_$tool.log" 2>&1
    echo "persistent $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/persistent_$tool.log" | tail -1)" | tee -a "$log"
  done
  for extra in "" "--deterministic"; do
    timeout "${TIMING_LIMIT:-120}" "$tree/bench/gpu/kernels/flashattn_hopper_bwd_timing" 20 --grids --quick $extra \
      > "$out/grids${extra:+_deterministic}.csv" 2>> "$logs/timing.err"
    echo "grids $extra rc=$?" | tee -a "$log"; cat "$out/grids${extra:+_deterministic}.csv" | tee -a "$log"
  done
fi

step "variants"
timeout "${VARIANT_LIMIT:-60}" "$tree/bench/gpu/kernels/flashattn_hopper_bwd_timing" 20 --variants > "$out/variants.csv" 2>&1
echo "variants rc=$?" | tee -a "$log"; cat "$out/variants.csv" | tee -a "$log"
step "timing"
timeout "${TIMING_LIMIT:-120}" "$tree/bench/gpu/kernels/flashattn_hopper_bwd_timing" ${TIMING_ARGS:-20 --quick} > "$out/timing.csv" 2> "$logs/timing.err"
echo "timing rc=$?" | tee -a "$log"; cat "$out/timing.csv" | tee -a "$log"
step "anchors"
PYTHONUNBUFFERED=1 timeout "${ANCHOR_LIMIT:-120}" python3 bench/gpu/kernels/hopper_bwd_anchors.py "$out/timing.csv" > "$out/joined.csv" 2> "$logs/anchors.err"
echo "anchors rc=$?" | tee -a "$log"; cat "$out/joined.csv" | tee -a "$log"; tail -5 "$logs/anchors.err" | tee -a "$log"
tar -czf "$out/logs.tar.gz" -C "$logs" .
step "done"
