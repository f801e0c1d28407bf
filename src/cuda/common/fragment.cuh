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
// for_each_element walks that layout; every hook below, and the decode kernels' score
// step (decode/kernel_mma.cuh score_tile), reads an element's row and column from it.
#pragma once

#include <climits>
#include <cstdint>

#include "flashattn/dropout.hpp"
#include "flashattn/score.hpp"
#include "src/cuda/common/dropout_fragment.hpp"

namespace flashattn::cuda::fragment {

__device__ __forceinline__ int quad_lane() { return static_cast<int>(threadIdx.x % 4); }

// The sm80 kernels keep a row block of accumulators as kNTiles mma C fragments,
// float[kNTiles][4] (what mma_m16n8k16 takes); these are the same registers as the
// flat float[4 * kNTiles] fragment the hooks below take.
template <int kNTiles>
__device__ __forceinline__ float (&flat(float (&tiles)[kNTiles][4]))[4 * kNTiles] {
  return *reinterpret_cast<float(*)[4 * kNTiles]>(&tiles);
}

// Calls f(index, row, column) for each element of a lane's 16 × 8·kNTiles fragment, in
// register order; row and column are offsets from the lane's element 0 (half 0, e = 0 of
// n8 tile 0: row L/4, column 2·(L%4) of the block), compile-time constants once unrolled:
//   element 4·j + 2·half + e   at row 8·half, column 8·j + kPairStride·e.
// kPairStride is the column distance between a lane's e = 0 and e = 1 elements: 1 in
// the PTX layout; a kernel that permutes its key columns to suit its loads passes its
// own (the FP8 KV-cache decode's interleave, decode/kernel_mma_fp8.cuh: 4 at d >= 128).
template <int kNTiles, int kPairStride = 1, class F>
__device__ __forceinline__ void for_each_element(F&& f) {
#pragma unroll
  for (int j = 0; j < kNTiles; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int e = 0; e < 2; ++e) f(4 * j + 2 * half + e, 8 * half, 8 * j + kPairStride * e);
}

// Scores of raw q·k → ScoreRule::log2_score (called only when the rule is not a plain
// positive scale: the fast path folds the scale into the exponent instead). The ALiBi
// distance row + diagonal − column is one float add per element from a per-lane base.
// Each rule test is made once per call, outside the element loop: tested per element
// (inside log2_score_unbiased), the softcap test stayed one uniform branch around each
// element (sm90 d128 SASS: 64 taken branches per 128-key block, the elements' FMULs
// in 128 basic blocks that ptxas could not interleave — most of ALiBi's 37-42% cost).
// kSplitOnBias: one copy of the loop per (softcap, bias) pair instead of per softcap
// branch (the bias test is then a predicated FFMA): fewer spills in the sm90 forward's
// d128 kernels, more in d64's three consumer warpgroups (ptxas -v, 4-20 bytes).
template <int kNTiles, bool kSplitOnBias = true>
__device__ __forceinline__ void apply_score_rule(float (&s)[4 * kNTiles], const ScoreRule& rule, std::int64_t row0,
                                                 std::int64_t col0) {
  // Distance of this lane's (half 0, e = 0) element of n8 tile 0, as a float: each
  // element then adds a compile-time offset (no int-to-float per element).
  const float base = static_cast<float>(row0 + rule.diagonal - col0 - 2 * quad_lane());
  auto apply = [&]() {
    for_each_element<kNTiles>([&](int index, int row, int column) {
      s[index] = rule.log2_score_at_distance(s[index], base + static_cast<float>(row - column));
    });
  };
  // The same loop under each branch: inside, the rule's own tests are known and fold.
  if (rule.has_softcap()) {
    if (kSplitOnBias && rule.has_bias()) apply();
    else apply();
  } else {
    if (kSplitOnBias && rule.has_bias()) apply();
    else apply();
  }
}

// ScoreRule::SideBounds and RowSideBounds in 32 bits, for one compare pair per block:
// key and query positions are 32-bit coordinates (TMA, and the launches' size checks),
// and clamping a bound to 32 bits keeps every comparison with such a position. The
// defaults put every block on no side (the affine form off).
__device__ __forceinline__ std::int32_t clamp_to_int32(std::int64_t x) {
  return static_cast<std::int32_t>(x < INT32_MIN ? INT32_MIN : (x > INT32_MAX ? INT32_MAX : x));
}
struct ColumnBlockSides {  // key blocks move past fixed rows (the forward)
  std::int32_t last_left = INT32_MIN;
  std::int32_t first_right = INT32_MAX;
  __device__ __forceinline__ static ColumnBlockSides of(const ScoreRule::SideBounds& bounds) {
    return {clamp_to_int32(bounds.last_left), clamp_to_int32(bounds.first_right)};
  }
  __device__ __forceinline__ DiagonalSide side(std::int32_t col_first) const {
    if (col_first <= last_left) return DiagonalSide::left;
    if (col_first >= first_right) return DiagonalSide::right;
    return DiagonalSide::straddles;
  }
};
struct RowBlockSides {  // query blocks move past fixed keys (the backward)
  std::int32_t first_left = INT32_MAX;
  std::int32_t last_right = INT32_MIN;
  __device__ __forceinline__ static RowBlockSides of(const ScoreRule::RowSideBounds& bounds) {
    return {clamp_to_int32(bounds.first_left), clamp_to_int32(bounds.last_right)};
  }
  __device__ __forceinline__ DiagonalSide side(std::int32_t row_first) const {
    if (row_first >= first_left) return DiagonalSide::left;
    if (row_first <= last_right) return DiagonalSide::right;
    return DiagonalSide::straddles;
  }
};

// ALiBi's affine form (ScoreRule::affine_*) for one lane over one tile of rows: what
// the lane computes once per tile, so that a key block costs two compares (its side)
// and one FFMA per element.
struct AffineBiasLane {
  float dot_scale = 0.0f;     // ScoreRule::affine_dot_scale()
  ColumnBlockSides sides;     // of the rows that take one branch together
  std::int32_t distance = 0;  // row0 + diagonal − 2·quad: the lane's distance to column 0

