// src/cuda/common/fragment.cuh — the score and probability hooks on an accumulator
// fragment: where each kernel calls the hardware-free policies of
// flashattn/score.hpp (ScoreRule) and flashattn/dropout.hpp (DropoutRule).
//
// The m16n8 accumulator layout is the same for mma.sync (sm80 C fragments) and wgmma
// (sm90 D fragments, per warp), PTX ISA §9.7.13.4.2 / §9.7.15.5.1: in a block of 16
// rows × 8·kNTiles columns, lane L holds, of n8 tile j,
//   element 4·j + 2·half + e   at row L/4 + 8·half, column 8·j + 2·(L%4) + e.
// sm80 kernels with several m16 tiles per warp pass each tile's row of the array.
// `row0` below is the row of half 0 (block row + L/4), `col0` the block's first column.
#pragma once

#include <cstdint>

#include "flashattn/dropout.hpp"
#include "flashattn/score.hpp"

namespace flashattn::cuda::fragment {

__device__ __forceinline__ int quad_lane() { return static_cast<int>(threadIdx.x % 4); }

// The sm80 kernels keep a row block of accumulators as kNTiles mma C fragments,
// float[kNTiles][4] (what mma_m16n8k16 takes); these are the same registers as the
// flat float[4 * kNTiles] fragment the hooks below take.
template <int kNTiles>
__device__ __forceinline__ float (&flat(float (&tiles)[kNTiles][4]))[4 * kNTiles] {
  return *reinterpret_cast<float(*)[4 * kNTiles]>(&tiles);
}

// Calls f(value&, half, column in block) for each element the lane holds.
template <int kNTiles, class F>
__device__ __forceinline__ void for_each(float (&acc)[4 * kNTiles], F&& f) {
  const int quad = quad_lane();
#pragma unroll
  for (int j = 0; j < kNTiles; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int e = 0; e < 2; ++e) f(acc[4 * j + 2 * half + e], half, 8 * j + 2 * quad + e);
}

// Scores of raw q·k → ScoreRule::log2_score (called only when the rule is not a plain
// positive scale: the fast path folds the scale into the exponent instead). The ALiBi
// distance row + diagonal − column is one 32-bit add per element from a per-lane base.
template <int kNTiles>
__device__ __forceinline__ void apply_score_rule(float (&s)[4 * kNTiles], const ScoreRule& rule, std::int64_t row0,
                                                 std::int64_t col0) {
  if (!rule.has_bias()) {
#pragma unroll
    for (int i = 0; i < 4 * kNTiles; ++i) s[i] = rule.log2_score_unbiased(s[i]);
    return;
  }
  const int base = static_cast<int>(row0 + rule.diagonal - col0);  // distance of (half 0, column 0)
  for_each<kNTiles>(s, [&](float& value, int half, int col) { value = rule.log2_score_at(value, base + 8 * half - col); });
}

// Dropout on the probabilities of a 16 × 8·kNTiles block (kNTiles even, col0 a
// multiple of 16): dropped entries become 0, kept ones stay unscaled (the kernels fold
// 1/(1 − p) into the output or the gradient). One Philox draw per 8 elements, all of
// them this lane's own (the set DropoutRule::draw defines), so no lane exchange.
template <int kNTiles>
__device__ __forceinline__ void apply_dropout(float (&p)[4 * kNTiles], const DropoutRule& rule,
                                              std::uint32_t batch_head, std::int64_t row0, std::int64_t col0) {
  static_assert(kNTiles % 2 == 0, "a draw spans two n8 tiles");
  const int quad = quad_lane();
#pragma unroll
  for (int pair = 0; pair < kNTiles / 2; ++pair) {
    const philox::Bits128 bits = rule.draw(batch_head, row0, col0 + 16 * pair + 2 * quad);
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const std::uint32_t word = bits.word[2 * half + t];
        float* pair_values = &p[4 * (2 * pair + t) + 2 * half];
        if (!rule.keeps_low(word)) pair_values[0] = 0.0f;
        if (!rule.keeps_high(word)) pair_values[1] = 0.0f;
      }
  }
}

// The keep mask of the same block as bits (bit 4·j + 2·half + e = element of the array),
// for kernels that need the decision twice (the backward: P for dV and dS).
template <int kNTiles>
__device__ __forceinline__ std::uint32_t dropout_keep_bits(const DropoutRule& rule, std::uint32_t batch_head,
                                                           std::int64_t row0, std::int64_t col0) {
  static_assert(kNTiles % 2 == 0 && 4 * kNTiles <= 32, "a draw spans two n8 tiles; 32 bits hold 8 tiles");
  const int quad = quad_lane();
  std::uint32_t keep = 0;
#pragma unroll
  for (int pair = 0; pair < kNTiles / 2; ++pair) {
    const philox::Bits128 bits = rule.draw(batch_head, row0, col0 + 16 * pair + 2 * quad);
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const std::uint32_t word = bits.word[2 * half + t];
        const int bit = 4 * (2 * pair + t) + 2 * half;
        keep |= static_cast<std::uint32_t>(rule.keeps_low(word)) << bit;
        keep |= static_cast<std::uint32_t>(rule.keeps_high(word)) << (bit + 1);
      }
  }
  return keep;
}

}  // namespace flashattn::cuda::fragment
