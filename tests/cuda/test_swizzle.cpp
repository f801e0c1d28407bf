// tests/cuda/test_swizzle.cpp — the shared-memory swizzle is a bijection inside each
// row and makes every ldmatrix phase (8 consecutive rows at one logical chunk)
// conflict-free. Pure host arithmetic: runs without a GPU.
#include <gtest/gtest.h>

#include <set>

#include "src/cuda/common/swizzle.cuh"

namespace flashattn::cuda {
namespace {

template <int kRows, int kCols>
void check_layout() {
  using Tile = SwizzledTile<kRows, kCols>;
  std::set<int> seen;
  for (int row = 0; row < kRows; ++row) {
    for (int chunk = 0; chunk < Tile::kChunks; ++chunk) {
      const int offset = Tile::chunk_offset(row, chunk);
      EXPECT_GE(offset, row * kCols) << "row " << row << " chunk " << chunk;
      EXPECT_LT(offset, (row + 1) * kCols) << "row " << row << " chunk " << chunk;
      EXPECT_EQ(offset % kChunkElements, 0);
      seen.insert(offset);
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), kRows * Tile::kChunks) << "not a bijection, kCols " << kCols;
  for (int row0 = 0; row0 < kRows; row0 += 8) {
    for (int chunk = 0; chunk < Tile::kChunks; ++chunk) {
      std::set<int> bank_groups;
      for (int r = row0; r < row0 + 8; ++r) bank_groups.insert((Tile::chunk_offset(r, chunk) / kChunkElements) % 8);
      EXPECT_EQ(bank_groups.size(), 8u) << "bank conflict: kCols " << kCols << " rows " << row0 << " chunk " << chunk;
    }
  }
}

TEST(Swizzle, BijectiveAndConflictFree) {
  check_layout<64, 32>();
  check_layout<64, 64>();
  check_layout<64, 96>();
  check_layout<64, 128>();
  check_layout<64, 192>();
  check_layout<64, 256>();
  check_layout<64, 48>();
  check_layout<64, 40>();
}

// The TMA/wgmma 128-byte swizzle of 64-column panels: every 16-byte chunk of a (kRows,
// kCols) tile has its own slot inside the tile, a row's chunks of one panel stay in its
// 128-byte line, and 8 consecutive rows at one chunk hit 8 distinct bank groups.
template <int kRows, int kCols>
void check_panels() {
  constexpr int kChunks = kCols / 8;
  std::set<int> seen;
  for (int row = 0; row < kRows; ++row) {
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      const int offset = panels_chunk_offset<kRows>(row, chunk);
      const int panel_base = (chunk / 8) * kRows * kSwizzleRowBytes;
      EXPECT_GE(offset, panel_base + row * kSwizzleRowBytes) << "row " << row << " chunk " << chunk;
      EXPECT_LT(offset, panel_base + (row + 1) * kSwizzleRowBytes) << "row " << row << " chunk " << chunk;
      EXPECT_EQ(offset - panel_base, panel_chunk_offset(row, chunk % 8));
      seen.insert(offset);
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), kRows * kChunks);
  EXPECT_EQ(*seen.rbegin(), kRows * kCols * 2 - kSwizzleChunkBytes);
  for (int row0 = 0; row0 < kRows; row0 += kSwizzleAtomRows) {
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      std::set<int> bank_groups;
      for (int r = row0; r < row0 + kSwizzleAtomRows; ++r)
        bank_groups.insert((panels_chunk_offset<kRows>(r, chunk) / kSwizzleChunkBytes) % 8);
      EXPECT_EQ(bank_groups.size(), 8u) << "rows " << row0 << " chunk " << chunk;
    }
  }
}

TEST(Swizzle, PanelsOf128ByteSwizzle) {
  check_panels<64, 64>();
  check_panels<128, 128>();
  check_panels<192, 256>();
  check_panels<64, 256>();
}

}  // namespace
}  // namespace flashattn::cuda
