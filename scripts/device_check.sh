#!/usr/bin/env bash
# scripts/device_check.sh — the GPU verification in one device call (<= 600 s):
#   1. build everything (library, CUDA kernels, tests, CLI, Python module) with ninja -j16
#      into build-bench/tree — the tree bench/gpu/run_all.sh reuses with SKIP_BUILD=1;
#   2. all CTest suites but the Python one (GPU tests run: forward, backward, decode);
#   3. compute-sanitizer memcheck/racecheck/synccheck/initcheck on the reduced sweeps;
#   4. the Python tests on CUDA (vs SDPA, compile, opcheck, graphs, streams) and the
#      per-call overhead benchmark;
#   5. the CLI's run/check on the GPU, the decode benchmark and its SDPA anchor
#      (with DECODE_KERNELS, e.g. "auto,tma", more kernels per shape);
#   6. (step bench, not in the default list) the forward and backward harness
#      (bench/gpu/bench_attention.py: ours beside SDPA FA2 and cuDNN, CSV + PNG;
#      BENCH_PASSES="fwd bwd", HARNESS_ARGS);
#   (step alibi_generic, not in the default list: the ALiBi tests with the per-element form,
#   Hopper, sm80 and decode kernels;
#   steps features / features_sanitize, not in the default list: the masks and FP8
#   suites alone, and compute-sanitizer on their small cases)
#   7. (step masks, not in the default list) bench/gpu/bench_masks.py (issue 15's table and
#      the block-density sweep against FlexAttention, forward and backward; MASKS_ARGS, e.g.
#      '--densities=' in one call and '--masks= --append' in the next; MASKS_LIMIT s);
#   8. (step bwd_timing, not in the default list) flashattn_bwd_timing (bench/gpu/kernels) $BWD_TIMING_ARGS
#      (e.g. "10 --configs 256": the backward's alternative tile configs) into bwd_timing.csv.
#   9. (step fp8_timing, not in the default list) flashattn_fp8_timing $FP8_TIMING_ARGS (default:
#      --quick with the three FP8 schedules beside one bf16 run) into fp8_timing.csv.
#  10. (steps tile_queue and tile_queue_bench, not in the default list) the Hopper forward's
#      tile queue modes (FLASHATTN_CUDA_HOPPER_TILE_QUEUE, FLASHATTN_CUDA_HOPPER_SHORT_MASKED_TILES):
#      their ctest prefixes and compute-sanitizer with the named marks; then bench_attention.py
#      once per mode (fwd, d64/d128, 1k/2k/4k, causal both; TQ_BENCH_ARGS) into
#      tq_<queue>_<tiles>_forward.csv.
# STEPS picks and orders the steps (default "build ctest sanitize python cli decode"), so
# one check can span two device calls on the same warm machine, e.g.
#   STEPS="build ctest sanitize" bash scripts/device_check.sh   then
#   STEPS="python cli decode bench" bash scripts/device_check.sh
# Logs go to $OUT (device.tar.gz + summary.txt, appended to by each call). Dependencies
# the GPU machine lacks (GoogleTest libraries, CLI11 headers) come from .device-deps/
# (carried; made by scripts/make-device-deps.sh).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-$root/build-bench/out}
logs=$root/build-bench/device-logs
tree=$root/build-bench/tree
mkdir -p "$out" "$logs"
started=$(date +%s)
step() { echo "=== [$(( $(date +%s) - started ))s] $*" | tee -a "$logs/summary.txt"; }
note() { echo "$*" | tee -a "$logs/summary.txt"; }

steps=" ${STEPS:-build ctest sanitize python cli decode} "
wants() { [[ "$steps" == *" $1 "* ]]; }
{ echo "--- steps:$steps"; date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nvcc --version | tail -1
  git log -1 --format='commit %H %s' 2>/dev/null; } >> "$logs/summary.txt" 2>&1
tail -6 "$logs/summary.txt"

