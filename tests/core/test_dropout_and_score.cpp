// tests/core/test_dropout_and_score.cpp — the hardware-free policies of the variant
// layer: Philox against Random123's published known-answer vectors, DropoutRule's
// element sets and keep rate, ScoreRule's formula and gradient factor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <utility>

#include "flashattn/dropout.hpp"
#include "src/cuda/common/dropout_fragment.hpp"
#include "flashattn/score.hpp"

namespace flashattn {
namespace {

struct KnownAnswer {
  std::uint32_t counter[4];
  std::uint32_t key[2];
  std::uint32_t expected[4];
};

// Random123's kat_vectors (philox4x32 7 and 10 rounds).
TEST(Philox, SevenRoundsMatchesPublishedVectors) {
  const KnownAnswer vectors[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}, {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}, {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}},
  };
  for (const auto& v : vectors) {
    const philox::Bits128 got = philox::philox4x32<7>({{v.counter[0], v.counter[1], v.counter[2], v.counter[3]}}, v.key[0], v.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.word[i], v.expected[i]) << "word " << i;
  }
}

TEST(Philox, TenRoundsMatchesPublishedVectors) {
  const KnownAnswer vectors[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}, {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}, {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& v : vectors) {
    const philox::Bits128 got = philox::philox4x32<10>({{v.counter[0], v.counter[1], v.counter[2], v.counter[3]}}, v.key[0], v.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.word[i], v.expected[i]) << "word " << i;
  }
}

// Every element of a 16x32 block belongs to exactly one draw, at a distinct number.
TEST(DropoutRule, ElementSetsPartitionEachBlock) {
  std::set<std::pair<std::int64_t, std::int64_t>> sets;  // (row_base, col_base) seen
  std::set<std::tuple<std::int64_t, std::int64_t, int>> numbers;
  for (std::int64_t row = 32; row < 48; ++row)
    for (std::int64_t col = 64; col < 96; ++col) {
      const std::int64_t row_base = DropoutRule::row_base_of(row), col_base = DropoutRule::col_base_of(col);
      EXPECT_EQ(row_base & 8, 0);
      EXPECT_EQ(col_base & 25, 0);
      const int index = DropoutRule::index_of(row, col);
      ASSERT_GE(index, 0);
      ASSERT_LT(index, 16);
      // The number's position decodes back to the element: 4·t + 2·(row bit 3) + (column bit 0).
      EXPECT_EQ(row_base + 8 * ((index >> 1) & 1), row);
      EXPECT_EQ(col_base + 8 * (index >> 2) + (index & 1), col);
      sets.insert({row_base, col_base});
      numbers.insert({row_base, col_base, index});
    }
  EXPECT_EQ(sets.size(), 32u);      // 512 elements / 16 per draw
  EXPECT_EQ(numbers.size(), 512u);  // no element shares a number
}

// keep_mask (the kernels' and the CPU helper's) agrees with keeps (the definition), for
// every threshold including 0 (drop all) and 256 (keep all).
TEST(DropoutRule, KeepMaskMatchesKeeps) {
  for (std::uint32_t threshold = 0; threshold <= 256; ++threshold) {
    DropoutRule rule = DropoutRule::with_probability(0.5, 0xfeedULL + threshold, threshold);
    rule.keep_threshold = threshold;
    for (std::int64_t row_base : {0, 16, 7}) {
      const philox::Bits128 bits = rule.draw(5, row_base, 32 * threshold + 2 * (threshold & 3));
      const std::uint32_t mask = rule.keep_mask(bits);
      EXPECT_EQ(mask >> 16, 0u);
      for (int i = 0; i < 16; ++i) EXPECT_EQ(((mask >> i) & 1u) != 0, rule.keeps(bits, i)) << threshold << " " << i;
    }
  }
}