  // `rule` with has_affine_bias(), `bounds` = rule.side_bounds over the rows that take
  // one branch together (a warp's 16, say), row0 as in the fragment layout above.
  __device__ __forceinline__ static AffineBiasLane of(const ScoreRule& rule, const ScoreRule::SideBounds& bounds,
                                                      std::int64_t row0) {
    AffineBiasLane lane;
    lane.dot_scale = rule.affine_dot_scale();
    lane.sides = ColumnBlockSides::of(bounds);
    lane.distance = static_cast<std::int32_t>(row0 + rule.diagonal - 2 * quad_lane());
    return lane;
  }
  __device__ __forceinline__ DiagonalSide side(std::int32_t col0) const { return sides.side(col0); }
};

// ALiBi in its affine form on the block of columns from col0, whose elements lie on
// kSide of the diagonal (lane.side(col0)): s[i] becomes x = dot · dot_scale ± (column −
// the lane's first column), one FFMA with a compile-time offset per element, and
// row_offset[half] the offset of the lane's row of that half, so that an element's log2
// score is rule.affine_log2_score(x, row_offset[half]).
template <int kNTiles, DiagonalSide kSide>
__device__ __forceinline__ void apply_affine_bias(float (&s)[4 * kNTiles], const ScoreRule& rule,
                                                  const AffineBiasLane& lane, std::int32_t col0,
                                                  float (&row_offset)[2]) {
  static_assert(kSide != DiagonalSide::straddles, "the affine form holds on one side of the diagonal");
  // The lane's first column is col0 + 2·quad (in lane.distance): element columns are 8·j + e further.
  const float distance0 = static_cast<float>(lane.distance - col0);
  row_offset[0] = rule.affine_row_offset(kSide, distance0);
  row_offset[1] = rule.affine_row_offset(kSide, distance0 + 8.0f);
  for_each_element<kNTiles>([&](int index, int, int column) {
    s[index] = ScoreRule::affine_x(s[index], lane.dot_scale, kSide, static_cast<float>(column));
  });
}

// Dropout on the probabilities of a 16 × 8·kNTiles block (kNTiles even, col0 a
// multiple of 16): dropped entries become 0, kept ones stay unscaled (the kernels fold
// 1/(1 − p) into the output or the gradient). One Philox draw per 16 elements of a
// 32-column block, all of them this lane's own (the set DropoutRule::draw defines), so
// no lane exchange (dropout_fragment.hpp: blocks not aligned to 32 columns; kAligned:
// col0 is a multiple of 32).
template <int kNTiles, bool kAligned = false>
__device__ __forceinline__ void apply_dropout(float (&p)[4 * kNTiles], const DropoutRule& rule,
                                              std::uint32_t batch_head, std::int64_t row0, std::int64_t col0) {
  std::uint32_t keep[(kNTiles + 7) / 8];
  dropout_keep_words<kNTiles, kAligned>(rule, batch_head, row0, col0, quad_lane(), keep);
#pragma unroll
  for (int i = 0; i < 4 * kNTiles; ++i)
    if (((keep[i / 32] >> (i % 32)) & 1u) == 0) p[i] = 0.0f;
}

// The keep mask of the same block as bits (bit 4·j + 2·half + e = element of the array),
// for kernels that need the decision twice (the backward: P for dV and dS).
template <int kNTiles>
__device__ __forceinline__ std::uint32_t dropout_keep_bits(const DropoutRule& rule, std::uint32_t batch_head,
                                                           std::int64_t row0, std::int64_t col0) {
  static_assert(kNTiles % 2 == 0 && 4 * kNTiles <= 32, "16-column halves of draws; 32 bits hold 8 tiles");
  std::uint32_t keep[1];
  dropout_keep_words<kNTiles>(rule, batch_head, row0, col0, quad_lane(), keep);
  return keep[0];
}


// ---- the backward's score hook, and transposed fragments ----------------------------
// The sm90 backward (hopper_bwd/kernel.cuh) computes Sᵀ = K Qᵀ (FA3's SwapAB), so its
// accumulator rows are keys and its columns queries: lane L holds, of n8 tile j,
//   element 4·j + 2·half + e   at key key_row0 + 8·half, query query_col0 + 8·j + 2·(L%4) + e,
// key_row0 = the block's first key + L/4 (a 16-key block), query_col0 a multiple of 16.

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
  const int base_int = static_cast<int>(kTransposed ? col0 + rule.diagonal - row0 : row0 + rule.diagonal - col0);
  // As a float with the lane's 2·quad folded in: per element one add of a compile-time
  // offset (no int-to-float conversion per element; see ScoreRule::with_bias_at).
  const float base = static_cast<float>(kTransposed ? base_int + 2 * quad : base_int - 2 * quad);
  for_each_element<kNTiles>([&](int index, int row, int column) {
    const int offset = row - column;  // (row − row0) − (column − col0), less the lane's 2·quad
    const float distance = kTransposed ? base - static_cast<float>(offset) : base + static_cast<float>(offset);
    const float value = dot[index];
    // Both rule calls under one softcap test: the compiler then shares their tanh
    // (with the tests apart it computed tanh twice: PTX, 64 vs 32 rcp per 32 elements).
    // The test stays per element (a uniform branch): hoisted out of the loop, the two
    // copies of the caller's per-element work spilled the sm90 backward (180 bytes at
    // d128); the kernels keep ALiBi off this loop except on diagonal blocks.
    float score, factor = 1.0f;
    if (rule.has_softcap()) {
      score = rule.log2_score_at_distance(value, distance);
      factor = rule.gradient_factor(value);
    } else {
      score = rule.log2_score_at_distance(value, distance);
    }
    f(index, score, factor);
  });
}

// dropout_keep_bits for the transposed layout: bit 4·j + 2·half + e = the decision of
// the lane's element 4·j + 2·half + e, the same decision DropoutRule::keep(batch_head,
// query, key) gives (kNTiles even and ≤ 8: a 16-query block per draw pair, 32 bits).
// Each lane draws for its own key and its partner's (lane L ^ 4, the other key of the
// pair) and exchanges one word with it (dropout_fragment.hpp derives the mapping;
// tests/core checks it against DropoutRule::keep for all 32 lanes).
// Call from all 32 lanes (a warp shuffle).
template <int kNTiles>
__device__ __forceinline__ std::uint32_t dropout_keep_bits_transposed(const DropoutRule& rule,
                                                                      std::uint32_t batch_head,
                                                                      std::int64_t key_row0,
                                                                      std::int64_t query_col0) {
  const TransposedKeepHalves halves =
      dropout_keep_halves_transposed<kNTiles>(rule, batch_head, key_row0, query_col0, quad_lane());
  // The partner's `partners` sit at its e = 1 − its key bit 0: this lane's bits of that draw.
  return halves.mine | __shfl_xor_sync(0xffffffffu, halves.partners, 4);
}

}  // namespace flashattn::cuda::fragment
