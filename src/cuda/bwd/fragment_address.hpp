// src/cuda/bwd/fragment_address.hpp — per-lane ldmatrix addresses into swizzled
// shared-memory tiles (common/swizzle.cuh), with the lane, warp and k-step parts
// split so that unrolled loops add immediates only. Host and device: the arithmetic
// is checked against SwizzledTile::chunk_offset on the host (tests/cuda/test_backward_layout.cpp).
#pragma once

#include <cstdint>

#include "flashattn/config.hpp"
#include "src/cuda/common/swizzle.cuh"

namespace flashattn::cuda::bwd {

// Per-lane ldmatrix addresses into a swizzled tile. A lane addresses row `row` (its
// own row of the 8x8 matrices) and logical chunk warp_chunk + lane_bit + c for
// compile-time c; the unrolled loops then add immediates only. kWarpChunks is the
// chunk extent of one warp when several warps split the columns (0: one warp, or
// no warp offset): a power of two lets the warp's chunk bits join the lane XOR
// (warp_chunk is a multiple of it and c < it, so their bits are disjoint);
// otherwise the chunk is added at run time.
template <class Tile, int kWarpChunks>
struct FragmentAddress {
  static constexpr int kWidth = Tile::kSwizzleWidth;
  static constexpr int kCols = Tile::kChunks * kChunkElements;
  static constexpr bool kIsXorOnly = kWarpChunks == 0 || (kWarpChunks & (kWarpChunks - 1)) == 0;
  static_assert(kWidth >= 2, "the lane's chunk bit must stay inside the XOR pattern");
  std::uint32_t row_address;
  int lane_xor;
  int chunk_base;

  // tile: the shared-memory byte address of the tile.
  FLASHATTN_HOST_DEVICE FragmentAddress(std::uint32_t tile, int row, int warp_chunk, int lane_bit) {
    if constexpr (kIsXorOnly) {
      row_address = tile + 2 * (row * kCols + (warp_chunk & ~(kWidth - 1)) * kChunkElements);
      lane_xor = Tile::row_swizzle(row) ^ (warp_chunk & (kWidth - 1)) ^ lane_bit;
      chunk_base = 0;
    } else {
      row_address = tile + 2 * row * kCols;
      lane_xor = Tile::row_swizzle(row);
      chunk_base = warp_chunk + lane_bit;
    }
  }
  // Byte address of the lane's row at row_offset (a multiple of 8: same swizzle) and chunk c (even).
  FLASHATTN_HOST_DEVICE std::uint32_t at(int row_offset, int c) const {
    if constexpr (kIsXorOnly) {
      return row_address + 2 * (row_offset * kCols + Tile::xor_chunk_offset(c, lane_xor));
    } else {
      return row_address + 2 * (row_offset * kCols + ((chunk_base + c) ^ lane_xor) * kChunkElements);
    }
  }
};

// ldmatrix .x4 lane patterns: lanes 8i..8i+7 give the row addresses of matrix i; a
// lane addresses tile row `row` (relative to the 16-row block) at chunk pair bit
// chunk_bit (chunk 2c + chunk_bit).
struct LaneRow {
  int row;
  int chunk_bit;
};
// A fragment, plain: matrices (rows 0-7 | 8-15) x (k chunk 0 | 1), rows fastest.
FLASHATTN_HOST_DEVICE constexpr LaneRow plain_a_lane(int lane) { return {lane % 16, lane / 16}; }
// B fragments of two n8 tiles, plain, from a matrix stored (n, k): (n 0-7: k chunk 0, 1;
// n 8-15: k chunk 0, 1). With .trans, the same pattern gives the A fragment of X^T
// from X stored (k, m): (k 0-7: m chunk 0, 1; k 8-15: m chunk 0, 1).
FLASHATTN_HOST_DEVICE constexpr LaneRow plain_b_pair_lane(int lane) {
  return {(lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1};
}
// B fragments of two n8 tiles via .trans from a matrix stored (k, n): (k 0-7 | 8-15) x
// (n chunk 0 | 1), k fastest.
FLASHATTN_HOST_DEVICE constexpr LaneRow trans_b_pair_lane(int lane) {
  return {(lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4};
}

}  // namespace flashattn::cuda::bwd
