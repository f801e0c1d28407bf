// src/cpu/flash1_forward.cpp — FlashAttention-1 forward (seeds 000 and 003,
// Algorithm 1), kept for the story and as a second oracle, not for speed.
//
// K/V blocks outer, Q blocks inner; the running O, l, m of every query row live in
// "slow memory" (here: per-head buffers of O(seqlen_q · head_dim)) and are read,
// rescaled and written back at every step:
//   for each key block j:  load K_j, V_j
//     for each query block i:  load Q_i, O_i, l_i, m_i
//       S = Q_i K_j^T · scale·log2e;  m~ = rowmax S;  P~ = 2^(S - m~);  l~ = rowsum P~
//       (m_new, l_new) = merge((m_i, l_i), (m~, l~))                 (online_softmax::merge)
//       O_i = (l_i · 2^(m_i - m_new) · O_i + 2^(m~ - m_new) · P~ V_j) / l_new
//       store O_i, l_i = l_new, m_i = m_new
// The block sizes differ on purpose (kBlockRows != kBlockCols): seed 000's minimal
// CUDA version silently assumes Br == Bc; nothing here does.
// attn_mask / block mask (attention_mask.hpp): key blocks the block mask leaves empty
// for every row that could see them are skipped; inside a visited block each score
// takes the element rule and the bias, as in flash2.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "flashattn/online_softmax.hpp"
#include "src/cpu/attention_mask.hpp"
#include "src/cpu/dropout_mask.hpp"
#include "src/cpu/flash.hpp"
#include "src/cpu/tile_io.hpp"

