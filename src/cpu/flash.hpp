// src/cpu/flash.hpp — the CPU attention algorithms behind cpu::forward/backward.
#pragma once

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "flashattn/attention.hpp"
#include "src/core/params.hpp"
#include "src/cpu/reference.hpp"

namespace flashattn::cpu {

// FlashAttention-2 forward (flash2_forward.cpp): Q blocks outer, K/V blocks inner,
// delayed normalisation. The automatic choice on the CPU.
void flash2_forward(const AttentionParams& params, int num_threads);

// FlashAttention-1 forward (flash1_forward.cpp): K/V blocks outer, Q blocks inner,
// O/l/m rescaled and stored every step (seeds 000/003, Algorithm 1).
void flash1_forward(const AttentionParams& params, int num_threads);

// FP8 inputs (fp8_forward.cpp): dequantised to float32 scratch, then cpu::forward.
void fp8_forward(const AttentionParams& params, Algorithm algorithm, int num_threads);

// Flash backward by recomputation from the LSE (flash_backward.cpp).
void flash_backward(const BackwardParams& params, int num_threads);

// ExecutionContext::num_threads: 0 = all hardware threads (OpenMP's default).
inline int thread_count(int num_threads) { return num_threads > 0 ? num_threads : omp_get_max_threads(); }

// The flash loops keep unnormalised float32 sums (up to seqlen_k * max|v|, so v near
// FLT_MAX / seqlen_k overflows where the answer is finite), and inside a partially
// masked tile a hidden key's NaN value reaches a row through 0 * NaN in P V. A row
// whose float32 result (head_dim values times `scale`, and its LSE) is not finite is
// therefore recomputed by the float64 oracle, which follows the NaN rule of README.md
// exactly: finite rows never pay, and only rows that are NaN or Inf pay O(seqlen_k).
inline bool row_is_finite(const float* row, std::int64_t head_dim, float scale, float lse) {
  if (std::isnan(lse) || lse == INFINITY || !std::isfinite(scale)) return false;
  for (std::int64_t d = 0; d < head_dim; ++d)
    if (!std::isfinite(row[d] * scale)) return false;
  return true;
}
// Row i of (sequence b, head h) by the oracle into `row` (head_dim floats); returns its LSE.
inline float exact_row(const AttentionParams& params, std::int64_t b, std::int64_t h, std::int64_t i, float* row) {
  std::vector<double> exact(static_cast<std::size_t>(params.head_dim));
  const double lse = reference_forward_row(params, b, h, i, exact.data());
  for (std::int64_t d = 0; d < params.head_dim; ++d) row[d] = static_cast<float>(exact[static_cast<std::size_t>(d)]);
  return static_cast<float>(lse);
}

}  // namespace flashattn::cpu
