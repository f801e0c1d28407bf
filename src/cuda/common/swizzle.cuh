// src/cuda/common/swizzle.cuh — bank-conflict-free layout of 16-bit tiles in shared memory.
//
// A tile of (kRows, kCols) 16-bit elements is stored row-major without padding, in
// 16-byte chunks of 8 elements (the unit of cp.async and of one ldmatrix row). The
// chunk at logical (row, chunk) is stored at physical chunk `chunk ^ f(row)`.
//
// Why: ldmatrix serves the 8 row addresses of one 8x8 matrix together; they are 8
// consecutive rows (starting at a multiple of 8) at the same logical chunk. Shared
// memory has 32 4-byte banks = 8 16-byte bank groups per 128-byte line, so the 8
// addresses must land in 8 distinct groups. Unswizzled, with a row of 64 elements
// (128 bytes) all 8 land in the same group: an 8-way conflict.
//
// The rule, for kChunks = kCols / 8 chunks per row: let S be the largest power of
// two <= 8 dividing kChunks, and R = 8 / S. Then f(row) = (row / R) % S, which only
// flips the low log2(S) bits of the chunk index (so it stays inside the row). The
// bank group of (row, chunk) is (row * kChunks + (chunk ^ f(row))) % 8:
//   - kChunks % 8 == 0 (kCols = 64, 128, 192, 256): S = 8, f = row % 8 — the classic
//     XOR swizzle; the groups are chunk ^ (row % 8), all distinct.
//   - kChunks % 8 == 4 (kCols = 32, 96, 160, 224): S = 4, f = (row / 2) % 4; the
//     group's bit 2 comes from row parity, bits 0-1 from chunk ^ f: all distinct.
//   - kChunks % 4 == 2 (kCols = 16, 48, 80, ...): S = 2, f = (row / 4) % 2; likewise.
//   - kChunks odd: S = 1, no swizzle needed, row * kChunks % 8 is already a bijection.
// tests/cuda/test_swizzle.cpp checks the bijection and the conflict-freedom.
#pragma once

#include <cstdint>

#include "flashattn/config.hpp"

namespace flashattn::cuda {

inline constexpr int kChunkElements = 8;  // 16 bytes of 16-bit elements

template <int kRows, int kCols>
struct SwizzledTile {
  static_assert(kCols % kChunkElements == 0, "rows must be whole 16-byte chunks");
  static constexpr int kChunks = kCols / kChunkElements;
  static constexpr int kSwizzleWidth = kChunks % 8 == 0 ? 8 : kChunks % 4 == 0 ? 4 : kChunks % 2 == 0 ? 2 : 1;
  static constexpr int kRowsPerStep = 8 / kSwizzleWidth;
  static constexpr int kElements = kRows * kCols;
  static constexpr int kBytes = kElements * 2;

  // Element offset of the first element of logical chunk `chunk` in `row`.
  FLASHATTN_HOST_DEVICE static constexpr int chunk_offset(int row, int chunk) {
    return row * kCols + (chunk ^ ((row / kRowsPerStep) % kSwizzleWidth)) * kChunkElements;
  }
  // The XOR pattern of a row: chunk_offset(row, c) == row * kCols + (c ^ row_swizzle(row)) * 8.
  FLASHATTN_HOST_DEVICE static constexpr int row_swizzle(int row) { return (row / kRowsPerStep) % kSwizzleWidth; }
  // Chunk offset (in elements, within a row) of logical chunk `chunk ^ lane_xor`, for
  // unrolled loops: `chunk` is a compile-time constant and lane_xor < kSwizzleWidth a
  // per-lane value (row_swizzle(row) ^ the lane's own chunk bits). Written so that
  // chunk's high bits stay an immediate and the lane part takes kSwizzleWidth
  // distinct values at most — instead of one hoisted address register per chunk.
  FLASHATTN_HOST_DEVICE static constexpr int xor_chunk_offset(int chunk, int lane_xor) {
    return ((chunk & ~(kSwizzleWidth - 1)) + ((chunk & (kSwizzleWidth - 1)) ^ lane_xor)) * kChunkElements;
  }
  // Element offset of logical element (row, col); col's position inside its chunk is kept.
  FLASHATTN_HOST_DEVICE static constexpr int offset(int row, int col) {
    return chunk_offset(row, col / kChunkElements) + col % kChunkElements;
  }
};

// The TMA / wgmma 128-byte swizzle (CU_TENSOR_MAP_SWIZZLE_128B, descriptor swizzle mode
// 1): a (kRows, d) tile of 16-bit elements is stored as d / 64 panels of 64 columns, each
// row of a panel 128 bytes = eight 16-byte chunks; 16-byte chunk c of row r sits at
// chunk c ^ (r % 8) (the pattern repeats every 8 rows, a 1024-byte atom, so panels start
// 1024-byte aligned); panel p starts at p * kRows * 128 bytes. The Hopper kernels' TMA
// copies write this layout and their wgmma descriptors read it; these give the byte
// offsets of what their threads store or load by hand (the epilogues' O through shared
// memory, the backward's P and dS tiles).
inline constexpr int kSwizzleRowBytes = 128;   // one row of a 64-column panel
inline constexpr int kSwizzleChunkBytes = 16;  // the unit the XOR permutes
inline constexpr int kSwizzleAtomRows = 8;     // rows of one atom
inline constexpr int kSwizzleAtomBytes = kSwizzleAtomRows * kSwizzleRowBytes;  // 1024: tiles start aligned to it
inline constexpr int kSwizzlePanelColumns = kSwizzleRowBytes / 2;  // 16-bit elements per panel row: 64

// Byte offset of 16-byte chunk `chunk` (< 8) of `row` inside one 64-column panel.
FLASHATTN_HOST_DEVICE constexpr int panel_chunk_offset(int row, int chunk) {
  return row * kSwizzleRowBytes + ((chunk ^ (row % kSwizzleAtomRows)) * kSwizzleChunkBytes);
}

// Byte offset of 16-byte chunk `chunk` (of the whole row: panel chunk / 8) of `row` in a
// (kRows, d) tile of 64-column panels.
template <int kRows>
FLASHATTN_HOST_DEVICE constexpr int panels_chunk_offset(int row, int chunk) {
  return (chunk / 8) * kRows * kSwizzleRowBytes + row * kSwizzleRowBytes +
         (((chunk % 8) ^ (row % kSwizzleAtomRows)) * kSwizzleChunkBytes);
}

// The same swizzle over fp32: a (kRows, n) fp32 tile as n / 32 panels of 32 columns (128
// bytes a row), the layout a TMA copy or reduction of (32, kRows) boxes with
// CU_TENSOR_MAP_SWIZZLE_128B reads. Byte offset of element (row, column); a warp's float2
// stores of an mma accumulator's n8 column tile (rows group and group + 8, columns
// 2 quad_lane + {0, 1}) hit each bank twice: the minimum for 256 bytes (the Hopper
// backward's dQ staging; tests/cuda/test_swizzle.cpp).
template <int kRows>
FLASHATTN_HOST_DEVICE constexpr int float_panels_offset(int row, int column) {
  return (column / 32) * kRows * kSwizzleRowBytes + panel_chunk_offset(row, (column % 32) / 4) + (column % 4) * 4;
}

}  // namespace flashattn::cuda
