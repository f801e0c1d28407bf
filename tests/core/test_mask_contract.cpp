// tests/core/test_mask_contract.cpp — the mask contract (flashattn/mask.hpp) on the
// interval model and the block-sparse model's bounds safety (flashattn/block_mask.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "flashattn/block_mask.hpp"
#include "flashattn/mask.hpp"
#include "src/core/mask_tables.hpp"

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

// The rules the block-range tests sweep: causal, windows on either side, seqlen_q != seqlen_k
// both ways, single rows and single keys.
std::vector<MaskRule> awkward_rules() {
  std::vector<MaskRule> rules;
  for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{200, 200}, {131, 517}, {517, 131}, {64, 384},
                        {383, 1}, {1, 383}, {250, 250}}) {
    for (auto [left, right] : {std::pair<std::int64_t, std::int64_t>{-1, -1}, {-1, 0}, {-1, 37}, {0, 0}, {100, 0},
                               {64, 64}, {3, -1}, {200, 5}})
      rules.push_back(MaskRule{sq, sk, left, right});
  }
  return rules;
}

// Every element of rows [r0, r1) x columns [c0, c1) allowed, one by one (a column past
// seqlen_k is not).
bool every_element_allowed(const MaskRule& rule, std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
  for (std::int64_t i = r0; i < r1; ++i)
    for (std::int64_t j = c0; j < c1; ++j)
      if (j >= rule.seqlen_k || !rule.allowed(i, j)) return false;
  return true;
}