if wants build; then
step "configure + build"
deps=$root/.device-deps
cmake -S . -B "$tree" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a-real -DFLASHATTN_BUILD_PYTHON=ON -DFLASHATTN_BUILD_TESTS=ON \
  -DFLASHATTN_BUILD_TOOLS=ON -DGTEST_ROOT="$deps/gtest" -DCLI11_INCLUDE_DIR="$deps" \
  -DPython_EXECUTABLE="$(command -v python3)" ${CMAKE_ARGS:-} > "$logs/build.log" 2>&1
( time timeout "${BUILD_LIMIT:-330}" ninja -C "$tree" -j16 -k 0 ) >> "$logs/build.log" 2>&1
note "build rc=$? ($(grep -c FAILED "$logs/build.log") failed steps) $(grep real "$logs/build.log" | tail -1)"
grep -A8 FAILED "$logs/build.log" | head -30
fi

if wants ctest; then
step "ctest (all but python)"
(cd "$tree" && timeout "${CTEST_LIMIT:-150}" ctest -j6 -E python_tests --timeout 140 > "$logs/ctest.log" 2>&1)
note "ctest rc=$? $(grep -E 'tests passed|tests failed' "$logs/ctest.log")"
grep -E "\*\*\*Failed|\*\*\*Timeout|Exception" "$logs/ctest.log" | head -20 | tee -a "$logs/summary.txt"
fi

if wants sanitize; then
step "compute-sanitizer"
sanitize() {  # tool binary filter
  timeout 60 compute-sanitizer --tool "$1" --error-exitcode 3 "$tree/tests/cuda/$2" --gtest_brief=1 --gtest_filter="$3" \
    >> "$logs/sanitizer.log" 2>&1
  note "$1 $2 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/sanitizer.log" | tail -1)"
}
for tool in memcheck racecheck synccheck initcheck; do sanitize $tool test_cuda_forward 'Reduced/ForwardSanitizer.*'; done
for tool in memcheck racecheck synccheck; do sanitize $tool test_cuda_forward_hopper 'Reduced/HopperForwardSanitizer.*'; done
for tool in memcheck racecheck; do sanitize $tool test_cuda_backward '*SanitizerSweep*:*NoNan*'; done
# The Hopper backward kernels (d64/d128 and the wide d256 one; GQA, varlen with empty sequences).
sanitize memcheck test_cuda_backward_hopper 'CudaBackwardHopper.GroupedQueryAttention:CudaBackwardHopper.VarlenWithEmptyAndSingleTokenSequences'
sanitize memcheck test_cuda_kvcache 'Shapes/KVCacheCuda.MatchesReferenceAndAppendsExactly/1*:KVCacheCudaProperties.ZeroLength*'
sanitize racecheck test_cuda_kvcache 'Shapes/KVCacheCuda.MatchesReferenceAndAppendsExactly/2:Shapes/KVCacheCuda.MatchesReferenceAndAppendsExactly/29'
# The variant layer's new paths: ALiBi and dropout on every training kernel, ALiBi in decode,
# and the device guard on a block_table entry past the page pool (must read nothing out of range).
sanitize memcheck test_cuda_forward_variants 'Sm80ForwardDropout.*:AwkwardShapes/Sm80ForwardVariants.MatchesFloat64Reference/1*'
sanitize memcheck test_cuda_backward_variants 'Sm80BackwardVariants.AlibiWithDropoutSoftcapAndWindow:Sm80BackwardVariants.VarlenWithEmptySequences'
for tool in memcheck racecheck; do
  sanitize $tool test_cuda_forward_hopper_variants 'HopperVariantTest.DropoutMaskEqualsDropoutRuleElementByElement:Cases/HopperVariantVsReference.MatchesFloat64Reference/2*'
done
sanitize memcheck test_cuda_backward_hopper 'CudaBackwardHopper.AlibiMatchesTheOracle:CudaBackwardHopper.DeterministicModeWithAlibiAndDropout'
sanitize memcheck test_cuda_kvcache 'BothKernels/KVCacheCudaAlibi.MatchesReference/1*'
sanitize memcheck test_cuda_hostile_input 'CudaHostile.*'
fi

