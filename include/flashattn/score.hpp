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

namespace flashattn {

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

  // The ALiBi bias in natural-log units, for the float64 reference.
  static double alibi_bias(double slope, std::int64_t distance) {
    return -slope * std::fabs(static_cast<double>(distance));
  }
};

}  // namespace flashattn
