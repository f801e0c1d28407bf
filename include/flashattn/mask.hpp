// flashattn/mask.hpp — which key columns a query row may attend to, as a policy
// that gives both loop bounds (which key blocks to visit, which of them need the
// element mask) and the element mask itself. The reference, the CPU flash paths
// and the CUDA kernels all use it, so they cannot disagree about masking.
//
// THE MASK CONTRACT. A kernel is written against four questions, which every mask
// model answers (MaskRule below: an interval per row; BlockMaskView in
// flashattn/block_mask.hpp: FlexAttention's block-sparse lists):
//   K0  key blocks of a query block    MaskRule::key_blocks(row_begin, row_end, block_n) -> a range
//                                      BlockMaskView::{partial,full}_key_blocks(b, h, m) -> two lists
//   K0' query blocks of a key block    MaskRule::query_blocks(col_begin, col_end, block_m) -> a range
//       (the backward, K/V outer)      BlockMaskView::{partial,full}_query_blocks(b, h, n) -> two lists
//   K2  kind of a tile                 tile_kind(...) in {empty, full, partial}: empty tiles are never
//                                      visited, full tiles skip the element mask, partial tiles apply it
//   K2' the element mask               allowed(row, col) (MaskRule), ElementRule::allowed(b, row, col, id)
// A kernel visits the tiles of the listed blocks only, applies allowed() inside
// partial tiles only, and then the dense bias (if any) to every visited element.
// Visiting fewer tiles, or applying the element mask to more, never changes a
// result: a masked element contributes exactly 0.
//
// Causal and sliding-window masks are aligned to the bottom-right corner (the
// FlashAttention >= 2.1 convention): with offset = seqlen_k - seqlen_q, row i sees
//   col_begin(i) = i + offset - window_left        (0 when window_left  < 0)
//   col_end(i)   = i + offset + window_right + 1   (seqlen_k when window_right < 0)
// clamped to [0, seqlen_k]. causal is window_right = 0. A row with
// col_begin >= col_end is fully masked: output 0, LSE -inf.
#pragma once

#include <cstdint>

#include "flashattn/config.hpp"

namespace flashattn {

// The kind of a (query rows x key columns) tile under a mask (contract question K2).
enum class TileKind : std::uint8_t {
  empty,    // no element allowed: the tile is not visited
  full,     // every element allowed: no element mask
  partial,  // some allowed: the element mask is applied
};

// Block indices [begin, end) (contract question K0 for the interval model).
struct BlockRange {
  std::int64_t begin;
  std::int64_t end;
  FLASHATTN_HOST_DEVICE bool empty() const { return end <= begin; }
};

// The interval model of the mask contract. Its members below the contract section
// are the ones today's kernels call; the contract section names them in the
// contract's terms and adds nothing the kernels' generated code depends on.
struct MaskRule {
  std::int64_t seqlen_q = 0;
  std::int64_t seqlen_k = 0;
  std::int64_t window_left = -1;   // -1 = unbounded
  std::int64_t window_right = -1;  // -1 = unbounded; 0 = causal

  FLASHATTN_HOST_DEVICE static std::int64_t clamp(std::int64_t x, std::int64_t lo, std::int64_t hi) {
    return x < lo ? lo : (x > hi ? hi : x);
  }
  FLASHATTN_HOST_DEVICE bool is_unmasked() const { return window_left < 0 && window_right < 0; }
  FLASHATTN_HOST_DEVICE std::int64_t col_begin(std::int64_t row) const {
    if (window_left < 0) return 0;
    return clamp(row + seqlen_k - seqlen_q - window_left, 0, seqlen_k);
  }
  FLASHATTN_HOST_DEVICE std::int64_t col_end(std::int64_t row) const {
    if (window_right < 0) return seqlen_k;
    return clamp(row + seqlen_k - seqlen_q + window_right + 1, 0, seqlen_k);
  }
  FLASHATTN_HOST_DEVICE bool allowed(std::int64_t row, std::int64_t col) const {
    return col >= col_begin(row) && col < col_end(row);
  }

