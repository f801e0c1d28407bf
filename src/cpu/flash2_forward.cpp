// src/cpu/flash2_forward.cpp — FlashAttention-2 forward on the CPU (seed 004 §0x4).
//
// Work item = (sequence b, query head h, block of kBlockM query rows); items run in
// parallel (OpenMP), each with O(block) scratch. Q blocks outer, K/V blocks inner:
//   Q^T = transpose(Q_block) · scale·log2(e)                 once per item
//   for each key block the mask lets through (MaskRule::columns_of_rows):
//     S^T = K_block Q^T                                        (kBlockN, kBlockM)
//     element mask only where !MaskRule::tile_fully_allowed
//     m_new = max(m, rowmax S);  O^T *= 2^(m - m_new);  P^T = 2^(S^T - m_new);  l += rowsum P
//     O^T += V_block^T P^T                                     (head_dim, kBlockM)
//   O = transpose(O^T) / l   (one division per row, at the end);  LSE = (m + log2 l)·ln 2
// The scores are kept transposed (keys x queries) so that both matmuls, the row max,
// the exp2 and the rescale all run with the queries in the vector lanes: no
// horizontal reductions and no per-block transpose of K or V (float32 K/V are read
// in place). The vector work is the TileKernels table (kernels.hpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "flashattn/online_softmax.hpp"
#include "src/cpu/flash.hpp"
#include "src/cpu/tile_io.hpp"