if wants features; then
step "masks and FP8 suites"
for t in test_cuda_masks test_cuda_masks_sm80_backward test_cuda_masks_hopper test_cuda_masks_hopper_bwd \
         test_cuda_forward_fp8 test_cuda_kvcache_fp8 test_cuda_fp8_quantize; do
  timeout "${FEATURE_LIMIT:-100}" "$tree/tests/cuda/$t" --gtest_brief=1 > "$logs/$t.log" 2>&1
  note "$t rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' "$logs/$t.log" | head -2 | tr '\n' ' ')"
  grep -E '^\[  FAILED|Failure|what\(\)' "$logs/$t.log" | head -6 | tee -a "$logs/summary.txt"
done
fi

if wants alibi_generic; then
step "ALiBi tests with the per-element form everywhere (FLASHATTN_CUDA_ALIBI_PATH=generic)"
for t in test_cuda_forward_hopper_variants test_cuda_backward_hopper test_cuda_forward_variants test_cuda_backward_variants \
         test_cuda_kvcache; do
  FLASHATTN_CUDA_ALIBI_PATH=generic timeout 120 "$tree/tests/cuda/$t" --gtest_brief=1 --gtest_filter='*Alibi*:*ALiBi*:*Variant*' > "$logs/alibi_generic_$t.log" 2>&1
  note "alibi generic $t rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' "$logs/alibi_generic_$t.log" | head -2 | tr '\n' ' ')"
done
fi

if wants features_sanitize; then
step "compute-sanitizer on the masks and FP8 kernels"
fsan() { timeout "${FSAN_LIMIT:-90}" compute-sanitizer --tool "$1" --error-exitcode 3 "$tree/tests/cuda/$2" --gtest_brief=1 --gtest_filter="$3" \
  >> "$logs/sanitizer_features.log" 2>&1; note "$1 $2 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/sanitizer_features.log" | tail -1)"; }
fsan memcheck test_cuda_masks '*Masks*Small*'
fsan memcheck test_cuda_masks_sm80_backward '*Masks*Small*'
fsan racecheck test_cuda_masks '*Masks*Small*'
fsan memcheck test_cuda_kvcache_fp8 '*/1:*/7'
# The FP8 forward's in-place, ping-pong and overlap schedules: tails at d64/d80/d128/d256,
# window, varlen with empty sequences, seqlen_k = 0, long causal varlen (every ring stage reused).
fp8_cases="3 11 19 27 43 50 54 58 63 70 74 78 83 90 94 98"
for schedule in InPlace PingPong Overlap OverlapPingPong; do
  filter=$(for c in $fp8_cases; do printf '%s/*/case%s:' "$schedule" "$c"; done)
  for tool in racecheck synccheck memcheck; do fsan $tool test_cuda_forward_fp8 "${filter%:}"; done
done
# The wide key tiles (OverlapN192/OverlapN224 hold the d128, d80, d96 cases, OverlapN160 the
# d64 ones): keys below one block, tails, padded d80 (d128), window, varlen with empty
# sequences, seqlen_k = 0, long causal (dense and varlen), whole wide blocks (1344 keys,
# causal 448 and 960).
fp8_wide_cases="2 3 6 11 27 34 38 40 42 44 46 47"
for schedule in OverlapN192 OverlapN224; do
  filter=$(for c in $fp8_wide_cases; do printf '%s/*/case%s:' "$schedule" "$c"; done)
  for tool in racecheck synccheck memcheck; do fsan $tool test_cuda_forward_fp8 "${filter%:}"; done
done
fp8_d64_wide_cases="2 3 6 11 18 22 24 26 28 31"
filter=$(for c in $fp8_d64_wide_cases; do printf 'OverlapN160/*/case%s:' "$c"; done)
for tool in racecheck synccheck memcheck; do fsan $tool test_cuda_forward_fp8 "${filter%:}"; done
fi

