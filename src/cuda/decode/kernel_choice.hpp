// src/cuda/decode/kernel_choice.hpp — which split-KV decode kernel runs a call.
//
// PERFORMANCE ONLY: both kernels compute the same result (same tiles, same math,
// same merge; the tests force each on every shape). Host code, no CUDA headers, a
// pure function so the rule is unit-tested without a GPU.
//
//   cp_async  kernel_mma.cuh: 16-byte cp.async by every thread; any sm_80+.
//   tma       kernel_tma.cuh: one producer warp, TMA tensor-map boxes into an mbarrier
//             ring; sm_90 code only (the launcher falls back to cp_async where the TMA
//             kernel cannot run the call: no sm_90 code, cache_batch_idx, strides a
//             tensor map cannot encode).
//
// The rule, from the H100 measurements of 2026-11-25 (bench/results/gpu_decode.md;
// bf16, 32/8 heads, d128, L2-cold, CUDA-graph replay, us per step, cp.async vs TMA
// without pre-wait prefetch):
//   - paged caches with short key ranges: batch 8 / KV 1k 24.6 vs 20.3 (page 16) and
//     24.5 vs 20.6 (page 256); batch 64 / KV 1k 104.1 vs 103.3 and 101.4 vs 102.2 (a
//     tie). The cp.async kernel pays for page-table lookups and per-page addressing in
//     the fixed cost of a short step; a TMA box addresses a page by coordinate.
//   - everywhere else the cp.async kernel is as fast or faster (KV 4k paged: 58.6 vs
//     60.8 and 57.7 vs 59.6; contiguous 1k: 20.7 vs 21.8), so it stays the default.
//   - the TMA kernel's speculative L2 prefetch before the PDL wait cost 0.5-2.7 us
//     per step at KV 1k (and gained 1-2 us at 4k, where the cp.async kernel runs): the
//     rule's TMA runs go without it.
// But the automatic choice does not take the TMA kernel yet (kAutomaticTma = false):
// on the same day compute-sanitizer racecheck reported shared-memory hazards in its
// epilogue (kernel_tma.cuh, the per-warp merge: the merge_scale writes against their
// reads after the __syncthreads between them) on most test shapes, also with its
// pre-wait prefetch on, while the cp.async kernel is clean on the same shapes and every
// result of both kernels matches the reference. Until that report is explained (a
// racecheck blind spot for this kernel's cluster/mbarrier mix, or a real race), the
// default stays on the kernel with a clean report; FLASHATTN_DECODE_KERNEL=tma runs it.
#pragma once

#include <cstdint>

namespace flashattn::cuda::decode {

enum class DecodeKernel { cp_async, tma };

struct DecodeKernelChoice {
  DecodeKernel kernel = DecodeKernel::cp_async;
  // TMA kernel only: key tiles per CTA prefetched into L2 before griddepcontrol.wait
  // (-1: the ring's stages; 0: none).
  int tma_prefetch_tiles = 0;
  friend constexpr bool operator==(const DecodeKernelChoice&, const DecodeKernelChoice&) = default;
};

// Paged caches whose longest key range is at most this many keys run the TMA kernel
// (measured: 1024 wins or ties, 4096 loses; nothing between was measured).
inline constexpr std::int64_t kShortPagedKeyRange = 1024;

// Whether the automatic choice may pick the TMA kernel (see above: not until its
// racecheck report is explained).
inline constexpr bool kAutomaticTma = false;

// `longest_key_range`: the most keys any sequence of the call may attend to, as the
// host knows it (the cache capacity when the lengths live on the device).
// `tma_allowed`: kAutomaticTma for the library's own calls.
constexpr DecodeKernelChoice choose_decode_kernel(bool is_paged, std::int64_t longest_key_range,
                                                  bool tma_allowed = kAutomaticTma) {
  if (tma_allowed && is_paged && longest_key_range <= kShortPagedKeyRange) return {DecodeKernel::tma, 0};
  return {DecodeKernel::cp_async, 0};
}

}  // namespace flashattn::cuda::decode