namespace flashattn::cpu {
namespace {

// Tile sizes: performance only. kBlockM is a multiple of kTileWidthMultiple (the
// queries are the vector lanes), kBlockN of kTileRowsMultiple.
constexpr std::int64_t kBlockM = 64;  // query rows per item
constexpr std::int64_t kBlockN = 64;  // key rows per inner step
constexpr float kInfinity = std::numeric_limits<float>::infinity();

}  // namespace

void flash2_forward(const AttentionParams& params, int num_threads) {
  const std::int64_t head_dim = params.head_dim;
  const std::int64_t head_dim_padded = round_up(head_dim, kTileWidthMultiple);
  const std::int64_t head_dim_rows = round_up(head_dim, kTileRowsMultiple);  // rows of O^T the matmul fills
  const std::int64_t q_blocks = (params.seqlen_q + kBlockM - 1) / kBlockM;
  const std::int64_t items = params.batch * params.heads_q * q_blocks;
  if (items == 0) return;
  const TileKernels& kernels = tile_kernels();
  const bool has_softcap = params.has_softcap();
  // Without softcap, scale·log2(e) is folded into Q so each score is ready for exp2;
  // softcap must see scale·q·k itself, so then log2(e) comes after the tanh.
  const float q_scale = has_softcap ? params.softmax_scale : params.softmax_scale_log2;
  const float softcap = params.softcap;
  const float softcap_log2 = params.softcap * static_cast<float>(online_softmax::kLog2e);
  // float32 K/V whose rows need no padding are read in place; others are converted.
  const bool reads_kv_in_place = params.dtype == DType::float32 && head_dim == head_dim_rows;

#pragma omp parallel num_threads(thread_count(num_threads))
  {
    AlignedBuffer q_t(head_dim * kBlockM);            // (head_dim, kBlockM)
    AlignedBuffer k_tile(kBlockN * head_dim_padded);  // (kBlockN, head_dim_padded)
    AlignedBuffer v_tile(kBlockN * head_dim_padded);  // (kBlockN, head_dim_padded)
    AlignedBuffer s_t(kBlockN * kBlockM);             // (kBlockN, kBlockM): S^T, then P^T
    AlignedBuffer o_t(head_dim_rows * kBlockM);       // (head_dim_rows, kBlockM)
    AlignedBuffer row_max(kBlockM), row_factor(kBlockM), row_base(kBlockM), row_sum(kBlockM);
    std::vector<float> row_buffer(static_cast<std::size_t>(head_dim));
    std::vector<online_softmax::State<float>> states(kBlockM);

#pragma omp for schedule(dynamic, 1)
    for (std::int64_t item = 0; item < items; ++item) {
      const std::int64_t m_block = item % q_blocks;
      const std::int64_t h = (item / q_blocks) % params.heads_q;
      const std::int64_t b = item / (q_blocks * params.heads_q);
      const MaskRule mask = params.mask_of(b);
      const std::int64_t row_begin = m_block * kBlockM;
      if (row_begin >= mask.seqlen_q) continue;  // varlen: this sequence is shorter
      const std::int64_t rows = std::min(kBlockM, mask.seqlen_q - row_begin);
      const std::int64_t h_kv = h / params.group_size;

      load_tile_transposed(params.q, params.dtype, params.q_offset(b, h) + row_begin * params.q_row_stride,
                           params.q_row_stride, rows, kBlockM, head_dim, q_scale, q_t.data(), row_buffer.data());
      std::fill(o_t.data(), o_t.data() + head_dim_rows * kBlockM, 0.0f);
      std::fill(states.begin(), states.end(), online_softmax::State<float>{});

      const auto cols = mask.columns_of_rows(row_begin, row_begin + rows);
      const std::int64_t first_col = cols.begin < cols.end ? cols.begin / kBlockN * kBlockN : cols.end;
      for (std::int64_t col_begin = first_col; col_begin < cols.end; col_begin += kBlockN) {
        const std::int64_t n = std::min(kBlockN, mask.seqlen_k - col_begin);
        const std::int64_t k_row0 = params.k_offset(b, h_kv) + col_begin * params.k_row_stride;
        const std::int64_t v_row0 = params.v_offset(b, h_kv) + col_begin * params.v_row_stride;
        const float* k = k_tile.data();  // (kBlockN, head_dim) with row stride k_stride
        const float* v = v_tile.data();  // (kBlockN, head_dim_rows) with row stride v_stride
        std::int64_t k_stride = head_dim_padded, v_stride = head_dim_padded;
        if (reads_kv_in_place && n == kBlockN) {
          k = static_cast<const float*>(params.k) + k_row0, k_stride = params.k_row_stride;
          v = static_cast<const float*>(params.v) + v_row0, v_stride = params.v_row_stride;
        } else {
          load_tile(params.k, params.dtype, k_row0, params.k_row_stride, n, kBlockN, head_dim, head_dim_padded, 1.0f, k_tile.data());
          load_tile(params.v, params.dtype, v_row0, params.v_row_stride, n, kBlockN, head_dim, head_dim_padded, 1.0f, v_tile.data());
        }

        // S^T (kBlockN, kBlockM) = K Q^T
        float* s = s_t.data();
        kernels.matmul(k, k_stride, 1, q_t.data(), kBlockM, head_dim, s, kBlockM, kBlockN, kBlockM, false);
        if (has_softcap)
          for (std::int64_t e = 0; e < kBlockN * kBlockM; ++e) s[e] = softcap_log2 * std::tanh(s[e] / softcap);
        // Only boundary tiles pay for the element mask (this also hides the zero
        // padding of a tail key block: col_end never passes seqlen_k).
        if (!mask.tile_fully_allowed(row_begin, row_begin + rows, col_begin, col_begin + kBlockN)) {
          for (std::int64_t i = 0; i < rows; ++i) {
            const std::int64_t allowed_begin = mask.col_begin(row_begin + i) - col_begin;
            const std::int64_t allowed_end = mask.col_end(row_begin + i) - col_begin;
            for (std::int64_t j = 0; j < kBlockN; ++j)
              if (j < allowed_begin || j >= allowed_end) s[j * kBlockM + i] = -kInfinity;
          }
        }

        // Online softmax: the rescale rule is online_softmax::State's, per query row.
        kernels.column_max(s, kBlockM, kBlockN, kBlockM, row_max.data());
        for (std::int64_t i = 0; i < kBlockM; ++i) {
          auto& state = states[static_cast<std::size_t>(i)];
          row_factor.data()[i] = state.raise_max(row_max.data()[i]);
          row_base.data()[i] = state.base();
        }
        kernels.exp2_columns(s, kBlockM, kBlockN, kBlockM, row_base.data(), row_sum.data());  // P^T
        for (std::int64_t i = 0; i < kBlockM; ++i) states[static_cast<std::size_t>(i)].add(row_sum.data()[i]);
        kernels.scale_columns(o_t.data(), kBlockM, head_dim_rows, kBlockM, row_factor.data());

        // O^T (head_dim_rows, kBlockM) += V^T P^T
        kernels.matmul(v, 1, v_stride, s, kBlockM, kBlockN, o_t.data(), kBlockM, head_dim_rows, kBlockM, true);
      }

      // O = O^T / l (the one division per row), LSE.
      for (std::int64_t i = 0; i < rows; ++i) {
        const auto& state = states[static_cast<std::size_t>(i)];
        for (std::int64_t d = 0; d < head_dim; ++d) row_buffer[static_cast<std::size_t>(d)] = o_t.data()[d * kBlockM + i];
        store_row(row_buffer.data(), head_dim, state.inverse_sum(), params.out, params.dtype,
                  params.out_offset(b, h) + (row_begin + i) * params.out_row_stride);
        if (params.maybe_lse) params.maybe_lse[params.lse_offset(b, h) + (row_begin + i) * params.lse_row_stride] = state.lse();
      }
    }
  }
}

}  // namespace flashattn::cpu
