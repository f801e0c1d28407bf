// tests/cuda/test_hopper_bwd_dq_order.cpp — the deterministic Hopper backward's dQ
// turns (src/cuda/hopper_bwd/dq_order.hpp), pure host arithmetic (runs without a GPU).
// A CTA of the kernel (key block n) adds its dQ tile to query block m iff m is in
// query_blocks_of_key_block; it waits for its turn from key_blocks_of_query_block(m).
// If the two disagreed by one block the kernel would hang or order nothing, so: for
// every query block of many masks, the set {n : m visited by n} (brute force over the
// CTAs that do not return early) is exactly [first, first + count). And the semaphore
// index of (sequence, query block, head) is unique and inside the workspace section.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "flashattn/mask.hpp"
#include "src/core/params.hpp"
#include "src/cuda/bwd/workspace.hpp"
#include "src/cuda/hopper_bwd/dq_order.hpp"

namespace flashattn::cuda::hopper_bwd {
namespace {

std::string describe(const MaskRule& mask, int block_m, int block_n) {
  std::ostringstream out;
  out << "seqlen_q " << mask.seqlen_q << " seqlen_k " << mask.seqlen_k << " window (" << mask.window_left << ", "
      << mask.window_right << ") block_m " << block_m << " block_n " << block_n;
  return out.str();
}

// Checks every query block of `mask`; adds the number of (m, n) visits to *visits.
void check_mask(const MaskRule& mask, int block_m, int block_n, std::int64_t* visits = nullptr) {
  SCOPED_TRACE(describe(mask, block_m, block_n));
  const std::int64_t m_blocks = (mask.seqlen_q + block_m - 1) / block_m;
  const std::int64_t n_blocks = (mask.seqlen_k + block_n - 1) / block_n;  // the CTAs with n0 < seqlen_k
  std::vector<std::vector<std::int64_t>> visitors(static_cast<std::size_t>(m_blocks));
  for (std::int64_t n = 0; n < n_blocks; ++n) {
    const std::int64_t n0 = n * block_n;
    const std::int64_t kv_rows = mask.seqlen_k - n0 < block_n ? mask.seqlen_k - n0 : block_n;
    const QueryBlockRange range = query_blocks_of_key_block(mask, n0, kv_rows, block_m);
    EXPECT_GE(range.count, 0);
    for (int m = range.begin; m < range.begin + range.count; ++m) {
      // The kernel's steps stay inside the query rows (its loads and stores rely on it).
      EXPECT_LT(m, m_blocks) << "key block " << n;
      if (m < m_blocks) visitors[static_cast<std::size_t>(m)].push_back(n);
      if (visits != nullptr) ++*visits;
    }
    // Every block in the range really has a row that sees one of the keys, and the
    // blocks outside it have none (the range is exactly the kernel's need).
    for (std::int64_t m = 0; m < m_blocks; ++m) {
      bool sees = false;
      for (std::int64_t row = m * block_m; row < (m + 1) * block_m && row < mask.seqlen_q && !sees; ++row)
        sees = mask.col_begin(row) < n0 + kv_rows && mask.col_end(row) > n0 &&
               mask.col_begin(row) < mask.col_end(row);
      const bool in_range = m >= range.begin && m < range.begin + range.count;
      EXPECT_EQ(sees, in_range) << "key block " << n << ", query block " << m;
    }
  }
  for (std::int64_t m = 0; m < m_blocks; ++m) {
    const KeyBlockRange keys = key_blocks_of_query_block(mask, m, block_m, block_n);
    const std::vector<std::int64_t>& expected = visitors[static_cast<std::size_t>(m)];  // ascending
    ASSERT_EQ(keys.count, static_cast<std::int64_t>(expected.size())) << "query block " << m;
    for (std::size_t i = 0; i < expected.size(); ++i)
      ASSERT_EQ(keys.first + static_cast<std::int64_t>(i), expected[i]) << "query block " << m << ", visitor " << i;
  }
}

TEST(HopperBwdDqOrder, KeyBlocksOfAQueryBlockAreExactlyItsVisitors) {
  const std::int64_t seqlens[] = {0, 1, 2, 17, 63, 64, 65, 97, 127, 128, 129, 200, 255, 256, 257, 383, 513, 700, 1025};
  const std::int64_t windows[] = {-1, 0, 1, 5, 63, 64, 127, 128, 129, 200, 1000};
  std::int64_t masks = 0, visits = 0;
  for (const int block_m : {64, 128})
    for (const std::int64_t seqlen_q : seqlens)
      for (const std::int64_t seqlen_k : seqlens)
        for (const std::int64_t left : windows)
          for (const std::int64_t right : windows) {
            const MaskRule mask{seqlen_q, seqlen_k, left, right};  // right 0: causal (bottom-right)
            check_mask(mask, block_m, 128, &visits);
            ++masks;
            if (HasFatalFailure()) return;
          }
  EXPECT_GT(visits, masks);  // not vacuous
}

// Tails around the block sizes and seqlen_q far from seqlen_k both ways, where the
// bottom-right alignment pushes whole key or query blocks out of the mask.
TEST(HopperBwdDqOrder, LopsidedSequencesAndOtherKeyBlocks) {
  for (const int block_m : {64, 128})
    for (const int block_n : {64, 128})
      for (std::int64_t seqlen_q = 1; seqlen_q <= 600; seqlen_q += 37)
        for (std::int64_t seqlen_k = 1; seqlen_k <= 2100; seqlen_k += 131)
          for (const std::int64_t left : {-1, 0, 3, 130})
            for (const std::int64_t right : {-1, 0, 3, 130}) {
              check_mask(MaskRule{seqlen_q, seqlen_k, left, right}, block_m, block_n);
              check_mask(MaskRule{seqlen_k, seqlen_q, left, right}, block_m, block_n);
              if (HasFatalFailure()) return;
            }
}

// Semaphores of distinct (sequence, query block) never share an entry, for block_m 64
// and 128, dense and varlen batches (empty and single-token sequences included), and
// every index is inside [0, heads_q * semaphores_per_head).
TEST(HopperBwdDqOrder, SemaphoreIndicesAreDistinctAndInBounds) {
  const std::vector<std::vector<std::int32_t>> varlen_lengths = {
      {0, 1, 70, 129, 5, 0, 200}, {64, 64, 64}, {63, 65, 1, 127, 128, 129}, {1}, {0, 0}, {300}, {1, 1, 1, 1, 1}};
  auto check = [](const BackwardParams& params) {
    const std::int64_t per_head = bwd::Workspace::semaphores_per_head(params);
    const bwd::Workspace workspace{};
    for (const int block_m : {64, 128}) {
      std::set<std::int64_t> seen;
      for (std::int64_t h = 0; h < params.heads_q; ++h)
        for (std::int64_t b = 0; b < params.batch; ++b) {
          const std::int64_t m_blocks = (params.seqlen_q_of(b) + block_m - 1) / block_m;
          for (std::int64_t m = 0; m < m_blocks; ++m) {
            const std::int64_t index = workspace.semaphore_index(params, b, m, block_m, h);
            EXPECT_GE(index, h * per_head);
            EXPECT_LT(index, (h + 1) * per_head);
            EXPECT_TRUE(seen.insert(index).second) << "b " << b << " m " << m << " h " << h << " block_m " << block_m;
          }
        }
    }
  };
  for (const std::vector<std::int32_t>& lengths : varlen_lengths) {
    std::vector<std::int32_t> cu_seqlens = {0};
    for (const std::int32_t length : lengths) cu_seqlens.push_back(cu_seqlens.back() + length);
    BackwardParams params;
    params.batch = static_cast<std::int64_t>(lengths.size());
    params.heads_q = 3;
    params.maybe_cu_seqlens_q = cu_seqlens.data();
    params.total_q = cu_seqlens.back();
    check(params);
  }
  for (const std::int64_t batch : {1, 2, 7})
    for (const std::int64_t seqlen_q : {1, 63, 64, 65, 129, 1000}) {
      BackwardParams params;
      params.batch = batch, params.heads_q = 2, params.seqlen_q = seqlen_q, params.total_q = batch * seqlen_q;
      check(params);
    }
}

// The CTAs' order (key_block_of_cta, both kernels): a bijection of the grid onto (key
// block, head_batch) in both orders and modes; flat is the kernels' original order (key
// block fastest; deterministic: reversed); in sections the default mode starts every
// section's heads at key block 0 (heaviest first under a causal mask); deterministic: a
// CTA's higher key blocks of its head_batch come at lower blockIdx.x (no deadlock).
TEST(HopperBwdDqOrder, CtaOrderIsABijectionAndKeepsTheTurnsAhead) {
  for (const std::int32_t key_blocks : {1, 2, 3, 8, 33})
    for (const std::int32_t head_batches : {1, 2, 5, 16, 37})
      for (const std::int32_t section_heads : {0, 1, 2, 4, 8, 16, 64})
        for (const bool deterministic : {false, true}) {
          SCOPED_TRACE("key blocks " + std::to_string(key_blocks) + " head_batches " + std::to_string(head_batches) +
                       " section " + std::to_string(section_heads) + (deterministic ? " deterministic" : ""));
          const hopper::TileOrder order{key_blocks, head_batches, section_heads};
          std::vector<std::int32_t> linear_of(static_cast<std::size_t>(key_blocks * head_batches), -1);
          for (std::int32_t linear = 0; linear < key_blocks * head_batches; ++linear) {
            const KeyBlockOfCta cta = key_block_of_cta(order, linear, deterministic);
            ASSERT_GE(cta.n_block, 0);
            ASSERT_LT(cta.n_block, key_blocks);
            ASSERT_GE(cta.head_batch, 0);
            ASSERT_LT(cta.head_batch, head_batches);
            std::int32_t& slot = linear_of[static_cast<std::size_t>(cta.head_batch * key_blocks + cta.n_block)];
            EXPECT_EQ(slot, -1) << "two CTAs for key block " << cta.n_block << " of " << cta.head_batch;
            slot = linear;
            if (section_heads == 0) {
              EXPECT_EQ(cta.n_block, deterministic ? key_blocks - 1 - linear % key_blocks : linear % key_blocks);
              EXPECT_EQ(cta.head_batch, linear / key_blocks);
            } else if (!deterministic && linear % (section_heads * key_blocks) == 0) {
              EXPECT_EQ(cta.n_block, 0) << "a section starts with its heaviest (first) key block";
            }
          }
          for (std::int32_t head_batch = 0; head_batch < head_batches; ++head_batch)
            for (std::int32_t n = 0; n + 1 < key_blocks; ++n) {
              const std::int32_t lower = linear_of[static_cast<std::size_t>(head_batch * key_blocks + n)];
              const std::int32_t higher = linear_of[static_cast<std::size_t>(head_batch * key_blocks + n + 1)];
              if (deterministic) EXPECT_LT(higher, lower) << "key block " << n + 1 << " waits behind " << n;
              else EXPECT_LT(lower, higher) << "key block " << n << " (more query blocks) after " << n + 1;
            }
        }
}

// kernel.cuh's walk of the tiles (CtaTiles): every tile exactly once over the CTAs, in
// increasing order per CTA (the deterministic mode cannot deadlock otherwise), one tile per
// CTA in the per-tile grid; and under the causal weights of the flat order (tile t: key
// block t % key_blocks, weight key_blocks - key block) the busiest CTA does at most the
// work of the lightest plus one heaviest tile, where the plain stride gave some CTAs twice
// the work of others (132 CTAs, 8 key blocks).
TEST(HopperBwdDqOrder, CtaTilesCoverEveryTileOnceInIncreasingOrder) {
  for (const std::int32_t num_tiles : {1, 2, 7, 64, 131, 132, 133, 263, 264, 2048, 4099})
    for (const std::int32_t ctas : {1, 2, 3, 7, 66, 132}) {
      if (ctas > num_tiles) continue;
      SCOPED_TRACE("num_tiles " + std::to_string(num_tiles) + " ctas " + std::to_string(ctas));
      std::vector<int> seen(static_cast<std::size_t>(num_tiles), 0);
      for (std::int32_t cta = 0; cta < ctas; ++cta) {
        CtaTiles tiles(cta, ctas, num_tiles);
        std::int32_t previous = -1;
        for (std::int32_t tile; tiles.next(tile);) {
          ASSERT_GE(tile, 0);
          ASSERT_LT(tile, num_tiles);
          EXPECT_GT(tile, previous) << "cta " << cta;
          previous = tile;
          ++seen[static_cast<std::size_t>(tile)];
        }
      }
      for (std::int32_t tile = 0; tile < num_tiles; ++tile) EXPECT_EQ(seen[static_cast<std::size_t>(tile)], 1) << tile;
    }
  for (const std::int32_t num_tiles : {1, 5, 132})
    for (std::int32_t cta = 0; cta < num_tiles; ++cta) {
      CtaTiles tiles(cta, num_tiles, num_tiles);
      std::int32_t tile = -1;
      ASSERT_TRUE(tiles.next(tile));
      EXPECT_EQ(tile, cta);
      EXPECT_FALSE(tiles.next(tile));
    }
  const std::int32_t key_blocks = 8, ctas = 132, num_tiles = key_blocks * 256;
  std::int64_t lightest = INT64_MAX, busiest = 0;
  for (std::int32_t cta = 0; cta < ctas; ++cta) {
    CtaTiles tiles(cta, ctas, num_tiles);
    std::int64_t work = 0;
    for (std::int32_t tile; tiles.next(tile);) work += key_blocks - tile % key_blocks;
    lightest = std::min(lightest, work);
    busiest = std::max(busiest, work);
  }
  EXPECT_LE(busiest, lightest + key_blocks);
}

// kernel.cuh's walks as the scheduler lane computes them, from the take alone: the static
// walk's round-th tile equals CtaTiles::next's round-th, and the first candidate past the
// tiles ends it.
TEST(HopperBwdDqOrder, StatelessWalksMatchTheirClasses) {
  for (const std::int32_t num_tiles : {1, 7, 132, 133, 2048})
    for (const std::int32_t ctas : {1, 3, 132}) {
      if (ctas > num_tiles) continue;
      for (std::int32_t cta = 0; cta < ctas; ++cta) {
        CtaTiles tiles(cta, ctas, num_tiles);
        std::uint32_t round = 0;
        for (std::int32_t tile; tiles.next(tile); ++round)
          EXPECT_EQ(CtaTiles::tile_of_round(cta, ctas, round), static_cast<std::uint32_t>(tile));
        EXPECT_GE(CtaTiles::tile_of_round(cta, ctas, round), static_cast<std::uint32_t>(num_tiles));
      }
    }
}

// The dynamic grid's claims (ClaimedTiles, one shared counter), the CTAs claiming in a random
// interleaving with up to two tiles claimed ahead of the one they run (the kernel's queue):
// every tile exactly once, increasing per CTA; and in deterministic mode, where tile t waits
// for the tiles of its (kv head, sequence) with higher key blocks (all of them here, a
// superset of the kernel's: only those sharing a query block), the run never deadlocks: some
// CTA can always finish its oldest tile or claim, in every interleaving tried, in both CTA
// orders.
TEST(HopperBwdDqOrder, ClaimedTilesCoverEveryTileOnceAndNeverDeadlock) {
  std::mt19937 random(17);
  for (const std::int32_t key_blocks : {1, 3, 8, 16})
    for (const std::int32_t head_batches : {1, 2, 5, 16})
      for (const std::int32_t section_heads : {0, 2, 4})
        for (const std::int32_t ctas : {1, 2, 3, 7, 20})
          for (int trial = 0; trial < 4; ++trial) {
            const std::int32_t num_tiles = key_blocks * head_batches;
            if (ctas > num_tiles) continue;
            SCOPED_TRACE("key blocks " + std::to_string(key_blocks) + " head_batches " +
                         std::to_string(head_batches) + " section " + std::to_string(section_heads) + " ctas " +
                         std::to_string(ctas) + " trial " + std::to_string(trial));
            const hopper::TileOrder order{key_blocks, head_batches, section_heads};
            std::int32_t counter = 0;
            auto claim = [&]() { return counter++; };
            std::vector<ClaimedTiles> walks;
            for (std::int32_t cta = 0; cta < ctas; ++cta) walks.emplace_back(cta, ctas, num_tiles);
            std::vector<std::vector<std::int32_t>> queued(static_cast<std::size_t>(ctas));
            std::vector<bool> walk_ended(static_cast<std::size_t>(ctas), false);
            std::vector<std::int32_t> last_claimed(static_cast<std::size_t>(ctas), -1);
            std::vector<bool> done(static_cast<std::size_t>(num_tiles), false);
            std::vector<int> claimed(static_cast<std::size_t>(num_tiles), 0);
            // Tile t may finish once every tile it waits for has (deterministic turns).
            auto can_finish = [&](std::int32_t tile) {
              const KeyBlockOfCta at = key_block_of_cta(order, tile, /*deterministic=*/true);
              for (std::int32_t other = 0; other < num_tiles; ++other) {
                const KeyBlockOfCta o = key_block_of_cta(order, other, true);
                if (o.head_batch == at.head_batch && o.n_block > at.n_block && !done[static_cast<std::size_t>(other)])
                  return false;
              }
              return true;
            };
            std::int32_t finished = 0;
            while (finished < num_tiles) {
              std::vector<std::pair<int, std::int32_t>> actions;  // (0 claim | 1 finish, cta)
              for (std::int32_t cta = 0; cta < ctas; ++cta) {
                const auto& queue = queued[static_cast<std::size_t>(cta)];
                if (!walk_ended[static_cast<std::size_t>(cta)] && queue.size() < 3) actions.push_back({0, cta});
                if (!queue.empty() && can_finish(queue.front())) actions.push_back({1, cta});
              }
              ASSERT_FALSE(actions.empty()) << "deadlock with " << finished << " of " << num_tiles << " tiles done";
              const auto [kind, cta] = actions[std::uniform_int_distribution<std::size_t>(0, actions.size() - 1)(random)];
              auto& queue = queued[static_cast<std::size_t>(cta)];
              if (kind == 0) {
                std::int32_t tile = -1;
                if (!walks[static_cast<std::size_t>(cta)].next(tile, claim)) {
                  walk_ended[static_cast<std::size_t>(cta)] = true;
                  continue;
                }
                ASSERT_GE(tile, 0);
                ASSERT_LT(tile, num_tiles);
                EXPECT_GT(tile, last_claimed[static_cast<std::size_t>(cta)]) << "cta " << cta;
                last_claimed[static_cast<std::size_t>(cta)] = tile;
                ++claimed[static_cast<std::size_t>(tile)];
                queue.push_back(tile);
              } else {
                done[static_cast<std::size_t>(queue.front())] = true;
                queue.erase(queue.begin());
                ++finished;
              }
            }
            for (std::int32_t tile = 0; tile < num_tiles; ++tile)
              EXPECT_EQ(claimed[static_cast<std::size_t>(tile)], 1) << tile;
          }
  // One CTA per tile: its own tile and no claim.
  std::int32_t counter = 0;
  ClaimedTiles walk(4, 5, 5);
  std::int32_t tile = -1;
  ASSERT_TRUE(walk.next(tile, [&]() { return counter++; }));
  EXPECT_EQ(tile, 4);
  EXPECT_FALSE(walk.next(tile, [&]() { return counter++; }));
  EXPECT_EQ(counter, 0);
}

}  // namespace
}  // namespace flashattn::cuda::hopper_bwd
