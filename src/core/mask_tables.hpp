// src/core/mask_tables.hpp — the masks beyond MaskRule (a block mask and/or a dense
// attn_mask) as the CUDA kernels read them: tables built on the device before the
// kernels run (src/cuda/masks/), then read-only.
//
// Two tables, both plain views (host/device):
//  1. Block codes: the block lists of flashattn/block_mask.hpp turned into one int32
//     per (b|1, h|1, query block, key block) of the *mask's* blocks — kEmptyBlock,
//     kFullBlock, or a partial block (>= 0: its id in the partial bits, 0 when the mask
//     has no bits). The element rule of a partial tile reads it (allowed() below).
//  2. Tile lists: for each (b|1, h|1, outer tile of a kernel) the inner tiles that
//     kernel visits, at the *kernel's* tile sizes (which need not equal the mask's
//     block sizes): a forward kernel's list per query tile names key tiles, a dK/dV
//     kernel's per key tile names query tiles. Each entry is
//       inner_tile << 1 | partial
//     where partial = the element pass is needed (some element of the tile is
//     masked by the block mask or the interval rule, or a dense attn_mask covers it);
//     a tile no element of which is allowed is not listed (seed 003: the work is
//     proportional to the listed tiles). Lists are sorted by descending inner tile
//     (the order in which the interval kernels visit key blocks).
// The interval rule (MaskRule: causal, window) is folded into the lists, so a
// list-driven kernel calls only apply_mask (src/cuda/common/mask_fragment.cuh) on
// partial tiles and nothing on full ones.
#pragma once

#include <cstdint>

#include "flashattn/block_mask.hpp"
#include "flashattn/config.hpp"
#include "flashattn/mask.hpp"

namespace flashattn {

struct TileEntry {
  std::int32_t tile;  // inner tile index, always in [0, inner_tiles)
  bool partial;
};

// The tile code of a listed partial tile (TileLists::code): the block code that every
// mask block under the tile shares (DeviceMask::kFullBlock without a block mask, or a
// partial block's id), so the element rule of the tile is per row a union of column
// spans (allowed_key_spans / allowed_query_spans below) plus at most the partial bits
// of one block — register arithmetic in a kernel. kGeneralTile when that does not hold:
// the tile straddles mask blocks of different codes, a dense attn_mask covers it, or the
// document ids are not sorted (their rule is then no span); the kernel takes the
// per-element pass (fragment::apply_mask) there.
inline constexpr std::int32_t kGeneralTile = -3;

// Tile lists of one kernel (see the header).
struct TileLists {
  const std::int32_t* counts = nullptr;   // [batches, heads, outer_tiles]
  const std::int32_t* entries = nullptr;  // [batches, heads, outer_tiles, capacity]
  const std::int32_t* codes = nullptr;    // tile codes of the entries (same layout; kGeneralTile, see above)
  std::int64_t batch_stride = 0;          // in lists: heads * outer_tiles, 0 when the masks broadcast over batch
  std::int64_t head_stride = 0;           // in lists: outer_tiles, 0 when they broadcast over heads
  std::int64_t outer_tiles = 0;
  std::int64_t capacity = 0;              // = inner_tiles (a list may name every inner tile)
  std::int32_t inner_tiles = 0;
  std::int32_t outer_tile_size = 0;       // the kernel tile sizes the lists were built for
  std::int32_t inner_tile_size = 0;

  FLASHATTN_HOST_DEVICE bool present() const { return counts != nullptr; }
  FLASHATTN_HOST_DEVICE std::int64_t list(std::int64_t b, std::int64_t h, std::int64_t outer) const {
    return b * batch_stride + h * head_stride + outer;
  }
  FLASHATTN_HOST_DEVICE std::int32_t count(std::int64_t list_index) const {
    const std::int32_t n = counts[list_index];
    return n < 0 ? 0 : (n > capacity ? static_cast<std::int32_t>(capacity) : n);
  }
  FLASHATTN_HOST_DEVICE TileEntry entry(std::int64_t list_index, std::int32_t i) const {
    const std::int32_t raw = entries[list_index * capacity + i];
    std::int32_t tile = raw >> 1;
    tile = tile < 0 ? 0 : (tile >= inner_tiles ? inner_tiles - 1 : tile);  // tables are ours; clamp anyway
    return {tile, (raw & 1) != 0};
  }
  // The tile code of entry i (read for partial entries only).
  FLASHATTN_HOST_DEVICE std::int32_t code(std::int64_t list_index, std::int32_t i) const {
    return codes[list_index * capacity + i];
  }
};

// Everything a CUDA kernel needs for masks beyond MaskRule; present() when any.
struct DeviceMask {
  static constexpr std::int32_t kEmptyBlock = -2;
  static constexpr std::int32_t kFullBlock = -1;