// kept_sign_bytes (the sm90 forward's byte-wise compare) agrees with keeps, for every
// threshold of an enabled rule (0 = drop all .. 255) and every byte value in every byte.
TEST(DropoutRule, KeptSignBytesMatchKeeps) {
  for (std::uint32_t threshold = 0; threshold < DropoutRule::kKeepAll; ++threshold) {
    DropoutRule rule = DropoutRule::with_probability(0.5, 1, 2);
    rule.keep_threshold = threshold;
    for (std::uint32_t x = 0; x < 256; ++x) {
      // Each byte position sees every value once over x, next to varied neighbours.
      const std::uint32_t word = x | ((x + 85) & 0xffu) << 8 | ((x + 170) & 0xffu) << 16 | (255 - x) << 24;
      const philox::Bits128 bits{{word, ~word, word ^ 0x80808080u, word * 2654435761u}};
      for (int w = 0; w < 4; ++w) {
        const std::uint32_t flags = rule.kept_sign_bytes(bits.word[w]);
        for (int i = 0; i < 4; ++i)
          ASSERT_EQ(((flags >> (8 * i + 7)) & 1u) != 0, rule.keeps(bits, 4 * w + i))
              << "threshold " << threshold << " word " << bits.word[w] << " byte " << i;
      }
    }
  }
}

TEST(DropoutRule, ThresholdAndScale) {
  const DropoutRule off = DropoutRule::with_probability(0.0, 1, 2);
  EXPECT_FALSE(off.enabled());
  const DropoutRule rule = DropoutRule::with_probability(0.1, 1, 2);
  EXPECT_TRUE(rule.enabled());
  EXPECT_EQ(rule.keep_threshold, 230u);  // round(0.9 * 256)
  EXPECT_EQ(DropoutRule::with_probability(0.5, 1, 2).keep_threshold, 128u);
  EXPECT_EQ(DropoutRule::with_probability(0.001, 1, 2).keep_threshold, 256u);  // rounds to keep-all
  EXPECT_FALSE(DropoutRule::with_probability(0.001, 1, 2).enabled());
  EXPECT_EQ(DropoutRule::with_probability(0.001, 1, 2).inverse_keep, 1.0f);  // off: no scale on any backend
  EXPECT_EQ(DropoutRule::with_probability(0.999, 1, 2).keep_threshold, 0u);
  EXPECT_FLOAT_EQ(rule.inverse_keep, static_cast<float>(1.0 / 0.9));
}

// The kept fraction over 2^20 elements lies within 6 standard deviations of the keep
// rate threshold / 256 (1 - p rounded to a multiple of 1/256),
// for each p; different offsets and heads give different masks.
TEST(DropoutRule, KeepRateIsBinomial) {
  for (double p : {0.1, 0.5, 0.9, 0.17}) {
    const DropoutRule rule = DropoutRule::with_probability(p, 0x1234567890abcdefULL, 77);
    std::int64_t kept = 0, total = 0;
    for (std::int64_t row = 0; row < 1024; ++row)
      for (std::int64_t col = 0; col < 1024; ++col, ++total) kept += rule.keep(3, row, col);
    const double rate = rule.keep_threshold / 256.0;
    const double expected = rate * static_cast<double>(total);
    const double sigma = std::sqrt(static_cast<double>(total) * rate * (1.0 - rate));
    EXPECT_NEAR(static_cast<double>(kept), expected, 6.0 * sigma) << "p = " << p;
  }
  const DropoutRule a = DropoutRule::with_probability(0.5, 9, 0), b = DropoutRule::with_probability(0.5, 9, 1);
  int same_offset = 0, same_head = 0;
  for (std::int64_t col = 0; col < 4096; ++col) {
    same_offset += a.keep(0, 5, col) == b.keep(0, 5, col);
    same_head += a.keep(0, 5, col) == a.keep(1, 5, col);
  }
  EXPECT_NEAR(same_offset, 2048, 6 * 32);  // independent masks agree half the time
  EXPECT_NEAR(same_head, 2048, 6 * 32);
}

