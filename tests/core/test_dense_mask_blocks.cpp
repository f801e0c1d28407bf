// tests/core/test_dense_mask_blocks.cpp — the block form of a dense boolean attn_mask
// (src/core/dense_mask_blocks.hpp) on the host: codes, bits and lists against the mask
// element by element, for tails, broadcast dimensions, empty rows and whole empty/full
// blocks. The CUDA conversion is checked against this one (tests/cuda/test_masks.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flashattn/error.hpp"
#include "src/core/dense_mask_blocks.hpp"

namespace flashattn {
namespace {

// A boolean mask of shape [mb, mh, mq, mk] (1 = broadcast) over (batch, heads, sq, sk).
struct Mask {
  std::int64_t batch, heads, seqlen_q, seqlen_k;
  std::int64_t shape[4];
  std::vector<std::uint8_t> bytes;

  std::int64_t stride(int d) const {
    std::int64_t s = 1;
    for (int e = d + 1; e < 4; ++e) s *= shape[e];
    return shape[d] == 1 ? 0 : s;
  }
  std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return b * stride(0) + h * stride(1) + i * stride(2) + j * stride(3);
  }
  bool allowed(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return bytes[static_cast<std::size_t>(offset(b, h, i, j))] != 0;
  }
  AttentionParams params() const {
    AttentionParams p;
    p.batch = batch, p.heads_q = heads, p.heads_kv = heads, p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k;
    p.maybe_attn_mask = bytes.data();
    p.attn_mask_dtype = DType::boolean;
    for (int d = 0; d < 4; ++d) p.attn_mask_strides[d] = stride(d);
    return p;
  }
};

// Random elements (keep probability 0.6) plus structure: row 5 sees nothing, rows
// [32, 64) see nothing (whole empty blocks at 16 and 32), and the key columns [64, 96)
// of rows [64, 128) are all allowed (whole full blocks); with uint8 values other than 1.
Mask make_mask(std::int64_t batch, std::int64_t heads, std::int64_t sq, std::int64_t sk, std::vector<std::int64_t> shape,
               std::uint64_t seed) {
  Mask m{batch, heads, sq, sk, {shape[0], shape[1], shape[2], shape[3]}, {}};
  m.bytes.assign(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]), 0);
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution keep(0.6);
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t h = 0; h < shape[1]; ++h)
      for (std::int64_t i = 0; i < shape[2]; ++i)
        for (std::int64_t j = 0; j < shape[3]; ++j) {
          bool value = keep(rng);
          if (shape[2] > 1 && (i == 5 || (i >= 32 && i < 64))) value = false;
          if (shape[2] > 1 && i >= 64 && i < 128 && shape[3] > 1 && j >= 64 && j < 96) value = true;
          m.bytes[static_cast<std::size_t>(m.offset(b, h, i, j))] = value ? static_cast<std::uint8_t>(1 + (i + j) % 3) : 0;
        }
  return m;
}

// The element rule of the block form at (b, h, i, j) through the codes (as the CUDA
// kernels read it: DeviceMask::block_allows).
bool code_allows(const DenseBlockMask& blocks, const BlockMaskView& view, std::int64_t b, std::int64_t h, std::int64_t i,
                 std::int64_t j) {
  const DenseMaskGrid& g = blocks.grid;
  const std::int32_t code = blocks.codes[static_cast<std::size_t>(
      g.dense_index(g.batches > 1 ? b : 0, g.heads > 1 ? h : 0, i / g.block_m, j / g.block_n))];
  if (code == DeviceMask::kEmptyBlock) return false;
  if (code == DeviceMask::kFullBlock) return true;
  return view.rule.allowed(b, i, j, code);
}

// The kinds of the blocks of (b, h) from the lists of one direction (rows x columns).
std::vector<int> kinds_from_lists(const BlockMaskView& view, std::int64_t b, std::int64_t h, bool by_query) {
  const std::int64_t rows = by_query ? view.q_blocks : view.kv_blocks, columns = by_query ? view.kv_blocks : view.q_blocks;
  std::vector<int> kinds(static_cast<std::size_t>(rows * columns), 0);  // 0 empty, 1 partial, 2 full
  for (std::int64_t row = 0; row < rows; ++row) {
    const BlockList partial = by_query ? view.partial_key_blocks(b, h, row) : view.partial_query_blocks(b, h, row);
    const BlockList full = by_query ? view.full_key_blocks(b, h, row) : view.full_query_blocks(b, h, row);
    std::int32_t previous = -1;
    for (std::int32_t k = 0; k < partial.count; ++k) {
      EXPECT_GT(partial.at(k), previous) << "partial list not ascending";
      previous = partial.at(k);
      kinds[static_cast<std::size_t>(row * columns + partial.at(k))] += 1;
    }
    previous = -1;
    for (std::int32_t k = 0; k < full.count; ++k) {
      EXPECT_GT(full.at(k), previous) << "full list not ascending";
      previous = full.at(k);
      kinds[static_cast<std::size_t>(row * columns + full.at(k))] += 2;
    }
  }
  return kinds;
}