export PYTHONUNBUFFERED=1 PYTHONPATH="$tree/python"
if wants python; then
step "python tests (CUDA)"
timeout "${PYTEST_LIMIT:-150}" python3 -m pytest python/tests -q -rs -x --timeout 120 -p no:cacheprovider > "$logs/pytest.log" 2>&1
note "pytest rc=$? $(tail -1 "$logs/pytest.log")"
grep -E "^FAILED|Error" "$logs/pytest.log" | head -10 | tee -a "$logs/summary.txt"
timeout 60 python3 bench/python/overhead.py --out "$logs/python_overhead.csv" > "$logs/overhead.log" 2>&1
note "overhead rc=$?"; tail -8 "$logs/overhead.log" | tee -a "$logs/summary.txt"
fi

if wants cli; then
step "CLI on the GPU"
timeout 60 "$tree/tools/flashattn" run 2>&1 | tee "$logs/cli.log" | tail -8 | tee -a "$logs/summary.txt"
timeout 60 "$tree/tools/flashattn" check --device cuda --backward >> "$logs/cli.log" 2>&1
note "check --device cuda --backward rc=$? $(tail -1 "$logs/cli.log")"
fi

if wants decode; then
step "decode benchmark + SDPA anchor"
decode_bench=$(find "$tree" -name decode_bench -type f -perm -u+x | head -1)
DECODE_BENCH_KERNELS=${DECODE_KERNELS:-auto} timeout "${DECODE_LIMIT:-90}" "$decode_bench" "$logs/gpu_decode.csv" > "$logs/decode.log" 2>&1
note "decode_bench (kernels ${DECODE_KERNELS:-auto}) rc=$?"
timeout 60 python3 bench/gpu/decode_anchor.py "$logs/gpu_decode_anchor.csv" >> "$logs/decode.log" 2>&1; note "decode_anchor rc=$?"
tail -30 "$logs/decode.log" | tee -a "$logs/summary.txt"
fi

if wants bench; then
step "forward and backward harness (ours beside SDPA FA2 and cuDNN)"
for pass in ${BENCH_PASSES:-fwd bwd}; do
  impls=$([ $pass = fwd ] && echo "fa2,cudnn,ours,ours_flash2" || echo "fa2,cudnn,ours,ours_det")
  timeout "$([ $pass = fwd ] && echo "${FWD_LIMIT:-150}" || echo "${BWD_LIMIT:-240}")" python3 bench/gpu/bench_attention.py \
    --passes $pass --impls "$impls" --out-dir "$logs" ${HARNESS_ARGS:-} > "$logs/harness_$pass.log" 2>&1
  note "harness $pass rc=$? $(grep -c '' "$logs/harness_$pass.log") lines"
  grep -m3 -i 'error\|traceback' "$logs/harness_$pass.log" | tee -a "$logs/summary.txt"
done
fi

if wants masks; then
step "mask benchmark (ours beside FlexAttention, SDPA dense mask, cuDNN bias)"
# shellcheck disable=SC2086
timeout "${MASKS_LIMIT:-540}" python3 bench/gpu/bench_masks.py --out-dir "$logs" ${MASKS_ARGS:-} > "$logs/masks.log" 2>&1
note "bench_masks rc=$?"; grep -v '^$' "$logs/masks.log" | tail -60 | tee -a "$logs/summary.txt"
fi

if wants bwd_timing; then
step "flashattn_bwd_timing ${BWD_TIMING_ARGS:-10 --configs}"
# shellcheck disable=SC2086
timeout "${BWD_TIMING_LIMIT:-150}" "$tree/bench/gpu/kernels/flashattn_bwd_timing" ${BWD_TIMING_ARGS:-10 --configs} > "$logs/bwd_timing.csv" 2> "$logs/bwd_timing.err"
note "bwd_timing rc=$?"; cat "$logs/bwd_timing.csv" | tee -a "$logs/summary.txt"
fi

