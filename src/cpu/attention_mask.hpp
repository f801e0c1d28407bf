// src/cpu/attention_mask.hpp — the masks beyond MaskRule (the block-sparse model of
// flashattn/block_mask.hpp and the dense attn_mask) for one (sequence, query head),
// as the CPU paths use them: the kind of a tile (K2) and the element rule + bias of a
// visited tile. MaskRule (causal, window) keeps its own code paths; everything here
// is a conjunction on top of it.
//
// The block lists of (b, h) are turned into a dense (q_blocks x kv_blocks) table of
// kinds once per head: O(blocks²) bytes, small next to the O(seqlen·head_dim) a head
// reads. The GPU kernels walk the lists instead (BlockMaskView::partial_key_blocks...).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "flashattn/block_mask.hpp"
#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/core/numeric.hpp"
#include "src/core/params.hpp"

namespace flashattn::cpu {

class HeadMask {
 public:
  // Block states in the table: empty, full, or a partial block's id (>= 0, or
  // kPartialWithoutId when the mask has no bits).
  static constexpr std::int32_t kEmpty = -3;
  static constexpr std::int32_t kFull = -2;
  static constexpr std::int32_t kPartialWithoutId = -1;

  bool is_active() const { return has_block_ || has_dense_; }
  bool has_dense() const { return has_dense_; }

  void reset(const AttentionParams& p, std::int64_t b, std::int64_t h) {
    params_ = &p;
    b_ = b, h_ = h;
    has_dense_ = p.has_attn_mask();
    has_block_ = p.has_block_mask();
    seqlen_q_ = p.seqlen_q, seqlen_k_ = p.seqlen_k;
    if (!has_block_) return;
    const BlockMaskView& v = p.block_mask;
    states_.assign(static_cast<std::size_t>(v.q_blocks * v.kv_blocks), kEmpty);
    for (std::int64_t m = 0; m < v.q_blocks; ++m) {
      const BlockList full = v.full_key_blocks(b, h, m);
      for (std::int32_t i = 0; i < full.count; ++i)
        if (const std::int32_t n = full.at(i); n >= 0) states_[static_cast<std::size_t>(m * v.kv_blocks + n)] = kFull;
      const BlockList partial = v.partial_key_blocks(b, h, m);
      for (std::int32_t i = 0; i < partial.count; ++i)
        if (const std::int32_t n = partial.at(i); n >= 0)
          states_[static_cast<std::size_t>(m * v.kv_blocks + n)] = partial.maybe_ids ? std::max(partial.id_at(i), kPartialWithoutId) : kPartialWithoutId;
    }
  }

  // K2 of the block mask for rows [row_begin, row_end) x cols [col_begin, col_end)
  // (clipped to the sequences); full without a block mask. The dense mask does not
  // enter: any tile it covers is visited and gets the element pass (apply()).
  TileKind tile_kind(std::int64_t row_begin, std::int64_t row_end, std::int64_t col_begin, std::int64_t col_end) const {
    row_end = std::min(row_end, seqlen_q_), col_end = std::min(col_end, seqlen_k_);
    if (row_end <= row_begin || col_end <= col_begin) return TileKind::empty;
    if (!has_block_) return TileKind::full;
    const BlockMaskView& v = params_->block_mask;
    bool any = false, all_full = true;
    for (std::int64_t m = row_begin / v.block_m; m <= (row_end - 1) / v.block_m; ++m)
      for (std::int64_t n = col_begin / v.block_n; n <= (col_end - 1) / v.block_n; ++n) {
        const std::int32_t state = states_[static_cast<std::size_t>(m * v.kv_blocks + n)];
        any = any || state != kEmpty;
        all_full = all_full && state == kFull;
      }
    return !any ? TileKind::empty : (all_full ? TileKind::full : TileKind::partial);
  }

  // Whether the element (row, col) is allowed by the block mask.
  bool block_allows(std::int64_t row, std::int64_t col) const {
    if (!has_block_) return true;
    const BlockMaskView& v = params_->block_mask;
    const std::int32_t state = states_[static_cast<std::size_t>((row / v.block_m) * v.kv_blocks + col / v.block_n)];
    if (state == kEmpty) return false;
    if (state == kFull) return true;
    return v.rule.allowed(b_, row, col, state);
  }

  // The dense attn_mask at (row, col) in natural-log units: 0 or -inf for a boolean
  // mask, the bias itself for a float one.
  double dense_value(std::int64_t row, std::int64_t col) const {
    const AttentionParams& p = *params_;
    const std::int64_t offset = p.attn_mask_offset(b_, h_, row, col);
    if (!p.attn_mask_is_bias)
      return static_cast<const std::uint8_t*>(p.maybe_attn_mask)[offset] != 0 ? 0.0 : -std::numeric_limits<double>::infinity();
    return numeric::load_as_float(p.maybe_attn_mask, p.attn_mask_dtype, offset);
  }

