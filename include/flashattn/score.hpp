// flashattn/score.hpp — the score rule: how the dot product q·k of query row i and
// key column j becomes the score that enters the softmax. One definition for the
// reference, the CPU flash paths and every CUDA kernel, so a score modifier (softcap,
// ALiBi, an FP8 descale) is written once.
//
//   s(i, j) = cap(scale · q_i·k_j) − slope · |i + seqlen_k − seqlen_q − j|
//   cap(x)  = softcap · tanh(x / softcap)      (identity when softcap is off)
//
// The ALiBi bias is flash_attn's: added after the softcap, its distance aligned to
// the bottom-right corner like the causal mask. Kernels work in log2 units (the
// softmax is taken with exp2), so the rule returns s(i, j) · log2(e).
//
// Fast path: when the rule is a plain positive scale (no softcap, no bias), max and
// scale commute, so a kernel may take the row max of raw q·k and fold the scale into
// the exponent's FMA (2^(dot · scale_log2 − m)); is_positive_scale() says when.
#pragma once

#include <cmath>
#include <cstdint>

#include "flashattn/config.hpp"
#include "flashattn/mask.hpp"

namespace flashattn {

// Where a block of (row, column) elements lies relative to the rows' diagonals
// (column = row + diagonal): the sign of every distance row + diagonal − column.
enum class DiagonalSide : int {
  left = 1,       // every column ≤ its row's diagonal column: distance ≥ 0
  right = -1,     // every column ≥ its row's diagonal column: distance ≤ 0
  straddles = 0,  // both signs
};

struct ScoreRule {
  float scale_log2 = 1.0f;           // softmax_scale · log2(e): the whole rule on the fast path
  float softcap_input_scale = 0.0f;  // softmax_scale / softcap; 0 = no softcap
  float softcap_log2 = 0.0f;         // softcap · log2(e)
  float alibi_slope_log2 = 0.0f;     // slope · log2(e) of this (batch, head); 0 = no bias
  std::int64_t diagonal = 0;         // seqlen_k − seqlen_q: the column of row i's diagonal is i + diagonal

  FLASHATTN_HOST_DEVICE bool has_softcap() const { return softcap_input_scale != 0.0f; }
  FLASHATTN_HOST_DEVICE bool has_bias() const { return alibi_slope_log2 != 0.0f; }
  FLASHATTN_HOST_DEVICE bool is_positive_scale() const { return !has_softcap() && !has_bias(); }

  // The position-free part: cap(scale · dot) · log2(e).
  FLASHATTN_HOST_DEVICE float log2_score_unbiased(float dot) const {
    return has_softcap() ? tanhf(dot * softcap_input_scale) * softcap_log2 : dot * scale_log2;
  }
  // The ALiBi bias added to an unbiased log2 score; `distance` = row + diagonal − column
  // as a float (exact while |distance| < 2^24), which the training kernels keep as a
  // per-lane base plus compile-time offsets (no int-to-float per element).
  FLASHATTN_HOST_DEVICE float with_bias_at(float unbiased_log2, float distance) const {
    return has_bias() ? unbiased_log2 - alibi_slope_log2 * fabsf(distance) : unbiased_log2;
  }
  FLASHATTN_HOST_DEVICE float log2_score_at_distance(float dot, float distance) const {
    return with_bias_at(log2_score_unbiased(dot), distance);
  }
  // The score of (dot, distance), log2 units, the distance as an integer.
  FLASHATTN_HOST_DEVICE float log2_score_at(float dot, std::int64_t distance) const {
    return log2_score_at_distance(dot, static_cast<float>(distance));
  }
  FLASHATTN_HOST_DEVICE float log2_score(float dot, std::int64_t row, std::int64_t col) const {
    return log2_score_at(dot, row + diagonal - col);
  }
  FLASHATTN_HOST_DEVICE std::int64_t distance(std::int64_t row, std::int64_t col) const { return row + diagonal - col; }

  // d s / d (scale · dot): the factor the backward pass applies to dS before the
  // dQ/dK products (which then multiply by scale). Softcap: 1 − tanh²(x / softcap)
  // for x = scale · dot; a bias does not depend on q or k: 1.
  FLASHATTN_HOST_DEVICE float gradient_factor(float dot) const {
    if (!has_softcap()) return 1.0f;
    const float t = tanhf(dot * softcap_input_scale);
    return 1.0f - t * t;
  }
  // log2_score_at_distance and gradient_factor together with one tanh (the backward pass needs
  // both per element; the compiler does not merge the two tanhf calls).
  struct ScoreAndGradient {
    float log2_score;
    float gradient_factor;
  };
  FLASHATTN_HOST_DEVICE ScoreAndGradient log2_score_and_gradient_at_distance(float dot, float distance) const {
    if (!has_softcap()) return {with_bias_at(dot * scale_log2, distance), 1.0f};
    const float t = tanhf(dot * softcap_input_scale);
    return {with_bias_at(t * softcap_log2, distance), 1.0f - t * t};
  }

