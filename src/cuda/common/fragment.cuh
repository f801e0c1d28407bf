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


// ---- the backward's score hook, and transposed fragments ----------------------------
// The sm90 backward (hopper_bwd/kernel.cuh) computes Sᵀ = K Qᵀ (FA3's SwapAB), so its
// accumulator rows are keys and its columns queries: lane L holds, of n8 tile j,
//   element 4·j + 2·half + e   at key key_row0 + 8·half, query query_col0 + 8·j + 2·(L%4) + e,
// key_row0 = the block's first key + L/4 (a 16-key block), query_col0 a multiple of 16.
// for_each iterates it as well (its "column" is then the query in the block).

// Calls f(index, log2 score, gradient factor) for each element of a fragment of raw
// q·k (ScoreRule::log2_score_at and ::gradient_factor), for a backward pass that
// needs both from one dot product: the score for P, the factor for dS. f may overwrite
// dot[index] (the dot product is read first). kTransposed: the layout above (row0 =
// key_row0, col0 = query_col0), else the plain one (row0 = query row of half 0, col0 =
// the first key). The ALiBi distance (query + diagonal − key) is one 32-bit add per
// element from a per-lane base.
template <int kNTiles, bool kTransposed, class F>
__device__ __forceinline__ void for_each_score(const float (&dot)[4 * kNTiles], const ScoreRule& rule,
                                               std::int64_t row0, std::int64_t col0, F&& f) {
  const int quad = quad_lane();
  // Distance of (half 0, column 0 of the block): plain, row0 is the query; transposed, col0 is.
  const int base = static_cast<int>(kTransposed ? col0 + rule.diagonal - row0 : row0 + rule.diagonal - col0);
#pragma unroll
  for (int j = 0; j < kNTiles; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int index = 4 * j + 2 * half + e;
        const int offset = 8 * half - (8 * j + 2 * quad + e);  // (row − row0) − (column − col0)
        const int distance = kTransposed ? base - offset : base + offset;
        const float value = dot[index];
        // Both rule calls under one softcap test: the compiler then shares their tanh
        // (with the tests apart it computed tanh twice: PTX, 64 vs 32 rcp per 32 elements).
        float score, factor = 1.0f;
        if (rule.has_softcap()) {
          score = rule.log2_score_at(value, distance);
          factor = rule.gradient_factor(value);
        } else {
          score = rule.log2_score_at(value, distance);
        }
        f(index, score, factor);
      }
}

// dropout_keep_bits for the transposed layout: bit 4·j + 2·half + e = the decision of
// the lane's element 4·j + 2·half + e, the same decision DropoutRule::keep(batch_head,
// query, key) gives (kNTiles even and ≤ 8: a 16-query block per draw pair, 32 bits).
//
// A draw covers queries {r, r + 8} × keys {c, c + 1, c + 8, c + 9} (dropout.hpp), and
// its number 4·(query bit 3) + 2·(key bit 3) + (key bit 0) sits in word
// 2·(query bit 3) + (key bit 3), 16-bit half (key bit 0). Of the 16-query block p the
// lane holds queries query_col0 + 16p + 2·(L%4) + e + 8t (t = query bit 3) × keys
// key_row0 + 8·half (key bit 3 = half), so:
//   e = 0 and e = 1 are two draws, r = query_col0 + 16p + 2·(L%4) + e (bit 3 clear),
//   c = key_row0 with bit 0 cleared (key_row0's bit 3 is clear: L/4 < 8),
//   element 8p + 4t + 2·half + e is half (key bit 0) of word 2t + half of draw e.
// Lane L^4 holds the other key of each pair (key_row0 ± 1: L/4 differs in bit 0) and
// the same queries: it needs the same two draws, the other 16-bit halves. So each lane
// draws only e = (its key bit 0), keeps its own halves, and passes the partner's halves
// by one __shfl_xor_sync(…, 4): the partner's draw e' = 1 − e is, for this lane, its
// elements with e = e'. One draw per 8 of the lane's elements, as in the plain layout.
// Call from all 32 lanes (a warp shuffle).
template <int kNTiles>
__device__ __forceinline__ std::uint32_t dropout_keep_bits_transposed(const DropoutRule& rule,
                                                                      std::uint32_t batch_head,
                                                                      std::int64_t key_row0,
                                                                      std::int64_t query_col0) {
  static_assert(kNTiles % 2 == 0 && 4 * kNTiles <= 32, "a draw pair spans two n8 tiles; 32 bits hold 8 tiles");
  const int key_bit0 = static_cast<int>(key_row0 & 1);  // = (L/4) & 1, which draw this lane makes
  const std::int64_t key_base = key_row0 & ~std::int64_t{1};
  const std::int64_t query_base = query_col0 + 2 * quad_lane() + key_bit0;
  std::uint32_t mine = 0, partners = 0;  // both at the bit of this lane's element with e = key_bit0
#pragma unroll
  for (int block = 0; block < kNTiles / 2; ++block) {
    const philox::Bits128 bits = rule.draw(batch_head, query_base + 16 * block, key_base);
#pragma unroll
    for (int word = 0; word < 4; ++word) {  // word = 2t + half: element bit 8·block + 2·word + e
      const bool low = rule.keeps_low(bits.word[word]), high = rule.keeps_high(bits.word[word]);
      const int bit = 8 * block + 2 * word + key_bit0;
      mine |= static_cast<std::uint32_t>(key_bit0 ? high : low) << bit;
      partners |= static_cast<std::uint32_t>(key_bit0 ? low : high) << bit;
    }
  }
  // The partner's `partners` sit at its e = 1 − key_bit0: this lane's bits of that draw.
  return mine | __shfl_xor_sync(0xffffffffu, partners, 4);
}

}  // namespace flashattn::cuda::fragment