if wants fp8_timing; then
step "flashattn_fp8_timing ${FP8_TIMING_ARGS:---quick --schedules copy,in_place,ping_pong}"
# shellcheck disable=SC2086
timeout "${FP8_TIMING_LIMIT:-200}" "$tree/bench/gpu/kernels/flashattn_fp8_timing" ${FP8_TIMING_ARGS:---quick --schedules copy,in_place,ping_pong} > "$logs/fp8_timing.csv" 2> "$logs/fp8_timing.err"
note "fp8_timing rc=$?"; cat "$logs/fp8_timing.csv" | tee -a "$logs/summary.txt"
fi

if wants tile_queue; then
step "Hopper forward tile queue: late claim, named marks, short masked on the unmasked config"
(cd "$tree" && timeout "${TQ_CTEST_LIMIT:-150}" ctest -j6 --timeout 140 \
  -R '^(late_claim|late_claim_registers|late_claim_mbarrier|short_masked_unmasked)\.' > "$logs/ctest_tile_queue.log" 2>&1)
note "ctest tile_queue rc=$? $(grep -E 'tests passed|tests failed' "$logs/ctest_tile_queue.log")"
grep -E "\*\*\*Failed|\*\*\*Timeout|Exception" "$logs/ctest_tile_queue.log" | head -20 | tee -a "$logs/summary.txt"
tq_filter='Reduced/HopperForwardSanitizer.*:HopperForwardTest.PersistentGridRunsSeveralTilesPerCta:HopperForwardTest.PersistentTilesBackToBack'
for epilogue in tma_overlap registers; do
  for tool in racecheck synccheck memcheck; do
    FLASHATTN_CUDA_HOPPER_TILE_QUEUE=late_claim FLASHATTN_CUDA_HOPPER_EPILOGUE=$epilogue timeout 90 \
      compute-sanitizer --tool $tool --error-exitcode 3 "$tree/tests/cuda/test_cuda_forward_hopper" --gtest_brief=1 \
      --gtest_filter="$tq_filter" >> "$logs/sanitizer_tile_queue.log" 2>&1
    note "late_claim $epilogue $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/sanitizer_tile_queue.log" | tail -1)"
  done
done
fi

if wants tile_queue_bench; then
step "Hopper forward tile queue modes, timed (bench_attention.py, one process per mode)"
for mode in early_claim late_claim_mbarrier late_claim early_claim:unmasked late_claim:unmasked; do
  queue=${mode%%:*}; tiles=$([[ $mode == *:unmasked ]] && echo unmasked || echo default)
  FLASHATTN_CUDA_HOPPER_TILE_QUEUE=$queue FLASHATTN_CUDA_HOPPER_SHORT_MASKED_TILES=$tiles \
    timeout "${TQ_BENCH_LIMIT:-100}" python3 bench/gpu/bench_attention.py --passes fwd --sweeps fa3_d64,fa3_d128 \
    --seqlens 1024,2048,4096 --causal both --impls cudnn,ours_flash3 --out-dir "$logs" \
    --prefix "tq_${queue}_${tiles}_" ${TQ_BENCH_ARGS:-} > "$logs/tq_bench_${queue}_${tiles}.log" 2>&1
  note "bench $queue tiles=$tiles rc=$?"; grep -E 'ours_flash3' "$logs/tq_bench_${queue}_${tiles}.log" | tail -12 | tee -a "$logs/summary.txt"
done
fi

step "done"
tar -czf "$out/device.tar.gz" -C "$logs" . 2>/dev/null
cp "$logs/summary.txt" "$out/"
for f in gpu_decode.csv gpu_decode_anchor.csv python_overhead.csv gpu_forward.csv gpu_backward.csv bwd_timing.csv fp8_timing.csv gpu_masks.csv gpu_masks.png; do [ -f "$logs/$f" ] && cp "$logs/$f" "$out/"; done
for f in "$logs"/tq_*_forward.csv; do [ -f "$f" ] && cp "$f" "$out/"; done