  // Natural-log score offset of (row, col): -inf when masked (block mask or dense),
  // else the bias (0 without one). For the reference.
  double offset_of(std::int64_t row, std::int64_t col) const {
    if (!block_allows(row, col)) return -std::numeric_limits<double>::infinity();
    return has_dense_ ? dense_value(row, col) : 0.0;
  }

  // The element pass over a transposed score tile s (keys x lanes, row stride
  // `stride`, log2 units): rows [row_begin, row_begin + rows), cols [col_begin,
  // col_begin + cols). Masked entries become -inf and the bias is added in log2 units.
  // Columns at or past seqlen_k (tile padding) become -inf and are never read.
  // maybe_hidden (same layout as s): set to 1 where an entry is masked (the backward's
  // NaN rule: a masked entry contributes nothing, not even 0·NaN); left as is elsewhere.
  void apply(float* s, std::int64_t stride, std::int64_t row_begin, std::int64_t rows, std::int64_t col_begin, std::int64_t cols,
             TileKind kind, char* maybe_hidden = nullptr) const {
    const bool check_block = has_block_ && kind == TileKind::partial;
    constexpr float kLog2e = static_cast<float>(online_softmax::kLog2e);
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::int64_t col = col_begin + j;
      float* s_row = s + j * stride;
      char* hidden_row = maybe_hidden != nullptr ? maybe_hidden + j * stride : nullptr;
      if (col >= seqlen_k_) {
        for (std::int64_t i = 0; i < rows; ++i) s_row[i] = -std::numeric_limits<float>::infinity();
        if (hidden_row != nullptr) std::fill(hidden_row, hidden_row + rows, char{1});
        continue;
      }
      for (std::int64_t i = 0; i < rows; ++i) {
        const std::int64_t row = row_begin + i;
        if (row >= seqlen_q_ || (check_block && !block_allows(row, col))) {
          s_row[i] = -std::numeric_limits<float>::infinity();
          if (hidden_row != nullptr) hidden_row[i] = 1;
          continue;
        }
        if (has_dense_) {
          const double value = dense_value(row, col);
          const bool masked = value == -std::numeric_limits<double>::infinity();
          s_row[i] = masked ? -std::numeric_limits<float>::infinity() : s_row[i] + static_cast<float>(value) * kLog2e;
          if (masked && hidden_row != nullptr) hidden_row[i] = 1;
        }
      }
    }
  }

 private:
  const AttentionParams* params_ = nullptr;
  std::int64_t b_ = 0, h_ = 0, seqlen_q_ = 0, seqlen_k_ = 0;
  bool has_block_ = false, has_dense_ = false;
  std::vector<std::int32_t> states_;
};

// The dBias accumulator: float32, dense in dbias's own shape [B|1, H|1, Sq|1, Sk|1].
struct DbiasIndex {
  std::int64_t shape[4] = {0, 0, 0, 0};
  std::int64_t at(std::int64_t b, std::int64_t h, std::int64_t row, std::int64_t col) const {
    const std::int64_t bi = shape[0] == 1 ? 0 : b, hi = shape[1] == 1 ? 0 : h;
    const std::int64_t ri = shape[2] == 1 ? 0 : row, ci = shape[3] == 1 ? 0 : col;
    return ((bi * shape[1] + hi) * shape[2] + ri) * shape[3] + ci;
  }
  std::int64_t size() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
};

// Writes the float accumulator (DbiasIndex layout) into params.maybe_dbias.
inline void store_dbias(const BackwardParams& p, const std::vector<double>& accumulator) {
  const DbiasIndex index{{p.dbias_shape[0], p.dbias_shape[1], p.dbias_shape[2], p.dbias_shape[3]}};
  for (std::int64_t b = 0; b < p.dbias_shape[0]; ++b)
    for (std::int64_t h = 0; h < p.dbias_shape[1]; ++h)
      for (std::int64_t r = 0; r < p.dbias_shape[2]; ++r)
        for (std::int64_t c = 0; c < p.dbias_shape[3]; ++c)
          numeric::store_from_float(p.maybe_dbias, p.attn_mask_dtype,
                                    b * p.dbias_strides[0] + h * p.dbias_strides[1] + r * p.dbias_strides[2] + c * p.dbias_strides[3],
                                    static_cast<float>(accumulator[static_cast<std::size_t>(index.at(b, h, r, c))]));
}

}  // namespace flashattn::cpu