// full_key_blocks is exactly the set of key blocks whose every element is allowed for
// every row of the query range, element by element: causal, windows, seqlen_q != seqlen_k,
// query ranges at any row offset (varlen sequences, clipped last tiles), the kernels'
// block sizes and the key blocks past the end of the keys.
TEST(MaskContract, FullKeyBlocksAgreeWithAllowed) {
  std::int64_t full_blocks_seen = 0;
  std::int64_t partial_blocks_seen = 0;
  for (const MaskRule& rule : awkward_rules()) {
    for (std::int64_t bn : {64, 128, 176, 192}) {
      for (std::int64_t bm : {64, 128, 192}) {
        for (std::int64_t offset : {0, 1, 29}) {  // the row where a tile grid starts
          for (std::int64_t r0 = offset; r0 < rule.seqlen_q; r0 += bm) {
            const std::int64_t r1 = std::min(rule.seqlen_q, r0 + bm);
            const BlockRange full = rule.full_key_blocks(r0, r1, bn);
            const BlockRange visited = rule.key_blocks(r0, r1, bn);
            EXPECT_LE(full.begin, full.end);
            if (!full.empty()) {
              EXPECT_GE(full.begin, visited.begin);
              EXPECT_LE(full.end, visited.end);
            }
            for (std::int64_t b = 0; b * bn < rule.seqlen_k + bn; ++b) {
              const std::int64_t c0 = b * bn;
              const bool every_allowed = every_element_allowed(rule, r0, r1, c0, c0 + bn);
              const bool in_full = b >= full.begin && b < full.end;
              EXPECT_EQ(in_full, every_allowed) << "rule " << rule.seqlen_q << "x" << rule.seqlen_k << " window ("
                                                << rule.window_left << "," << rule.window_right << ") rows [" << r0
                                                << "," << r1 << ") block " << b << " of " << bn;
              // The kernels' former per-block test, for the visited blocks.
              if (b >= visited.begin && b < visited.end)
                EXPECT_EQ(in_full, c0 + bn <= rule.seqlen_k && rule.tile_fully_allowed(r0, r1, c0, c0 + bn));
              full_blocks_seen += in_full;
              partial_blocks_seen += !in_full && b >= visited.begin && b < visited.end;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(full_blocks_seen, 0);
  EXPECT_GT(partial_blocks_seen, 0);
  EXPECT_TRUE(MaskRule({10, 10, -1, 0}).full_key_blocks(5, 5, 64).empty());
}

// full_query_blocks (the backward's key-tile direction) is exactly the set of query blocks
// whose every row sees every column of the key tile, element by element: causal, windows,
// seqlen_q != seqlen_k, the clipped last query block, key tiles at any column offset and
// past the end of the keys, the kernels' block sizes.
TEST(MaskContract, FullQueryBlocksAgreeWithAllowed) {
  std::int64_t full_blocks_seen = 0;
  std::int64_t partial_blocks_seen = 0;
  for (const MaskRule& rule : awkward_rules()) {
    for (std::int64_t bn : {64, 128, 176}) {
      for (std::int64_t bm : {64, 128, 192}) {
        for (std::int64_t offset : {0, 1, 29}) {  // the column where a key tile grid starts
          for (std::int64_t c0 = offset; c0 < rule.seqlen_k; c0 += bn) {
            const std::int64_t c1 = c0 + bn;  // may reach past seqlen_k (the last key tile)
            const BlockRange full = rule.full_query_blocks(c0, c1, bm);
            const BlockRange visited = rule.query_blocks(c0, std::min(c1, rule.seqlen_k), bm);
            EXPECT_LE(full.begin, full.end);
            if (!full.empty()) {
              EXPECT_GE(full.begin, visited.begin);
              EXPECT_LE(full.end, visited.end);
            }
            for (std::int64_t m = 0; m * bm < rule.seqlen_q; ++m) {
              const std::int64_t r0 = m * bm, r1 = std::min(rule.seqlen_q, r0 + bm);
              const bool every_allowed = every_element_allowed(rule, r0, r1, c0, c1);
              const bool in_full = m >= full.begin && m < full.end;
              EXPECT_EQ(in_full, every_allowed) << "rule " << rule.seqlen_q << "x" << rule.seqlen_k << " window ("
                                                << rule.window_left << "," << rule.window_right << ") columns [" << c0
                                                << "," << c1 << ") block " << m << " of " << bm;
              // The backward's former per-step test (hopper_bwd/kernel.cuh), for the visited blocks.
              if (m >= visited.begin && m < visited.end)
                EXPECT_EQ(in_full, c1 <= rule.seqlen_k && rule.tile_fully_allowed(r0, r1, c0, c1));
              full_blocks_seen += in_full;
              partial_blocks_seen += !in_full && m >= visited.begin && m < visited.end;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(full_blocks_seen, 0);
  EXPECT_GT(partial_blocks_seen, 0);
  EXPECT_TRUE(MaskRule({10, 10, -1, 0}).full_query_blocks(5, 5, 64).empty());
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

// The fast element pass's spans (mask_tables.hpp) equal the per-element test — the
// interval rule, then the block code and ElementRule — row by row and, transposed, key by
// key, for every combination of band, prefix and sorted documents, on full and partial
// tiles; the document spans are made as the device does (binary search in sorted ids).
TEST(MaskContract, AllowedSpansAgreeWithElementRule) {
  const std::vector<std::int32_t> q_documents{0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5};
  const std::vector<std::int32_t> k_documents{0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5};
  const std::int64_t seqlen_q = static_cast<std::int64_t>(q_documents.size());
  const std::int64_t seqlen_k = static_cast<std::int64_t>(k_documents.size());
  auto document_span = [](const std::vector<std::int32_t>& other, std::int32_t id) {
    return DocumentSpan{std::lower_bound(other.begin(), other.end(), id) - other.begin(),
                        std::upper_bound(other.begin(), other.end(), id) - other.begin()};
  };
  std::int32_t prefix = 7;
  std::int64_t checked = 0;
  for (MaskRule mask : {MaskRule{seqlen_q, seqlen_k, -1, -1}, MaskRule{seqlen_q, seqlen_k, -1, 0},
                        MaskRule{seqlen_q, seqlen_k, 6, 2}, MaskRule{seqlen_q, seqlen_k, 0, 0}}) {
    for (int band = 0; band < 4; ++band) {
      for (bool has_prefix : {false, true}) {
        for (bool has_documents : {false, true}) {
          ElementRule rule;
          rule.has_band = band > 0;
          rule.window_right = band == 1 ? 0 : (band == 2 ? 3 : -1);
          rule.window_left = band == 2 ? 5 : (band == 3 ? 4 : -1);
          rule.diagonal_offset = band == 3 ? -2 : (band == 2 ? 3 : 0);
          if (has_prefix && rule.has_band) rule.maybe_prefix_lengths = &prefix;
          if (has_documents) rule.maybe_q_document_ids = q_documents.data(), rule.maybe_k_document_ids = k_documents.data();
          for (std::int32_t code : {DeviceMask::kFullBlock, std::int32_t{0}}) {
            auto expected = [&](std::int64_t row, std::int64_t col) {
              return mask.allowed(row, col) && (code == DeviceMask::kFullBlock || rule.allowed(0, row, col, code));
            };
            for (std::int64_t row = 0; row < seqlen_q + 2; ++row) {
              const DocumentSpan documents =
                  row < seqlen_q ? document_span(k_documents, q_documents[row]) : DocumentSpan{};
              const AllowedSpans spans = allowed_key_spans(mask, rule, code, row, has_prefix ? prefix : 0, documents);
              for (std::int64_t col = -2; col < seqlen_k + 2; ++col) {
                const bool inside = row < seqlen_q && col >= 0 && col < seqlen_k;
                EXPECT_EQ(spans.contains(col), inside && expected(row, col))
                    << "band " << band << " prefix " << has_prefix << " documents " << has_documents << " code " << code
                    << " window " << mask.window_left << "," << mask.window_right << " at " << row << "," << col;
                ++checked;
              }
            }
            for (std::int64_t key = 0; key < seqlen_k + 2; ++key) {
              const DocumentSpan documents =
                  key < seqlen_k ? document_span(q_documents, k_documents[key]) : DocumentSpan{};
              const AllowedSpans spans = allowed_query_spans(mask, rule, code, key, has_prefix ? prefix : 0, documents);
              for (std::int64_t row = -2; row < seqlen_q + 2; ++row) {
                const bool inside = key < seqlen_k && row >= 0 && row < seqlen_q;
                EXPECT_EQ(spans.contains(row), inside && expected(row, key))
                    << "transposed: band " << band << " prefix " << has_prefix << " documents " << has_documents
                    << " code " << code << " at " << row << "," << key;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// one_interval_of: where it says one interval, that interval holds exactly the spans'
// columns; it says two only where a column between them is denied. Over rows of every
// band / prefix / documents combination: document-causal, causal prefix-LM and sliding
// rows are one interval, a prefix with a window far from it is not.
TEST(MaskContract, OneIntervalOfSpans) {
  const std::vector<std::int32_t> documents_of{0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5};
  const std::int64_t seqlen = static_cast<std::int64_t>(documents_of.size());
  const MaskRule mask{seqlen, seqlen, -1, -1};
  std::int32_t prefix = 7;
  std::int64_t ones = 0, twos = 0;
  for (int band = 0; band < 4; ++band) {
    for (bool has_prefix : {false, true}) {
      for (bool has_documents : {false, true}) {
        ElementRule rule;
        rule.has_band = band > 0;
        rule.window_right = band == 1 ? 0 : (band == 2 ? 0 : -1);
        rule.window_left = band == 2 ? 3 : (band == 3 ? 4 : -1);
        rule.diagonal_offset = band == 3 ? -2 : 0;
        if (has_prefix && rule.has_band) rule.maybe_prefix_lengths = &prefix;
        if (has_documents) rule.maybe_q_document_ids = documents_of.data(), rule.maybe_k_document_ids = documents_of.data();
        for (std::int64_t row = 0; row < seqlen + 2; ++row) {
          DocumentSpan documents;
          if (row < seqlen)
            documents = {std::lower_bound(documents_of.begin(), documents_of.end(), documents_of[row]) - documents_of.begin(),
                         std::upper_bound(documents_of.begin(), documents_of.end(), documents_of[row]) - documents_of.begin()};
          const AllowedSpans spans = allowed_key_spans(mask, rule, 0, row, has_prefix ? prefix : 0, documents);
          const OneInterval interval = one_interval_of(spans);
          const std::string where = "band " + std::to_string(band) + " prefix " + std::to_string(has_prefix) +
                                    " documents " + std::to_string(has_documents) + " row " + std::to_string(row);
          if (interval.is_one) {
            ++ones;
            for (std::int64_t col = -2; col < seqlen + 2; ++col)
              EXPECT_EQ(col >= interval.begin && col < interval.end, spans.contains(col)) << where << " col " << col;
          } else {
            ++twos;
            std::int64_t first = seqlen, last = -1;
            for (std::int64_t col = 0; col < seqlen; ++col)
              if (spans.contains(col)) first = std::min(first, col), last = std::max(last, col);
            bool has_gap = false;
            for (std::int64_t col = first; col <= last; ++col) has_gap = has_gap || !spans.contains(col);
            EXPECT_TRUE(has_gap) << where;
          }
          if (band == 1 || (band == 0 && has_documents)) EXPECT_TRUE(interval.is_one) << where;  // causal / documents
        }
      }
    }
  }
  EXPECT_GT(ones, 0);
  EXPECT_GT(twos, 0);  // a prefix of 7 and a window of 3 or 4: rows past 11 see two spans
}

// key_query_interval (the Hopper backward's key-interval pass): for a block mask without
// bits, every key's allowed queries are one interval equal, query by query, to the
// per-element test (interval rule, then ElementRule) for every partial id — also where a
// prefix and a window far from it give the query rows two spans — so one interval per key
// serves all of its partial tiles.
TEST(MaskContract, KeyQueryIntervalAgreesWithElementRule) {
  const std::vector<std::int32_t> q_documents{0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5};
  const std::vector<std::int32_t> k_documents{0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5};
  const std::int64_t seqlen_q = static_cast<std::int64_t>(q_documents.size());
  const std::int64_t seqlen_k = static_cast<std::int64_t>(k_documents.size());
  std::int32_t prefix = 7;
  std::int64_t checked = 0, two_span_rows = 0;
  for (MaskRule mask : {MaskRule{seqlen_q, seqlen_k, -1, -1}, MaskRule{seqlen_q, seqlen_k, -1, 0},
                        MaskRule{seqlen_q, seqlen_k, 6, 2}, MaskRule{seqlen_k, seqlen_q, -1, 0}}) {
    const bool is_swapped = mask.seqlen_q != seqlen_q;  // fewer keys than queries: the documents swap roles
    const std::vector<std::int32_t>& queries_of = is_swapped ? k_documents : q_documents;
    const std::vector<std::int32_t>& keys_of = is_swapped ? q_documents : k_documents;
    for (int band = 0; band < 5; ++band) {
      for (bool has_prefix : {false, true}) {
        for (bool has_documents : {false, true}) {
          ElementRule rule;
          rule.has_band = band > 0;
          rule.window_right = band == 1 || band == 4 ? 0 : (band == 2 ? 3 : -1);
          rule.window_left = band == 2 ? 5 : (band == 3 ? 4 : (band == 4 ? 3 : -1));
          rule.diagonal_offset = band == 3 ? -2 : (band == 2 ? 3 : 0);
          if (has_prefix && rule.has_band) rule.maybe_prefix_lengths = &prefix;
          if (has_documents) rule.maybe_q_document_ids = queries_of.data(), rule.maybe_k_document_ids = keys_of.data();
          for (std::int64_t row = 0; row < mask.seqlen_q; ++row) {
            const DocumentSpan documents =
                has_documents ? DocumentSpan{std::lower_bound(keys_of.begin(), keys_of.end(), queries_of[row]) - keys_of.begin(),
                                             std::upper_bound(keys_of.begin(), keys_of.end(), queries_of[row]) - keys_of.begin()}
                              : DocumentSpan{};
            two_span_rows += one_interval_of(allowed_key_spans(mask, rule, 0, row, has_prefix ? prefix : 0, documents)).is_one ? 0 : 1;
          }
          for (std::int64_t key = 0; key < mask.seqlen_k + 2; ++key) {
            const DocumentSpan documents =
                key < mask.seqlen_k && has_documents
                    ? DocumentSpan{std::lower_bound(queries_of.begin(), queries_of.end(), keys_of[key]) - queries_of.begin(),
                                   std::upper_bound(queries_of.begin(), queries_of.end(), keys_of[key]) - queries_of.begin()}
                    : DocumentSpan{};
            const OneInterval interval = key_query_interval(mask, rule, key, has_prefix ? prefix : 0, documents);
            ASSERT_TRUE(interval.is_one) << "band " << band << " prefix " << has_prefix << " key " << key;
            for (std::int32_t partial_id : {0, 1, 5}) {
              for (std::int64_t row = -2; row < mask.seqlen_q + 2; ++row) {
                const bool inside = key < mask.seqlen_k && row >= 0 && row < mask.seqlen_q;
                const bool expected = inside && mask.allowed(row, key) && rule.allowed(0, row, key, partial_id);
                EXPECT_EQ(row >= interval.begin && row < interval.end, expected)
                    << "band " << band << " prefix " << has_prefix << " documents " << has_documents << " id " << partial_id
                    << " window " << mask.window_left << "," << mask.window_right << " at " << row << "," << key;
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
  EXPECT_GT(two_span_rows, 0);  // the query side of the same masks has rows of two spans
}

// A partial tile whose id has no bits (or no bits at all) allows nothing, as ElementRule does.
TEST(MaskContract, AllowedSpansDenyBadPartialIds) {
  const MaskRule mask{64, 64, -1, -1};
  std::vector<std::uint32_t> bits(16, ~0u);
  ElementRule rule;
  rule.maybe_partial_bits = bits.data(), rule.partial_block_count = 1, rule.block_m = 16, rule.block_n = 16, rule.words_per_row = 1;
  EXPECT_TRUE(allowed_key_spans(mask, rule, 0, 3, 0, {}).contains(5));
  EXPECT_FALSE(allowed_key_spans(mask, rule, 1, 3, 0, {}).contains(5));
  EXPECT_FALSE(allowed_query_spans(mask, rule, 1, 3, 0, {}).contains(5));
  rule.partial_block_count = 0;
  EXPECT_FALSE(allowed_key_spans(mask, rule, 0, 3, 0, {}).contains(5));
  EXPECT_FALSE(allowed_key_spans(mask, rule, DeviceMask::kEmptyBlock, 3, 0, {}).contains(5));
  EXPECT_TRUE(allowed_key_spans(mask, rule, DeviceMask::kFullBlock, 3, 0, {}).contains(5));
}

// shared_block_code: the one code under a tile, kGeneralTile when the blocks under it differ,
// for mask blocks smaller than, equal to and larger than the tile.
TEST(MaskContract, SharedBlockCode) {
  BlockMaskView view;
  view.block_m = 32, view.block_n = 16;
  view.q_blocks = 4, view.kv_blocks = 4;
  const std::vector<std::int32_t> codes{-1, -1, 3, -2,   //
                                        -1, -1, 3, 7,    //
                                        5, 5, 5, 5,      //
                                        5, 5, 5, 5};
  EXPECT_EQ(shared_block_code(codes.data(), view, 0, 64, 0, 32), DeviceMask::kFullBlock);  // 2 x 2 full blocks
  EXPECT_EQ(shared_block_code(codes.data(), view, 0, 64, 0, 48), kGeneralTile);
  EXPECT_EQ(shared_block_code(codes.data(), view, 0, 32, 32, 48), 3);         // inside one block
  EXPECT_EQ(shared_block_code(codes.data(), view, 8, 16, 36, 44), 3);         // a tile smaller than the block
  EXPECT_EQ(shared_block_code(codes.data(), view, 0, 64, 32, 48), 3);         // two blocks, one code
  EXPECT_EQ(shared_block_code(codes.data(), view, 0, 64, 48, 64), kGeneralTile);
  EXPECT_EQ(shared_block_code(codes.data(), view, 64, 128, 0, 64), 5);
  EXPECT_EQ(shared_block_code(codes.data(), view, 63, 65, 0, 16), kGeneralTile);  // straddles query blocks
  // With partial bits a partial id is one block's bit-mask: a tile over several blocks
  // sharing it (a pattern stored once) takes the general pass; full codes and a tile
  // inside one block keep theirs.
  const std::vector<std::uint32_t> bits(8 * 32, 0u);
  view.rule.maybe_partial_bits = bits.data();
  EXPECT_EQ(shared_block_code(codes.data(), view, 0, 64, 32, 48), kGeneralTile);  // two blocks, one id
  EXPECT_EQ(shared_block_code(codes.data(), view, 64, 128, 0, 64), kGeneralTile);
  EXPECT_EQ(shared_block_code(codes.data(), view, 64, 96, 16, 32), 5);             // one block
  EXPECT_EQ(shared_block_code(codes.data(), view, 8, 16, 36, 44), 3);
  EXPECT_EQ(shared_block_code(codes.data(), view, 0, 64, 0, 32), DeviceMask::kFullBlock);
}

}  // namespace
}  // namespace flashattn