  // ---- ALiBi's affine form: the kernels' cheap form off the diagonal ----------------
  // On a block of elements on one side of the diagonal the distance has one sign, so
  // the bias is affine in the column. With side = +1 on the left, −1 on the right, and
  // col0 the block's first column (a kernel's lane may take its own first column):
  //   s = scale_log2 · dot − slope_log2 · side · (row + diagonal − column)
  //     = slope_log2 · x + row_offset,
  //   x          = dot · affine_dot_scale() + side · (column − col0)   (affine_x)
  //   row_offset = −side · slope_log2 · (row + diagonal − col0)         (affine_row_offset)
  // A kernel's column − col0 is a compile-time offset, so x is one FFMA per element and
  // row_offset one value per row and block. With slope_log2 > 0, x orders a row like s:
  // the row max is taken on x and mapped once (affine_log2_score), and the exponent
  // 2^(s − m) = 2^(x · slope_log2 + (row_offset − m)) is the fast path's one FFMA. The
  // rounding is that of s itself: x · slope_log2 = scale_log2 · dot ± slope_log2 · (column
  // − col0), each term within the score's magnitude.
  // Off for softcap (the score is not affine in dot), slope ≤ 0 (the max would flip)
  // and slopes below 2^-32 · scale_log2 (x = dot · scale / slope could overflow; such a
  // bias is below the scores' rounding anyway): the per-element form serves those.
  FLASHATTN_HOST_DEVICE bool has_affine_bias() const {
    return has_bias() && !has_softcap() && alibi_slope_log2 > 0.0f && scale_log2 <= 0x1p32f * alibi_slope_log2;
  }
  FLASHATTN_HOST_DEVICE float affine_dot_scale() const { return scale_log2 / alibi_slope_log2; }
  // x of a dot product at `column_offset` = column − col0 (side left or right).
  FLASHATTN_HOST_DEVICE static float affine_x(float dot, float dot_scale, DiagonalSide side, float column_offset) {
    return fmaf(dot, dot_scale, static_cast<float>(static_cast<int>(side)) * column_offset);
  }
  // The bias at a distance of the side's sign (left ≥ 0, right ≤ 0): −slope·|distance|
  // there is linear in the distance (log2 units).
  FLASHATTN_HOST_DEVICE float bias_on_side(DiagonalSide side, float distance) const {
    return -static_cast<float>(static_cast<int>(side)) * alibi_slope_log2 * distance;
  }
  // row_offset of a row whose distance to col0 is `distance0` = row + diagonal − col0.
  FLASHATTN_HOST_DEVICE float affine_row_offset(DiagonalSide side, float distance0) const {
    return bias_on_side(side, distance0);
  }
  FLASHATTN_HOST_DEVICE float affine_log2_score(float x, float row_offset) const {
    return fmaf(x, alibi_slope_log2, row_offset);
  }
  // The side of the elements of rows [row_first, row_last] × columns [col_first,
  // col_first + block_columns) that `mask` allows (a masked element is −inf in any
  // form), as bounds on col_first for fixed rows, so that a kernel computes them once
  // per tile and compares per block. Row r allows columns < r + offset + window_right + 1
  // (offset = seqlen_k − seqlen_q, the rule's diagonal): a causal mask (window_right 0)
  // leaves only the left side, window_left 0 only the right.
  struct SideBounds {
    std::int64_t last_left;    // col_first ≤ last_left: left
    std::int64_t first_right;  // col_first ≥ first_right: right
    FLASHATTN_HOST_DEVICE DiagonalSide side(std::int64_t col_first) const {
      if (col_first <= last_left) return DiagonalSide::left;
      if (col_first >= first_right) return DiagonalSide::right;
      return DiagonalSide::straddles;
    }
  };
  FLASHATTN_HOST_DEVICE SideBounds side_bounds(std::int64_t row_first, std::int64_t row_last, std::int64_t block_columns,
                                               const MaskRule& mask) const {
    constexpr std::int64_t kEverything = std::int64_t{1} << 62;
    const bool is_mask_aligned = mask.seqlen_k - mask.seqlen_q == diagonal;
    SideBounds bounds;
    // Left: the block's last column ≤ the first row's diagonal column.
    bounds.last_left = is_mask_aligned && mask.window_right == 0 ? kEverything : row_first + diagonal - (block_columns - 1);
    // Right: the block's first column ≥ the last row's diagonal column.
    bounds.first_right = is_mask_aligned && mask.window_left == 0 ? -kEverything : row_last + diagonal;
    return bounds;
  }
  // The transpose: rows [row_first, row_first + block_rows) move, the columns [col_first,
  // col_last] stay (the backward's key-outer loop); bounds on row_first.
  struct RowSideBounds {
    std::int64_t first_left;  // row_first ≥ first_left: left
    std::int64_t last_right;  // row_first ≤ last_right: right
    FLASHATTN_HOST_DEVICE DiagonalSide side(std::int64_t row_first) const {
      if (row_first >= first_left) return DiagonalSide::left;
      if (row_first <= last_right) return DiagonalSide::right;
      return DiagonalSide::straddles;
    }
  };
  FLASHATTN_HOST_DEVICE RowSideBounds row_side_bounds(std::int64_t col_first, std::int64_t col_last,
                                                      std::int64_t block_rows, const MaskRule& mask) const {
    constexpr std::int64_t kEverything = std::int64_t{1} << 62;
    const bool is_mask_aligned = mask.seqlen_k - mask.seqlen_q == diagonal;
    RowSideBounds bounds;
    // Left: the last column ≤ the first row's diagonal column.
    bounds.first_left = is_mask_aligned && mask.window_right == 0 ? -kEverything : col_last - diagonal;
    // Right: the first column ≥ the last row's diagonal column.
    bounds.last_right = is_mask_aligned && mask.window_left == 0 ? kEverything : col_first - diagonal - (block_rows - 1);
    return bounds;
  }

  // The ALiBi bias in natural-log units, for the float64 reference.
  static double alibi_bias(double slope, std::int64_t distance) {
    return -slope * std::fabs(static_cast<double>(distance));
  }
};

}  // namespace flashattn
