// src/cuda/decode/kernel_choice.hpp — which split-KV decode kernel runs a call, and how
// many of its CTAs per SM the split heuristic plans for.
//
// PERFORMANCE ONLY: both kernels compute the same result (same tiles, same math,
// same merge; the tests force each on every shape). Host code, no CUDA headers, pure
// functions so the rule is unit-tested without a GPU.
//
//   cp_async  kernel_mma.cuh: 16-byte cp.async by every thread; any sm_80+.
//   tma       kernel_tma.cuh: one producer warp, TMA tensor-map boxes into an mbarrier
//             ring; sm_90 code only, no cache_batch_idx, strides a tensor map encodes.
//
// The rule, from the H100 measurements of 2026-11-25 (bench/results/gpu_decode.md;
// bf16, 32/8 heads, d128, L2-cold, CUDA-graph replay): the TMA kernel wherever it can
// run. Once its consumer loop was cut from 458 to ~200 instructions per tile and warp
// (ncu source counters), it was the faster kernel at every shape measured, contiguous
// and paged; both kernels are issue-bound with one warp per scheduler, and the TMA
// kernel's consumers issue no copies. It runs without the speculative L2 prefetch
// before the PDL wait (that cost 0.5-2.7 us per step at KV 1k).
//
// How many CTAs a step should stream with (split_heuristic.hpp's slots), measured on the
// H100 (2026-11-25, batch 8 / 1 / 2 / 32 / 64, KV 1k-128k): the TMA kernel one per SM and
// about half the SMs where a tile is four 64-key boxes — contiguous caches and pages of
// 64 keys or more (batch 8: 1 split, 64 CTAs, 16.2 us at KV 1k and 48.5 us at 4k against
// 17.3 / 49.9 with 2 splits in clusters; batch 1 / KV 64k: 8 splits 94.6 us, 16 splits
// 95.8; batch 2 / 4k: 4 splits 19.4, 8 splits 20.0, 2 splits 23.7): 64 SMs draw ~2.9
// TB/s, and fewer splits save the merge. With pages of 16 or 32 keys a tile is 8-16
// small boxes and one SM's TMA issue rate limits (page 16, batch 8: 1 split 19.3-19.6 us
// at KV 1k, 64.3 at 4k; 2 splits 17.4 / 50.6): every SM. At d64 a tile carries half the
// bytes for the same instructions, and half the SMs fall behind on long ranges (batch
// 8, KV 16k: 1 split 114.7 us, the cp.async kernel's 4 splits 105.3, paged-16 TMA with
// 2 splits 100.2): every SM; d256 (twice the bytes per key, not measured at half) every
// SM too. The cp.async kernel: two CTAs per SM where the work is long enough
// (split_heuristic.hpp, rule 4).
#pragma once

namespace flashattn::cuda::decode {

enum class DecodeKernel { cp_async, tma };

struct DecodeKernelChoice {
  DecodeKernel kernel = DecodeKernel::cp_async;
  // TMA kernel only: key tiles per CTA prefetched into L2 before griddepcontrol.wait
  // (-1: the ring's stages; 0: none).
  int tma_prefetch_tiles = 0;
  friend constexpr bool operator==(const DecodeKernelChoice&, const DecodeKernelChoice&) = default;
};

// `tma_kernel_can_run`: the call's device has the TMA kernel's sm_90 code and its caches
// fit the tensor maps (launch.hpp: tma_maps_can_describe).
constexpr DecodeKernelChoice choose_decode_kernel(bool tma_kernel_can_run) {
  if (tma_kernel_can_run) return {DecodeKernel::tma, 0};
  return {DecodeKernel::cp_async, 0};
}

// CTAs per SM the split heuristic plans for (SplitProblem::ctas_per_sm). The cp.async
// kernel fits two per SM up to d128 (100 KiB of shared memory each), one at d256.
constexpr int planned_ctas_per_sm(DecodeKernel kernel, int kernel_head_dim) {
  if (kernel == DecodeKernel::tma) return 1;
  return kernel_head_dim <= 128 ? 2 : 1;
}

// SplitProblem::streaming_ctas for the TMA kernel: `box_rows` keys per TMA box
// (tma_config.hpp: 64, or gcd(page_size, 64)).
constexpr long long tma_streaming_ctas(int sm_count, int box_rows, int kernel_head_dim) {
  if (box_rows == 64 && kernel_head_dim == 128) return (sm_count + 1) / 2;
  return sm_count;
}

}  // namespace flashattn::cuda::decode