// The kernels' lane arithmetic (src/cuda/common/dropout_fragment.hpp), emulated for
// all 32 lanes of a warp: every element of the fragment gets DropoutRule::keep's decision.
// Plain layout: lane L holds element 4·j + 2·half + e at row row0 + 8·half (row0 =
// block row + L/4), column col0 + 8·j + 2·(L % 4) + e; col0 any multiple of 16.
template <int kNTiles>
void check_plain_layout(const DropoutRule& rule) {
  for (std::int64_t block_row : {0, 16, 48, 4080})
    for (std::int64_t col0 : {0, 16, 32, 48, 80, 112, 4112}) {
      for (int lane = 0; lane < 32; ++lane) {
        const std::int64_t row0 = block_row + lane / 4;
        std::uint32_t keep[(kNTiles + 7) / 8];
        cuda::fragment::dropout_keep_words<kNTiles>(rule, 7, row0, col0, lane % 4, keep);
        for (int i = 0; i < 4 * kNTiles; ++i) {
          const int j = i / 4, half = (i >> 1) & 1, e = i & 1;
          const std::int64_t row = row0 + 8 * half, col = col0 + 8 * j + 2 * (lane % 4) + e;
          ASSERT_EQ(((keep[i / 32] >> (i % 32)) & 1u) != 0, rule.keep(7, row, col))
              << "kNTiles " << kNTiles << " col0 " << col0 << " lane " << lane << " element " << i;
        }
      }
    }
}

// The sign-byte form of the same layout (dropout_keep_sign_bytes, one word per n8 tile;
// pack_sign_bytes, four tiles per word) and the pair masks built from it
// (kept_pair_mask, kept_packed_pair_mask: the packed pair of elements 4·j + 2·half and
// + 1, low half first).
template <int kNTiles, bool kAligned>
void check_plain_layout_sign_bytes(const DropoutRule& rule) {
  for (std::int64_t block_row : {0, 16, 48, 4080})
    for (std::int64_t col0 : {0, 16, 32, 48, 80, 112, 4112, 4128}) {
      if (kAligned && col0 % 32 != 0) continue;
      for (int lane = 0; lane < 32; ++lane) {
        const std::int64_t row0 = block_row + lane / 4;
        std::uint32_t flags[kNTiles];
        cuda::fragment::dropout_keep_sign_bytes<kNTiles, kAligned>(rule, 7, row0, col0, lane % 4, flags);
        std::uint32_t packed[(kNTiles + 3) / 4];
        cuda::fragment::pack_sign_bytes<kNTiles>(flags, packed);
        for (int j = 0; j < kNTiles; ++j) {
          const std::uint32_t pair_masks[2] = {cuda::fragment::kept_pair_mask<0>(flags[j]),
                                               cuda::fragment::kept_pair_mask<1>(flags[j])};
          const std::uint32_t packed_pair_masks[2] = {
              cuda::fragment::kept_packed_pair_mask<0>(packed[j / 4], j % 4),
              cuda::fragment::kept_packed_pair_mask<1>(packed[j / 4], j % 4)};
          for (int half = 0; half < 2; ++half)
            for (int e = 0; e < 2; ++e) {
              const std::int64_t row = row0 + 8 * half, col = col0 + 8 * j + 2 * (lane % 4) + e;
              const bool kept = rule.keep(7, row, col);
              ASSERT_EQ(((flags[j] >> (8 * (2 * half + e) + 7)) & 1u) != 0, kept)
                  << "kNTiles " << kNTiles << " col0 " << col0 << " lane " << lane << " tile " << j;
              ASSERT_EQ((pair_masks[half] >> (16 * e)) & 0xffffu, kept ? 0xffffu : 0u);
              ASSERT_EQ((packed_pair_masks[half] >> (16 * e)) & 0xffffu, kept ? 0xffffu : 0u)
                  << "packed: kNTiles " << kNTiles << " col0 " << col0 << " lane " << lane << " tile " << j;
            }
        }
      }
    }
}