  // Block codes of the block mask (null without one): code of (b, h, m, n) at
  // b * code_batch_stride + h * code_head_stride + m * kv_blocks + n (strides 0 when
  // the block mask broadcasts). Geometry and element rule: params.block_mask.
  const std::int32_t* maybe_block_codes = nullptr;
  std::int64_t code_batch_stride = 0, code_head_stride = 0;

  // The lists of the kernel this call runs: by query tile (forward; the backward's
  // separate dQ kernel) and by key tile (the backward's dK/dV kernels).
  TileLists by_query_tile;
  TileLists by_key_tile;

  // dBias accumulator (backward with dbias): float32, dense in dbias's shape
  // [B|1, H|1, Sq|1, Sk|1] (strides 0 on size-1 dimensions, so broadcast dimensions
  // sum), zeroed before the kernels; kernels atomically add dS (natural-log units)
  // for every allowed element, src/cuda/masks/ converts it into dbias afterwards.
  // The document rule as spans (ElementRule with document ids, when both id arrays are
  // sorted — packed sequences; the list kernel gives kGeneralTile otherwise): for query
  // row r of batch b the keys of its document, [begin, end) at
  // maybe_document_key_spans[2 (b * document_batch_stride_q + r)] (forward and dQ
  // lists), and for key row c the queries of its document in maybe_document_query_spans
  // (dK/dV lists). Null when not needed.
  const std::int32_t* maybe_document_key_spans = nullptr;    // [B|1, seqlen_q, 2]
  const std::int32_t* maybe_document_query_spans = nullptr;  // [B|1, seqlen_k, 2]
  std::int64_t document_batch_stride_q = 0, document_batch_stride_k = 0;  // in spans; 0 when ids broadcast
  // The partial bits transposed, for the dK/dV kernels whose fragment rows are keys:
  // bit (r, c) of partial block p is bit r % 32 of word
  // (p·block_n + c)·words_per_key + r / 32 (null without bits or dK/dV lists).
  const std::uint32_t* maybe_partial_bits_by_key = nullptr;  // [partial blocks, block_n, words_per_key]
  std::int64_t words_per_key = 0;                            // ceil(block_m / 32)

  float* maybe_dbias_sum = nullptr;
  std::int64_t dbias_sum_strides[4] = {0, 0, 0, 0};