void expect_block_form_matches(const Mask& mask, std::int64_t block_m, std::int64_t block_n, const std::string& label) {
  const AttentionParams params = mask.params();
  DenseBlockMask blocks;
  build_dense_block_mask(params, block_m, block_n, blocks);
  const DenseMaskGrid& g = blocks.grid;
  const BlockMaskView view = blocks.view();
  // A broadcast dimension stays broadcast.
  EXPECT_EQ(g.batches, mask.shape[0] == 1 ? 1 : mask.batch) << label;
  EXPECT_EQ(g.heads, mask.shape[1] == 1 ? 1 : mask.heads) << label;
  EXPECT_EQ(g.q_blocks, (mask.seqlen_q + block_m - 1) / block_m) << label;
  EXPECT_EQ(g.kv_blocks, (mask.seqlen_k + block_n - 1) / block_n) << label;
  ASSERT_EQ(blocks.bits.size(), static_cast<std::size_t>(g.block_count() * block_m * g.words_per_row)) << label;
  for (std::int64_t b = 0; b < mask.batch; ++b)
    for (std::int64_t h = 0; h < mask.heads; ++h) {
      // Every element through the codes and bits equals the mask.
      for (std::int64_t i = 0; i < mask.seqlen_q; ++i)
        for (std::int64_t j = 0; j < mask.seqlen_k; ++j)
          ASSERT_EQ(code_allows(blocks, view, b, h, i, j), mask.allowed(b, h, i, j))
              << label << " element (" << b << ", " << h << ", " << i << ", " << j << ")";
      const std::vector<int> kv_kinds = kinds_from_lists(view, b, h, true);
      const std::vector<int> q_kinds = kinds_from_lists(view, b, h, false);
      for (std::int64_t m = 0; m < g.q_blocks; ++m)
        for (std::int64_t n = 0; n < g.kv_blocks; ++n) {
          std::int64_t allowed = 0, inside = 0;
          for (std::int64_t i = m * block_m; i < std::min((m + 1) * block_m, mask.seqlen_q); ++i)
            for (std::int64_t j = n * block_n; j < std::min((n + 1) * block_n, mask.seqlen_k); ++j, ++inside)
              allowed += mask.allowed(b, h, i, j);
          const int expected = allowed == 0 ? 0 : (allowed == inside ? 2 : 1);
          const std::int64_t index = g.dense_index(g.batches > 1 ? b : 0, g.heads > 1 ? h : 0, m, n);
          const std::int32_t code = blocks.codes[static_cast<std::size_t>(index)];
          const std::string block = label + " block (" + std::to_string(b) + ", " + std::to_string(h) + ", " +
                                    std::to_string(m) + ", " + std::to_string(n) + ")";
          // The code: empty, full, or the block's own position as its partial id.
          EXPECT_EQ(code, expected == 0 ? DeviceMask::kEmptyBlock : expected == 2 ? DeviceMask::kFullBlock
                                                                                   : static_cast<std::int32_t>(index))
              << block;
          // Both lists name the block once, in the list of its kind (the transpose agrees).
          EXPECT_EQ(kv_kinds[static_cast<std::size_t>(m * g.kv_blocks + n)], expected) << block << " in the kv lists";
          EXPECT_EQ(q_kinds[static_cast<std::size_t>(n * g.q_blocks + m)], expected) << block << " in the q lists";
          // Bits outside the sequences are 0 (tails).
          for (std::int64_t r = 0; r < block_m; ++r)
            for (std::int64_t c = 0; c < block_n; ++c) {
              if (m * block_m + r < mask.seqlen_q && n * block_n + c < mask.seqlen_k) continue;
              const std::uint32_t word = blocks.bits[static_cast<std::size_t>((index * block_m + r) * g.words_per_row + c / 32)];
              ASSERT_EQ((word >> (c % 32)) & 1u, 0u) << block << " bit (" << r << ", " << c << ") past the sequences";
            }
        }
      // A partial entry carries its block's code as its id.
      for (std::int64_t m = 0; m < g.q_blocks; ++m) {
        const BlockList partial = view.partial_key_blocks(b, h, m);
        for (std::int32_t k = 0; k < partial.count; ++k)
          EXPECT_EQ(partial.id_at(k), blocks.codes[static_cast<std::size_t>(
                                          g.dense_index(g.batches > 1 ? b : 0, g.heads > 1 ? h : 0, m, partial.at(k)))])
              << label;
      }
    }
}