TEST(DropoutFragment, PlainLayoutSignBytesMatchKeep) {
  const DropoutRule rule = DropoutRule::with_probability(0.5, 0x0123456789abcdefULL, 0x5555000000001111ULL);
  check_plain_layout_sign_bytes<2, false>(rule);
  check_plain_layout_sign_bytes<6, false>(rule);
  check_plain_layout_sign_bytes<8, true>(rule);
  check_plain_layout_sign_bytes<10, false>(rule);  // Hopper d256: block_n 80
  check_plain_layout_sign_bytes<16, true>(rule);   // Hopper d64/d128: block_n 128
  check_plain_layout_sign_bytes<16, false>(rule);
  const DropoutRule sparse = DropoutRule::with_probability(0.9, 99, 1ULL << 40);
  check_plain_layout_sign_bytes<16, true>(sparse);
}

TEST(DropoutFragment, PlainLayoutMatchesKeep) {
  const DropoutRule rule = DropoutRule::with_probability(0.5, 0x0123456789abcdefULL, 0x5555000000001111ULL);
  check_plain_layout<2>(rule);
  check_plain_layout<4>(rule);
  check_plain_layout<6>(rule);
  check_plain_layout<8>(rule);
  check_plain_layout<10>(rule);  // Hopper d256: block_n 80
  check_plain_layout<16>(rule);
}

// Transposed layout (the sm90 backward's Sᵀ): lane L holds element 4·j + 2·half + e at
// key key_row0 + 8·half (key_row0 = 16-key block + L/4), query query_col0 + 8·j +
// 2·(L % 4) + e; each lane's word = its `mine` | lane (L ^ 4)'s `partners` (the shuffle).
template <int kNTiles>
void check_transposed_layout(const DropoutRule& rule) {
  for (std::int64_t key_block : {0, 16, 32, 48, 112, 1040, 1056})
    for (std::int64_t query_col0 : {0, 16, 64, 144, 4096}) {
      cuda::fragment::TransposedKeepHalves halves[32];
      for (int lane = 0; lane < 32; ++lane)
        halves[lane] = cuda::fragment::dropout_keep_halves_transposed<kNTiles>(rule, 3, key_block + lane / 4, query_col0,
                                                                               lane % 4);
      for (int lane = 0; lane < 32; ++lane) {
        const std::uint32_t keep = halves[lane].mine | halves[lane ^ 4].partners;
        for (int i = 0; i < 4 * kNTiles; ++i) {
          const int j = i / 4, half = (i >> 1) & 1, e = i & 1;
          const std::int64_t key = key_block + lane / 4 + 8 * half, query = query_col0 + 8 * j + 2 * (lane % 4) + e;
          ASSERT_EQ(((keep >> i) & 1u) != 0, rule.keep(3, query, key))
              << "kNTiles " << kNTiles << " key block " << key_block << " query_col0 " << query_col0 << " lane " << lane
              << " element " << i;
        }
      }
    }
}

TEST(DropoutFragment, TransposedLayoutMatchesKeep) {
  const DropoutRule rule = DropoutRule::with_probability(0.5, 0xfedcba9876543210ULL, 42);
  check_transposed_layout<2>(rule);
  check_transposed_layout<4>(rule);
  check_transposed_layout<8>(rule);
  const DropoutRule sparse = DropoutRule::with_probability(0.9, 99, 1ULL << 40);
  check_transposed_layout<8>(sparse);
  check_plain_layout<8>(sparse);
}