  // Key columns that rows [row_begin, row_end) touch at all: [first, last). Both
  // bounds are monotone in the row, so the union is spanned by the end rows. Key
  // blocks outside it are skipped, never computed.
  struct ColumnRange {
    std::int64_t begin;
    std::int64_t end;
  };
  FLASHATTN_HOST_DEVICE ColumnRange columns_of_rows(std::int64_t row_begin, std::int64_t row_end) const {
    if (row_end <= row_begin) return {0, 0};
    const std::int64_t begin = col_begin(row_begin);
    const std::int64_t end = col_end(row_end - 1);
    return {begin, end > begin ? end : begin};
  }
  // Key columns that every row of [row_begin, row_end) may see: [begin, end), empty when
  // begin >= end (the intersection; by monotonicity, spanned by the end rows — the
  // bounds tile_fully_allowed tests a tile against, as a range a kernel computes once).
  FLASHATTN_HOST_DEVICE ColumnRange columns_of_all_rows(std::int64_t row_begin, std::int64_t row_end) const {
    return {col_begin(row_end - 1), col_end(row_begin)};
  }
  // Whether every (row, col) of the tile rows [row_begin,row_end) x cols
  // [col_begin_,col_end_) is allowed, so the element mask can be skipped there.
  // Only boundary tiles (where this is false) pay for the mask.
  FLASHATTN_HOST_DEVICE bool tile_fully_allowed(std::int64_t row_begin, std::int64_t row_end,
                                                std::int64_t tile_col_begin, std::int64_t tile_col_end) const {
    if (row_end <= row_begin) return true;
    return col_begin(row_end - 1) <= tile_col_begin && col_end(row_begin) >= tile_col_end;
  }
  // Key blocks of size block_n that are fully allowed for every row of [row_begin, row_end):
  // the blocks tile_fully_allowed accepts, as one range a kernel computes once per query
  // tile (FA3's n_masking_steps), so that a block's "needs the element mask" test is an
  // integer compare on its index. Contiguous: they lie inside columns_of_all_rows, which
  // is clamped to seqlen_k, so a block past the end of the keys is never in it. The
  // visited blocks (key_blocks) outside it are the partial ones. Empty for no rows.
  FLASHATTN_HOST_DEVICE BlockRange full_key_blocks(std::int64_t row_begin, std::int64_t row_end,
                                                   std::int64_t block_n) const {
    if (row_end <= row_begin) return {0, 0};
    const ColumnRange all = columns_of_all_rows(row_begin, row_end);
    const std::int64_t begin = (all.begin + block_n - 1) / block_n;  // both bounds are >= 0
    const std::int64_t end = all.end / block_n;
    return {begin, end > begin ? end : begin};
  }
  // Query rows that see at least one column of [tile_col_begin, tile_col_end): the
  // dual of columns_of_rows, used by the backward pass (K/V blocks outer).
  struct RowRange {
    std::int64_t begin;
    std::int64_t end;
  };
  FLASHATTN_HOST_DEVICE RowRange rows_of_columns(std::int64_t tile_col_begin, std::int64_t tile_col_end) const {
    if (tile_col_end <= tile_col_begin) return {0, 0};
    const std::int64_t offset = seqlen_k - seqlen_q;
    // col < col_end(row)  <=>  row > col - offset - window_right - 1
    std::int64_t begin = 0;
    if (window_right >= 0) begin = clamp(tile_col_begin - offset - window_right, 0, seqlen_q);
    // col >= col_begin(row)  <=>  row <= col - offset + window_left
    std::int64_t end = seqlen_q;
    if (window_left >= 0) end = clamp(tile_col_end - 1 - offset + window_left + 1, 0, seqlen_q);
    return {begin, end > begin ? end : begin};
  }
  // Query rows that see every column of [tile_col_begin, tile_col_end), for 0 <=
  // tile_col_begin < tile_col_end: the dual of columns_of_all_rows (col_begin(row) <=
  // tile_col_begin, col_end(row) >= tile_col_end; both bounds are monotone in the row, so
  // the rows are one range). A column past seqlen_k is seen by no row.
  FLASHATTN_HOST_DEVICE RowRange rows_of_all_columns(std::int64_t tile_col_begin, std::int64_t tile_col_end) const {
    if (tile_col_end <= tile_col_begin || tile_col_end > seqlen_k) return {0, 0};
    const std::int64_t offset = seqlen_k - seqlen_q;
    // col_end(row) >= tile_col_end  <=>  row + offset + window_right + 1 >= tile_col_end
    std::int64_t begin = 0;
    if (window_right >= 0) begin = clamp(tile_col_end - offset - window_right - 1, 0, seqlen_q);
    // col_begin(row) <= tile_col_begin  <=>  row + offset - window_left <= tile_col_begin
    std::int64_t end = seqlen_q;
    if (window_left >= 0) end = clamp(tile_col_begin - offset + window_left + 1, 0, seqlen_q);
    return {begin, end > begin ? end : begin};
  }
  // Query blocks of size block_m (rows [m block_m, min((m + 1) block_m, seqlen_q)), never
  // past seqlen_q) whose every row sees every column of [tile_col_begin, tile_col_end):
  // the blocks tile_fully_allowed accepts for this key tile (with the key tile inside the
  // keys), as one range the backward computes once per key tile, so that a query block's
  // "needs the element mask" test is an integer compare on its index (the dual of
  // full_key_blocks). Contiguous (rows_of_all_columns is one range); empty when the key
  // tile reaches past seqlen_k. The visited blocks (query_blocks) outside it are partial.
  FLASHATTN_HOST_DEVICE BlockRange full_query_blocks(std::int64_t tile_col_begin, std::int64_t tile_col_end,
                                                     std::int64_t block_m) const {
    const RowRange rows = rows_of_all_columns(tile_col_begin, tile_col_end);
    if (rows.end <= rows.begin) return {0, 0};
    const std::int64_t begin = (rows.begin + block_m - 1) / block_m;
    // A block ends at min((m + 1) block_m, seqlen_q): the last (clipped) one fits when rows reach seqlen_q.
    const std::int64_t end = rows.end == seqlen_q ? (seqlen_q + block_m - 1) / block_m : rows.end / block_m;
    return {begin, end > begin ? end : begin};
  }