  FLASHATTN_HOST_DEVICE bool present() const { return by_query_tile.present() || by_key_tile.present(); }
  FLASHATTN_HOST_DEVICE std::int32_t block_code(const BlockMaskView& view, std::int64_t b, std::int64_t h,
                                                std::int64_t row, std::int64_t col) const {
    // Block sizes are powers of two: shifts, not 64-bit divisions (block_mask.hpp).
    return maybe_block_codes[b * code_batch_stride + h * code_head_stride +
                             (row >> mask_block_shift(view.block_m)) * view.kv_blocks + (col >> mask_block_shift(view.block_n))];
  }
  // Whether the block mask allows (row, col) of (b, h) (true without a block mask).
  FLASHATTN_HOST_DEVICE bool block_allows(const BlockMaskView& view, std::int64_t b, std::int64_t h, std::int64_t row,
                                          std::int64_t col) const {
    if (maybe_block_codes == nullptr) return true;
    const std::int32_t code = block_code(view, b, h, row, col);
    if (code == kEmptyBlock) return false;
    if (code == kFullBlock) return true;
    return view.rule.allowed(b, row, col, code);
  }
  FLASHATTN_HOST_DEVICE std::int64_t dbias_offset(std::int64_t b, std::int64_t h, std::int64_t row, std::int64_t col) const {
    return b * dbias_sum_strides[0] + h * dbias_sum_strides[1] + row * dbias_sum_strides[2] + col * dbias_sum_strides[3];
  }
};

// The code every mask block overlapping rows [row_begin, row_end) x columns
// [col_begin, col_end) (non-empty, inside the sequences) has, or kGeneralTile when they
// differ. `codes` points at the codes of one (b, h). A partial id of a mask with bits
// names one block's bit-mask, which the fast pass reads as the tile's own (its word
// index within one block): a tile over several mask blocks that share such an id (one
// pattern stored once) takes the general pass.
FLASHATTN_HOST_DEVICE std::int32_t shared_block_code(const std::int32_t* codes, const BlockMaskView& view,
                                                            std::int64_t row_begin, std::int64_t row_end,
                                                            std::int64_t col_begin, std::int64_t col_end) {
  const int shift_m = mask_block_shift(view.block_m), shift_n = mask_block_shift(view.block_n);
  const std::int32_t first = codes[(row_begin >> shift_m) * view.kv_blocks + (col_begin >> shift_n)];
  const bool is_one_block =
      (row_begin >> shift_m) == ((row_end - 1) >> shift_m) && (col_begin >> shift_n) == ((col_end - 1) >> shift_n);
  if (first >= 0 && view.rule.has_bits() && !is_one_block) return kGeneralTile;
  for (std::int64_t qb = row_begin >> shift_m; qb <= (row_end - 1) >> shift_m; ++qb)
    for (std::int64_t kb = col_begin >> shift_n; kb <= (col_end - 1) >> shift_n; ++kb)
      if (codes[qb * view.kv_blocks + kb] != first) return kGeneralTile;
  return first;
}

// The allowed columns of one row of a tile: [begin[0], end[0]) ∪ [begin[1], end[1])
// (a span is empty when end <= begin).
struct AllowedSpans {
  std::int64_t begin[2] = {0, 0};
  std::int64_t end[2] = {0, 0};
  FLASHATTN_HOST_DEVICE bool contains(std::int64_t col) const {
    return (col >= begin[0] && col < end[0]) || (col >= begin[1] && col < end[1]);
  }
};

// The row's document as a span of the other side's rows (DeviceMask's document spans).
struct DocumentSpan {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

// The element pass of a tile with tile code `tile_code` (not kGeneralTile) for query
// row `row`, apart from the partial bits: the key columns that the sequences, the
// interval rule and — in a partial block — the element rule's band, prefix and
// documents allow. Equal to the per-element test (DeviceMask::block_allows &&
// mask.allowed, inside the sequences) column by column, given the bits allow:
//   allowed = S ∩ (band ∪ [0, prefix))  with S = sequence ∩ interval rule ∩ document
//           = (S ∩ band) ∪ (S ∩ [0, prefix)).
// prefix_length: the row's batch's prefix (any value <= 0 without prefix lengths);
// documents: the keys of the row's document (read only with document ids).
FLASHATTN_HOST_DEVICE AllowedSpans allowed_key_spans(const MaskRule& mask, const ElementRule& rule,
                                                            std::int32_t tile_code, std::int64_t row,
                                                            std::int64_t prefix_length, DocumentSpan documents) {
  AllowedSpans spans;
  if (row < 0 || row >= mask.seqlen_q || tile_code == DeviceMask::kEmptyBlock) return spans;
  std::int64_t begin = mask.col_begin(row), end = mask.col_end(row);  // inside [0, seqlen_k]
  if (tile_code != DeviceMask::kFullBlock) {
    if (rule.has_bits() && (tile_code < 0 || tile_code >= rule.partial_block_count)) return spans;  // a bad id denies
    if (rule.maybe_q_document_ids != nullptr) {
      begin = begin > documents.begin ? begin : documents.begin;
      end = end < documents.end ? end : documents.end;
    }
    if (rule.has_band) {
      const std::int64_t diagonal = row + rule.diagonal_offset;
      const std::int64_t band_begin = rule.window_left < 0 ? begin : diagonal - rule.window_left;
      const std::int64_t band_end = rule.window_right < 0 ? end : diagonal + rule.window_right + 1;
      spans.begin[0] = begin > band_begin ? begin : band_begin;
      spans.end[0] = end < band_end ? end : band_end;
      spans.begin[1] = begin;
      spans.end[1] = end < prefix_length ? end : prefix_length;
      return spans;
    }
  }
  spans.begin[0] = begin;
  spans.end[0] = end;
  return spans;
}

// AllowedSpans as one interval [begin, end) of columns, where it is one: an empty span
// adds nothing, two that overlap or touch join; is_one is false when a gap lies between
// them (a prefix and a band apart). Document-causal, sliding-window and prefix-LM (causal)
// rows are one interval: a kernel may keep it per row across its key loop instead of the
// spans' inputs (the Hopper forward's row-interval pass, fragment::RowKeyInterval).
struct OneInterval {
  bool is_one = true;
  std::int64_t begin = 0;
  std::int64_t end = 0;  // empty when end <= begin
};
FLASHATTN_HOST_DEVICE OneInterval one_interval_of(const AllowedSpans& spans) {
  const bool is_empty[2] = {spans.end[0] <= spans.begin[0], spans.end[1] <= spans.begin[1]};
  if (is_empty[1]) return {true, spans.begin[0], spans.end[0]};
  if (is_empty[0]) return {true, spans.begin[1], spans.end[1]};
  if (spans.begin[1] > spans.end[0] || spans.begin[0] > spans.end[1]) return {false, 0, 0};
  return {true, spans.begin[0] < spans.begin[1] ? spans.begin[0] : spans.begin[1],
          spans.end[0] > spans.end[1] ? spans.end[0] : spans.end[1]};
}

// The transpose of allowed_key_spans (dK/dV kernels, whose fragment rows are keys): the
// query rows that may see key `key`, one span (the prefix relaxes the band of a whole
// key column). prefix_length as above; documents: the queries of the key's document.
FLASHATTN_HOST_DEVICE AllowedSpans allowed_query_spans(const MaskRule& mask, const ElementRule& rule,
                                                              std::int32_t tile_code, std::int64_t key,
                                                              std::int64_t prefix_length, DocumentSpan documents) {
  AllowedSpans spans;
  if (key < 0 || key >= mask.seqlen_k || tile_code == DeviceMask::kEmptyBlock) return spans;
  const MaskRule::RowRange rows = mask.rows_of_columns(key, key + 1);  // inside [0, seqlen_q]
  std::int64_t begin = rows.begin, end = rows.end;
  if (tile_code != DeviceMask::kFullBlock) {
    if (rule.has_bits() && (tile_code < 0 || tile_code >= rule.partial_block_count)) return spans;
    if (rule.maybe_q_document_ids != nullptr) {
      begin = begin > documents.begin ? begin : documents.begin;
      end = end < documents.end ? end : documents.end;
    }
    if (rule.has_band && key >= prefix_length) {
      // diagonal - window_left <= key <= diagonal + window_right, diagonal = query + offset
      const std::int64_t first = key - rule.diagonal_offset - rule.window_right;
      const std::int64_t last = key - rule.diagonal_offset + rule.window_left;
      if (rule.window_right >= 0 && first > begin) begin = first;
      if (rule.window_left >= 0 && last + 1 < end) end = last + 1;
    }
  }
  spans.begin[0] = begin;
  spans.end[0] = end;
  return spans;
}

// The transposed counterpart of one_interval_of (dK/dV kernels, whose fragment rows are
// keys): the queries that may see key `key` in a partial block of a block mask *without
// bits* (document ids, band, prefix). Always one interval: allowed_query_spans gives one
// span (a prefix relaxes the band of a whole key column, so no gap opens between a prefix
// and a band as it does along a query row), and without bits it does not depend on the
// partial id. So a kernel may make it once per key row and keep it across its query tiles
// (the Hopper backward's key-interval pass, hopper_bwd/kernel.cuh). Masks with bits must
// not use it (the bits are not in it). prefix_length, documents: as allowed_query_spans.
FLASHATTN_HOST_DEVICE OneInterval key_query_interval(const MaskRule& mask, const ElementRule& rule, std::int64_t key,
                                                     std::int64_t prefix_length, DocumentSpan documents) {
  constexpr std::int32_t kAnyPartialId = 0;
  return one_interval_of(allowed_query_spans(mask, rule, kAnyPartialId, key, prefix_length, documents));
}

}  // namespace flashattn