TEST(ScoreRule, PlainScaleSoftcapAndAlibi) {
  ScoreRule plain;
  plain.scale_log2 = 0.5f;
  EXPECT_TRUE(plain.is_positive_scale());
  EXPECT_FLOAT_EQ(plain.log2_score(3.0f, 10, 2), 1.5f);
  EXPECT_FLOAT_EQ(plain.gradient_factor(3.0f), 1.0f);

  ScoreRule rule;
  const float scale = 0.25f, cap = 2.0f, slope = 0.125f, log2e = 1.44269504f;
  rule.scale_log2 = scale * log2e;
  rule.softcap_input_scale = scale / cap;
  rule.softcap_log2 = cap * log2e;
  rule.alibi_slope_log2 = slope * log2e;
  rule.diagonal = 5;  // seqlen_k - seqlen_q
  EXPECT_FALSE(rule.is_positive_scale());
  const float dot = 3.0f;
  // s = cap * tanh(scale * dot / cap) - slope * |row + 5 - col|, in log2 units.
  for (std::int64_t col : {0, 7, 15, 30}) {
    const double expected = (cap * std::tanh(scale * dot / cap) - slope * std::fabs(4.0 + 5.0 - static_cast<double>(col))) * log2e;
    EXPECT_NEAR(rule.log2_score(dot, 4, col), expected, 1e-5) << col;
  }
  const double t = std::tanh(scale * dot / cap);
  EXPECT_NEAR(rule.gradient_factor(dot), 1.0 - t * t, 1e-6);
}

// ALiBi's affine form: on blocks on one side of the diagonal, slope x + row offset (and
// the bias linear in the distance) is the per-element score, to float rounding; the
// side bounds put a block on a side exactly when every allowed element of it is there.
TEST(ScoreRule, AffineAlibiEqualsThePerElementScore) {
  ScoreRule rule;
  rule.scale_log2 = 0.125f * 1.44269504f;
  rule.alibi_slope_log2 = 0.0625f * 1.44269504f;
  rule.diagonal = 37;
  ASSERT_TRUE(rule.has_affine_bias());
  const float dot_scale = rule.affine_dot_scale();
  const std::int64_t col0 = 96;
  for (DiagonalSide side : {DiagonalSide::left, DiagonalSide::right}) {
    // Rows whose diagonal column lies right of the block (left side) or left of it.
    const std::int64_t row_first = side == DiagonalSide::left ? 200 : 0;
    for (std::int64_t row = row_first; row < row_first + 16; ++row) {
      const float row_offset = rule.affine_row_offset(side, static_cast<float>(row + rule.diagonal - col0));
      for (std::int64_t col = col0; col < col0 + 128; col += 5) {
        ASSERT_EQ(side == DiagonalSide::left ? row + rule.diagonal >= col : row + rule.diagonal <= col, true);
        for (float dot : {-7.5f, 0.0f, 3.25f}) {
          const float x = ScoreRule::affine_x(dot, dot_scale, side, static_cast<float>(col - col0));
          const float expected = rule.log2_score(dot, row, col);
          EXPECT_NEAR(rule.affine_log2_score(x, row_offset), expected, 1e-5 * (1.0 + std::fabs(expected)))
              << row << " " << col << " " << dot;
          const float linear = dot * rule.scale_log2 + rule.bias_on_side(side, static_cast<float>(row + rule.diagonal - col));
          EXPECT_NEAR(linear, expected, 1e-5 * (1.0 + std::fabs(expected)));
        }
      }
    }
  }
  // Off where the form does not hold or would overflow.
  ScoreRule capped = rule;
  capped.softcap_input_scale = 0.1f, capped.softcap_log2 = 2.0f;
  EXPECT_FALSE(capped.has_affine_bias());
  ScoreRule negative = rule;
  negative.alibi_slope_log2 = -0.1f;
  EXPECT_FALSE(negative.has_affine_bias());
  ScoreRule tiny = rule;
  tiny.alibi_slope_log2 = rule.scale_log2 * 0x1p-40f;
  EXPECT_FALSE(tiny.has_affine_bias());
}