TEST(DenseMaskBlocks, BlockFormEqualsTheMask) {
  struct Case {
    std::string name;
    std::int64_t batch, heads, sq, sk;
    std::vector<std::int64_t> shape;
  };
  const std::vector<Case> cases = {
      {"full shape, tails", 2, 3, 150, 97, {2, 3, 150, 97}},
      {"broadcast batch", 3, 2, 130, 200, {1, 2, 130, 200}},
      {"broadcast heads", 2, 4, 129, 65, {2, 1, 129, 65}},
      {"broadcast batch and heads", 2, 2, 200, 130, {1, 1, 200, 130}},
      {"broadcast rows", 2, 2, 70, 90, {2, 1, 1, 90}},
      {"broadcast columns", 1, 2, 90, 70, {1, 2, 90, 1}},
      {"one block", 1, 1, 17, 33, {1, 1, 17, 33}},
  };
  for (const Case& c : cases) {
    const Mask mask = make_mask(c.batch, c.heads, c.sq, c.sk, c.shape, 7);
    for (const auto& [bm, bn] : {std::pair<std::int64_t, std::int64_t>{16, 16}, {32, 64}, {64, 32}, {128, 128}, {16, 256}})
      expect_block_form_matches(mask, bm, bn, c.name + " blocks " + std::to_string(bm) + "x" + std::to_string(bn));
  }
}

// The mask block for a kernel tile: the tile itself when a power of two, else the
// largest power of two dividing it (kernel tiles are whole numbers of blocks).
TEST(DenseMaskBlocks, BlockForTile) {
  EXPECT_EQ(dense_mask_block_for_tile(128), 128);
  EXPECT_EQ(dense_mask_block_for_tile(64), 64);
  EXPECT_EQ(dense_mask_block_for_tile(80), 16);
  EXPECT_EQ(dense_mask_block_for_tile(176), 16);
  EXPECT_EQ(dense_mask_block_for_tile(192), 64);
  EXPECT_EQ(dense_mask_block_for_tile(8), kMinMaskBlock);
  EXPECT_EQ(dense_mask_block_for_tile(4096), kMaxMaskBlock);
  for (std::int64_t tile : {16, 32, 48, 64, 80, 96, 112, 128, 144, 176, 192, 256})
    EXPECT_EQ(tile % dense_mask_block_for_tile(tile), 0) << tile;
}

// Only a dense boolean mask alone converts: a bias, a block mask with it, varlen do not.
TEST(DenseMaskBlocks, WhatConverts) {
  const Mask mask = make_mask(1, 1, 40, 40, {1, 1, 40, 40}, 3);
  AttentionParams p = mask.params();
  EXPECT_TRUE(is_dense_mask_convertible(p));
  AttentionParams bias = p;
  bias.attn_mask_is_bias = true, bias.attn_mask_dtype = DType::float32;
  EXPECT_FALSE(is_dense_mask_convertible(bias));
  AttentionParams with_block = p;
  with_block.block_mask.block_m = 16;
  EXPECT_FALSE(is_dense_mask_convertible(with_block));
  AttentionParams varlen = p;
  const std::int32_t cu_seqlens[2] = {0, 40};
  varlen.maybe_cu_seqlens_q = cu_seqlens, varlen.maybe_cu_seqlens_k = cu_seqlens;
  EXPECT_FALSE(is_dense_mask_convertible(varlen));
  AttentionParams none = p;
  none.maybe_attn_mask = nullptr;
  EXPECT_FALSE(is_dense_mask_convertible(none));
  // Broadcast along rows (a key-padding mask) or columns: the block form would hold bits
  // for every (row, column).
  const Mask rows = make_mask(1, 1, 40, 40, {1, 1, 1, 40}, 3);
  EXPECT_FALSE(is_dense_mask_convertible(rows.params()));
  const Mask columns = make_mask(1, 1, 40, 40, {1, 1, 40, 1}, 3);
  EXPECT_FALSE(is_dense_mask_convertible(columns.params()));
  const Mask one_row = make_mask(1, 1, 1, 40, {1, 1, 1, 40}, 3);
  EXPECT_TRUE(is_dense_mask_convertible(one_row.params()));
}

// Block ids are int32: a grid past 2^31 blocks is refused, naming attn_mask.
TEST(DenseMaskBlocks, GridTooLargeIsRefused) {
  AttentionParams p;
  p.batch = 1 << 12, p.heads_q = 64, p.seqlen_q = 1 << 16, p.seqlen_k = 1 << 16;
  const std::uint8_t byte = 1;
  p.maybe_attn_mask = &byte;
  for (int d = 0; d < 4; ++d) p.attn_mask_strides[d] = 1;
  try {
    (void)dense_mask_grid(p, 16, 16);
    ADD_FAILURE() << "accepted a grid of more than 2^31 blocks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flashattn: attn_mask"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dense_mask_grid(p, 1024, 1024).block_count(), (std::int64_t{1} << 18) * 64 * 64);
}

}  // namespace
}  // namespace flashattn
