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

// fp32 panels (the Hopper backward's dQ staging, 64 rows x 64 columns per consumer): a
// bijection onto the tile's bytes, TMA's 128-byte swizzle (16-byte chunk c of row r at
// c ^ (r % 8), element order kept inside a chunk), and every warp float2 store of an
// accumulator column tile (warp w's rows 16 w + group (+ 8), columns 8 j + 2 quad_lane)
// uses each 4-byte bank exactly twice: 2 wavefronts for its 256 bytes, the minimum.
TEST(Swizzle, FloatPanelsAreTheTmaSwizzleAndConflictFree) {
  constexpr int kRows = 64, kColumns = 64;
  std::set<int> seen;
  for (int row = 0; row < kRows; ++row)
    for (int column = 0; column < kColumns; ++column) {
      const int offset = float_panels_offset<kRows>(row, column);
      EXPECT_EQ(offset % 4, 0);
      const int panel_offset = offset % (kRows * 128), panel = offset / (kRows * 128);
      EXPECT_EQ(panel, column / 32);
      EXPECT_EQ(panel_offset / 128, row);
      EXPECT_EQ((panel_offset % 128) / 16, ((column % 32) / 4) ^ (row % 8)) << row << ", " << column;
      EXPECT_EQ(panel_offset % 16, (column % 4) * 4);
      seen.insert(offset);
    }
  EXPECT_EQ(static_cast<int>(seen.size()), kRows * kColumns);
  for (int warp = 0; warp < 4; ++warp)
    for (int j = 0; j < kColumns / 8; ++j)
      for (int half = 0; half < 2; ++half) {
        int uses[32] = {};
        for (int lane = 0; lane < 32; ++lane) {
          const int offset = float_panels_offset<kRows>(16 * warp + lane / 4 + 8 * half, 8 * j + 2 * (lane % 4));
          EXPECT_EQ(offset % 8, 0) << "float2 alignment";
          ++uses[(offset / 4) % 32];
          ++uses[(offset / 4 + 1) % 32];
        }
        for (int bank = 0; bank < 32; ++bank) EXPECT_EQ(uses[bank], 2) << "warp " << warp << " j " << j;
      }
}

}  // namespace
}  // namespace flashattn::cuda
