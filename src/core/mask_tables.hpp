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

// Tile lists of one kernel (see the header).
struct TileLists {
  const std::int32_t* counts = nullptr;   // [batches, heads, outer_tiles]
  const std::int32_t* entries = nullptr;  // [batches, heads, outer_tiles, capacity]
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
  float* maybe_dbias_sum = nullptr;
  std::int64_t dbias_sum_strides[4] = {0, 0, 0, 0};

  FLASHATTN_HOST_DEVICE bool present() const { return by_query_tile.present() || by_key_tile.present(); }
  FLASHATTN_HOST_DEVICE std::int32_t block_code(const BlockMaskView& view, std::int64_t b, std::int64_t h,
                                                std::int64_t row, std::int64_t col) const {
    return maybe_block_codes[b * code_batch_stride + h * code_head_stride +
                             index_quotient(row, view.block_m) * view.kv_blocks + index_quotient(col, view.block_n)];
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

}  // namespace flashattn