namespace flashattn::cpu {
namespace {

constexpr std::int64_t kBlockRows = 16;  // Br: query rows per inner step
constexpr std::int64_t kBlockCols = 24;  // Bc: key rows per outer step

}  // namespace

void flash1_forward(const AttentionParams& params, int num_threads) {
  const std::int64_t head_dim = params.head_dim;
  const std::int64_t items = params.batch * params.heads_q;
  // A plain positive scale is folded into Q; any other score rule sees the raw q·k.
  const bool is_positive_scale = params.score_is_positive_scale();
  const float q_scale = is_positive_scale ? params.softmax_scale_log2 : 1.0f;
  const DropoutRule dropout = params.dropout();  // inverse_keep is 1 without dropout

#pragma omp parallel for schedule(dynamic, 1) num_threads(thread_count(num_threads))
  for (std::int64_t item = 0; item < items; ++item) {
    const std::int64_t b = item / params.heads_q, h = item % params.heads_q, h_kv = h / params.group_size;
    const MaskRule mask = params.mask_of(b);
    const ScoreRule score_rule = params.score_of(b, h, mask);
    HeadMask extra;  // attn_mask / block mask of (b, h), a conjunction with `mask`
    extra.reset(params, b, h);
    const std::int64_t seqlen_q = mask.seqlen_q, seqlen_k = mask.seqlen_k;
    // "Slow memory": O (seqlen_q, head_dim), l and m (seqlen_q), initialised to 0, 0, -inf.
    std::vector<float> o(static_cast<std::size_t>(seqlen_q * head_dim), 0.0f);
    std::vector<online_softmax::State<float>> stats(static_cast<std::size_t>(seqlen_q));
    // "Fast memory" tiles.
    std::vector<float> k_tile(static_cast<std::size_t>(kBlockCols * head_dim));  // (Bc, head_dim)
    std::vector<float> v_tile(static_cast<std::size_t>(kBlockCols * head_dim));  // (Bc, head_dim)
    std::vector<float> q_tile(static_cast<std::size_t>(kBlockRows * head_dim));  // (Br, head_dim)
    std::vector<float> p_tile(static_cast<std::size_t>(kBlockRows * kBlockCols));  // (Br, Bc)
    std::vector<float> pv(static_cast<std::size_t>(head_dim));

    for (std::int64_t col_begin = 0; col_begin < seqlen_k; col_begin += kBlockCols) {
      const std::int64_t cols = std::min(kBlockCols, seqlen_k - col_begin);
      const auto rows_seen = mask.rows_of_columns(col_begin, col_begin + cols);
      if (rows_seen.begin >= rows_seen.end) continue;  // no query sees this key block
      if (extra.is_active() && extra.tile_kind(rows_seen.begin, rows_seen.end, col_begin, col_begin + cols) == TileKind::empty)
        continue;
      load_tile(params.k, params.dtype, params.k_offset(b, h_kv) + col_begin * params.k_row_stride, params.k_row_stride, cols,
                cols, head_dim, head_dim, 1.0f, k_tile.data());
      load_tile(params.v, params.dtype, params.v_offset(b, h_kv) + col_begin * params.v_row_stride, params.v_row_stride, cols,
                cols, head_dim, head_dim, 1.0f, v_tile.data());
      for (std::int64_t row_begin = rows_seen.begin / kBlockRows * kBlockRows; row_begin < rows_seen.end; row_begin += kBlockRows) {
        const std::int64_t rows = std::min(kBlockRows, seqlen_q - row_begin);
        load_tile(params.q, params.dtype, params.q_offset(b, h) + row_begin * params.q_row_stride, params.q_row_stride, rows, rows,
                  head_dim, head_dim, q_scale, q_tile.data());
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t i = row_begin + r;
          float* p = p_tile.data() + r * kBlockCols;
          // S = Q_i K_j^T (log2 units), masked; m~ = rowmax S.
          float block_max = -std::numeric_limits<float>::infinity();
          for (std::int64_t c = 0; c < cols; ++c) {
            if (!mask.allowed(i, col_begin + c)) {
              p[c] = -std::numeric_limits<float>::infinity();
              continue;
            }
            float score = 0.0f;
            for (std::int64_t d = 0; d < head_dim; ++d) score += q_tile[static_cast<std::size_t>(r * head_dim + d)] * k_tile[static_cast<std::size_t>(c * head_dim + d)];
            if (!is_positive_scale) score = score_rule.log2_score(score, i, col_begin + c);
            if (extra.is_active()) {  // natural-log offset: -inf (masked) or the bias
              const double offset = extra.offset_of(i, col_begin + c);
              if (offset == -std::numeric_limits<double>::infinity()) {
                p[c] = -std::numeric_limits<float>::infinity();
                continue;
              }
              score += static_cast<float>(offset) * static_cast<float>(online_softmax::kLog2e);
            }
            p[c] = score;
            block_max = std::max(block_max, score);
          }
          // P~ = 2^(S - m~), l~ = rowsum P~.
          online_softmax::State<float> block;
          block.raise_max(block_max);
          float block_sum = 0.0f;
          for (std::int64_t c = 0; c < cols; ++c) {
            p[c] = std::exp2(p[c] - block.base());
            block_sum += p[c];
          }
          block.add(block_sum);
          // Dropout (Algorithm 2): P~ ∘ Z enters P~ V_j; l keeps the undropped sum and
          // 1/(1 - p) is applied once, at the end.
          if (dropout.enabled())
            for_each_dropout_decision(dropout, params.dropout_head(b, h), i, i + 1, col_begin, col_begin + cols,
                                      [&](std::int64_t, std::int64_t col, bool kept) {
                                        if (!kept) p[col - col_begin] = 0.0f;
                                      });
          // P~ V_j
          std::fill(pv.begin(), pv.end(), 0.0f);
          for (std::int64_t c = 0; c < cols; ++c)
            for (std::int64_t d = 0; d < head_dim; ++d) pv[static_cast<std::size_t>(d)] += p[c] * v_tile[static_cast<std::size_t>(c * head_dim + d)];
          // Merge with the stored (m_i, l_i, O_i) and write them back.
          auto& stored = stats[static_cast<std::size_t>(i)];
          float factor_old = 0.0f, factor_block = 0.0f;
          const online_softmax::State<float> merged = online_softmax::merge(stored, block, &factor_old, &factor_block);
          const float inverse_l = merged.inverse_sum();
          float* o_row = o.data() + i * head_dim;
          for (std::int64_t d = 0; d < head_dim; ++d)
            o_row[d] = (stored.l * factor_old * o_row[d] + factor_block * pv[static_cast<std::size_t>(d)]) * inverse_l;
          stored = merged;
        }
      }
    }

    for (std::int64_t i = 0; i < seqlen_q; ++i) {
      float* o_row = o.data() + i * head_dim;
      float lse = stats[static_cast<std::size_t>(i)].lse();
      float scale = dropout.inverse_keep;
      if (!row_is_finite(o_row, head_dim, scale, lse))  // overflow or NaN: see exact_row
        lse = exact_row(params, b, h, i, o_row), scale = 1.0f;
      store_row(o_row, head_dim, scale, params.out, params.dtype, params.out_offset(b, h) + i * params.out_row_stride);
      if (params.maybe_lse) params.maybe_lse[params.lse_offset(b, h) + i * params.lse_row_stride] = lse;
    }
  }
}

}  // namespace flashattn::cpu