  // --- the mask contract (see the file header) in terms of the members above ---
  // K2: kind of the tile rows [row_begin, row_end) x cols [tile_col_begin, tile_col_end).
  FLASHATTN_HOST_DEVICE TileKind tile_kind(std::int64_t row_begin, std::int64_t row_end, std::int64_t tile_col_begin,
                                           std::int64_t tile_col_end) const {
    if (row_end <= row_begin || tile_col_end <= tile_col_begin) return TileKind::empty;
    const ColumnRange touched = columns_of_rows(row_begin, row_end);
    if (touched.end <= tile_col_begin || touched.begin >= tile_col_end || touched.begin >= touched.end) return TileKind::empty;
    // Rows whose interval misses the tile while others hit it: partial, not empty.
    return tile_fully_allowed(row_begin, row_end, tile_col_begin, tile_col_end) ? TileKind::full : TileKind::partial;
  }
  // K0: key blocks of size block_n that rows [row_begin, row_end) touch.
  FLASHATTN_HOST_DEVICE BlockRange key_blocks(std::int64_t row_begin, std::int64_t row_end, std::int64_t block_n) const {
    const ColumnRange c = columns_of_rows(row_begin, row_end);
    if (c.end <= c.begin) return {0, 0};
    return {c.begin / block_n, (c.end + block_n - 1) / block_n};
  }
  // K0': query blocks of size block_m whose rows see some column of [tile_col_begin, tile_col_end).
  FLASHATTN_HOST_DEVICE BlockRange query_blocks(std::int64_t tile_col_begin, std::int64_t tile_col_end,
                                                std::int64_t block_m) const {
    const RowRange r = rows_of_columns(tile_col_begin, tile_col_end);
    if (r.end <= r.begin) return {0, 0};
    return {r.begin / block_m, (r.end + block_m - 1) / block_m};
  }
};

}  // namespace flashattn