// side_bounds (key blocks moving) and row_side_bounds (query blocks moving) against the
// sign of every allowed element's distance, for masks with and without windows.
TEST(ScoreRule, SideBoundsMatchTheElements) {
  const std::int64_t seqlen_q = 150, seqlen_k = 190, kBlock = 32, kRows = 16;
  for (auto [left, right] : {std::pair<std::int64_t, std::int64_t>{-1, -1}, {-1, 0}, {0, -1}, {20, 0}, {0, 9}, {5, 5}}) {
    MaskRule mask{seqlen_q, seqlen_k, left, right};
    ScoreRule rule;
    rule.scale_log2 = 1.0f, rule.alibi_slope_log2 = 1.0f, rule.diagonal = seqlen_k - seqlen_q;
    // The side of the allowed elements of rows [r0, r1) x columns [c0, c1), from scratch.
    auto actual_side = [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
      bool any_left = false, any_right = false;
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t c = c0; c < c1; ++c) {
          if (!mask.allowed(r, c)) continue;
          any_left |= r + rule.diagonal - c > 0;
          any_right |= r + rule.diagonal - c < 0;
        }
      return std::pair{any_left, any_right};
    };
    for (std::int64_t r0 = 0; r0 < seqlen_q; r0 += kRows) {
      const ScoreRule::SideBounds bounds = rule.side_bounds(r0, r0 + kRows - 1, kBlock, mask);
      for (std::int64_t c0 = 0; c0 < seqlen_k + kBlock; c0 += 8) {
        const auto [any_left, any_right] = actual_side(r0, r0 + kRows, c0, c0 + kBlock);
        const DiagonalSide side = bounds.side(c0);
        if (side == DiagonalSide::left) EXPECT_FALSE(any_right) << r0 << " " << c0;
        if (side == DiagonalSide::right) EXPECT_FALSE(any_left) << r0 << " " << c0;
      }
    }
    for (std::int64_t c0 = 0; c0 < seqlen_k; c0 += kRows) {
      const ScoreRule::RowSideBounds bounds = rule.row_side_bounds(c0, c0 + kRows - 1, kBlock, mask);
      for (std::int64_t r0 = 0; r0 < seqlen_q + kBlock; r0 += 8) {
        const auto [any_left, any_right] = actual_side(r0, r0 + kBlock, c0, c0 + kRows);
        const DiagonalSide side = bounds.side(r0);
        if (side == DiagonalSide::left) EXPECT_FALSE(any_right) << c0 << " " << r0;
        if (side == DiagonalSide::right) EXPECT_FALSE(any_left) << c0 << " " << r0;
      }
    }
    // Causal: a block across the diagonal is on the left (its right part is masked);
    // window_left 0: on the right. Rows 0..15 have diagonal columns 40..55.
    if (right == 0) EXPECT_EQ(rule.side_bounds(0, kRows - 1, kBlock, mask).side(32), DiagonalSide::left);
    if (left == 0 && right != 0) {
      EXPECT_EQ(rule.side_bounds(0, kRows - 1, kBlock, mask).side(32), DiagonalSide::right);
      EXPECT_EQ(rule.row_side_bounds(40, 55, kBlock, mask).side(0), DiagonalSide::right);
    }
  }
  // Unmasked: blocks far enough on either side are classified, not only straddling.
  MaskRule unmasked{100, 100, -1, -1};
  ScoreRule rule;
  rule.alibi_slope_log2 = 1.0f;
  const ScoreRule::SideBounds bounds = rule.side_bounds(64, 79, 32, unmasked);
  EXPECT_EQ(bounds.side(0), DiagonalSide::left);    // columns 0..31 <= 64
  EXPECT_EQ(bounds.side(33), DiagonalSide::left);   // 33..64
  EXPECT_EQ(bounds.side(34), DiagonalSide::straddles);
  EXPECT_EQ(bounds.side(79), DiagonalSide::right);  // 79.. >= row 79's diagonal
  EXPECT_EQ(bounds.side(78), DiagonalSide::straddles);
}

}  // namespace
}  // namespace flashattn
