// tests/core/test_mask_contract.cpp — the mask contract (flashattn/mask.hpp) on the
// interval model and the block-sparse model's bounds safety (flashattn/block_mask.hpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "flashattn/block_mask.hpp"
#include "flashattn/mask.hpp"

namespace flashattn {
namespace {

// tile_kind, key_blocks and query_blocks agree with allowed() element by element.
TEST(MaskContract, IntervalModelAgreesWithAllowed) {
  for (MaskRule rule : {MaskRule{37, 53, -1, 0}, MaskRule{53, 37, -1, 0}, MaskRule{40, 40, 5, 3}, MaskRule{30, 70, -1, -1}, MaskRule{64, 64, 0, 0}}) {
    for (std::int64_t bm : {8, 16}) {
      for (std::int64_t bn : {8, 32}) {
        for (std::int64_t r0 = 0; r0 < rule.seqlen_q; r0 += bm) {
          const std::int64_t r1 = std::min(rule.seqlen_q, r0 + bm);
          const BlockRange blocks = rule.key_blocks(r0, r1, bn);
          for (std::int64_t c0 = 0; c0 < rule.seqlen_k; c0 += bn) {
            const std::int64_t c1 = std::min(rule.seqlen_k, c0 + bn);
            std::int64_t allowed = 0;
            for (std::int64_t i = r0; i < r1; ++i)
              for (std::int64_t j = c0; j < c1; ++j) allowed += rule.allowed(i, j);
            const TileKind expected = allowed == 0 ? TileKind::empty : (allowed == (r1 - r0) * (c1 - c0) ? TileKind::full : TileKind::partial);
            EXPECT_EQ(rule.tile_kind(r0, r1, c0, c1), expected) << r0 << "," << c0;
            const bool listed = c0 / bn >= blocks.begin && c0 / bn < blocks.end;
            if (allowed > 0) EXPECT_TRUE(listed) << "key block " << c0 / bn << " of rows " << r0;
            const BlockRange q_blocks = rule.query_blocks(c0, c1, bm);
            if (allowed > 0) EXPECT_TRUE(r0 / bm >= q_blocks.begin && r0 / bm < q_blocks.end);
          }
        }
      }
    }
  }
}

// A BlockList never yields more entries than its capacity nor an index out of range.
TEST(MaskContract, BlockListsAreBoundsSafe) {
  std::vector<std::int32_t> num{5, -3};
  std::vector<std::int32_t> indices{0, 7, -1, 2, 1, 1, 1, 1};  // [1, 1, 2, 4]
  BlockListTensor t;
  t.num_blocks = num.data();
  t.indices = indices.data();
  t.num_strides[2] = 1;
  t.index_strides[2] = 4;
  t.capacity = 4;
  const BlockList row0 = t.row(0, 0, 0, 3);
  EXPECT_EQ(row0.count, 4);  // 5 clamped to the capacity
  EXPECT_EQ(row0.at(0), 0);
  EXPECT_EQ(row0.at(1), -1);  // 7 >= 3 blocks
  EXPECT_EQ(row0.at(2), -1);
  EXPECT_EQ(row0.at(3), 2);
  EXPECT_EQ(t.row(0, 0, 1, 3).count, 0);  // negative count
}

TEST(MaskContract, ElementRules) {
  ElementRule rule;
  rule.has_band = true;
  rule.window_right = 0;  // causal, top-left
  EXPECT_TRUE(rule.allowed(0, 5, 5, -1));
  EXPECT_FALSE(rule.allowed(0, 5, 6, -1));
  std::int32_t prefix = 8;
  rule.maybe_prefix_lengths = &prefix;
  EXPECT_TRUE(rule.allowed(0, 2, 7, -1));  // inside the prefix
  EXPECT_FALSE(rule.allowed(0, 2, 8, -1));
  std::vector<std::uint32_t> bits(16, 0);  // one 16x16 block, one word per row
  bits[3] = 1u << 4;
  ElementRule b;
  b.maybe_partial_bits = bits.data(), b.partial_block_count = 1, b.block_m = 16, b.block_n = 16, b.words_per_row = 1;
  EXPECT_TRUE(b.allowed(0, 16 + 3, 32 + 4, 0));
  EXPECT_FALSE(b.allowed(0, 16 + 3, 32 + 5, 0));
  EXPECT_FALSE(b.allowed(0, 16 + 3, 32 + 4, 1));  // a bad id denies
  EXPECT_TRUE(is_valid_mask_block_size(128));
  EXPECT_FALSE(is_valid_mask_block_size(96));
  EXPECT_FALSE(is_valid_mask_block_size(8));
}

}  // namespace
}  // namespace flashattn
