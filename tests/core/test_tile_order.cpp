// The persistent Hopper forward's tile orders (src/cuda/hopper/tile_order.hpp): each is a
// bijection onto the tiles, the flat one is the order the kernels had, and the L2-section
// one visits each section's heaviest query tiles of all its heads first.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "src/cuda/hopper/tile_order.hpp"

namespace flashattn::cuda::hopper {
namespace {

void expect_bijection(const TileOrder& order) {
  const std::int32_t total = order.num_m_blocks * order.num_heads_batches;
  std::vector<int> seen(static_cast<std::size_t>(total), 0);
  for (std::int32_t linear = 0; linear < total; ++linear) {
    const TileOrder::Coordinates c = order.at(linear);
    ASSERT_GE(c.m_block, 0);
    ASSERT_LT(c.m_block, order.num_m_blocks);
    ASSERT_GE(c.head_batch, 0);
    ASSERT_LT(c.head_batch, order.num_heads_batches);
    ++seen[static_cast<std::size_t>(c.head_batch * order.num_m_blocks + c.m_block)];
  }
  for (int count : seen) ASSERT_EQ(count, 1);
}

TEST(TileOrder, FlatIsTheKernelsEarlierOrder) {
  const TileOrder order{8, 6, 0};
  expect_bijection(order);
  for (std::int32_t linear = 0; linear < 48; ++linear) {
    EXPECT_EQ(order.at(linear).m_block, 7 - linear % 8);
    EXPECT_EQ(order.at(linear).head_batch, linear / 8);
  }
}

TEST(TileOrder, SectionsAreBijectionsWithAShortLastSection) {
  for (std::int32_t m_blocks : {1, 2, 7, 16})
    for (std::int32_t heads : {1, 5, 32, 33, 100})
      for (std::int32_t section : {1, 4, 32, 64}) expect_bijection(TileOrder{m_blocks, heads, section});
}

TEST(TileOrder, SectionsRunHeaviestQueryTilesOfAllTheirHeadsFirst) {
  const TileOrder order{4, 10, 4};  // sections of heads {0..3}, {4..7}, {8, 9}
  // Section 0: m_block 3 of heads 0..3, then m_block 2 of heads 0..3, ...
  for (std::int32_t i = 0; i < 16; ++i) {
    EXPECT_EQ(order.at(i).m_block, 3 - i / 4) << i;
    EXPECT_EQ(order.at(i).head_batch, i % 4) << i;
  }
  // The short last section (2 heads) starts at tile 32.
  EXPECT_EQ(order.at(32).m_block, 3);
  EXPECT_EQ(order.at(32).head_batch, 8);
  EXPECT_EQ(order.at(33).head_batch, 9);
  EXPECT_EQ(order.at(34).m_block, 2);
  EXPECT_EQ(order.at(39).m_block, 0);
  EXPECT_EQ(order.at(39).head_batch, 9);
}

TEST(TileOrder, SectionSizeFitsL2) {
  // d128 bf16, 1k keys: K and V of one head are 512 KB; 32 MB holds 64 of them.
  EXPECT_EQ(l2_section_heads(std::int64_t{1024} * 128 * 2 * 2, 1), 64);
  EXPECT_EQ(l2_section_heads(std::int64_t{2048} * 128 * 2 * 2, 4), 32 * 4);  // GQA: whole groups
  EXPECT_EQ(l2_section_heads(std::int64_t{64} << 20, 1), 1);                 // one head over L2: 1
  EXPECT_EQ(l2_section_heads(std::int64_t{3} << 20, 2), 8 * 2);              // a power of two
}

}  // namespace
}  // namespace flashattn::cuda::hopper
