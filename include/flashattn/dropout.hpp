// flashattn/dropout.hpp — dropout on the attention probabilities, keyed on logical
// coordinates so that the mask is a function of (seed, offset, batch, head, row,
// column) alone: the same on the CPU and in every CUDA kernel, for any tile shape,
// thread count, split or backend (flash_attn keys its generator on lane ids, so its
// mask changes with the kernel).
//
// Semantics (flash_attn's): O = (P ∘ Z / (1 − p)) V with P the normalised softmax and
// Z ∈ {0, 1} the keep mask; the LSE is that of P (unaffected). The backward pass
// regenerates Z: dV = (P ∘ Z)ᵀ dO / (1 − p), dS = P ∘ (Z ∘ dP / (1 − p) − D).
//
// The generator is Philox-4x32 with 7 rounds (Salmon et al., SC'11: "Crush-resistant";
// flash_attn's generator uses 7 rounds too), checked against Random123's published
// known-answer vectors in tests/core. One draw gives 128 bits = eight 16-bit numbers,
// the keep decisions of eight elements of one (batch, head):
//   rows {r, r + 8} × columns {c, c + 1, c + 8, c + 9},  r with bit 3 clear, c with bits 0 and 3 clear,
// number 4·(row bit 3) + 2·(column bit 3) + (column bit 0), little-endian within the
// 32-bit words. That set is exactly what one thread holds of a 16×16 block in the
// m16n8 accumulator layout of mma.sync and wgmma, so the forward kernels need no
// exchange between lanes; the layout is defined here, not by any kernel.
// An element is kept iff its 16-bit number < keep_threshold = round((1 − p) · 65536):
// the keep probability is 1 − p to within 2^-17.
//
// Counter (x, y, z, w) = (c, r, batch · heads + head, low 32 bits of offset), key =
// (low 32 bits of seed, high 32 bits of seed ^ high 32 bits of offset). Rows and columns
// are positions within their sequence (varlen: relative to the sequence's start), so
// a packed batch and its padded form draw the same mask.
#pragma once

#include <cmath>
#include <cstdint>

#include "flashattn/config.hpp"

namespace flashattn {
namespace philox {

inline constexpr std::uint32_t kMultiplier0 = 0xD2511F53u;
inline constexpr std::uint32_t kMultiplier1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;  // the key schedule's increments
inline constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;

struct Bits128 {
  std::uint32_t word[4];
};

// Philox-4x32-R (Random123's philox4x32_R): R rounds of two 32x32->64 multiplies.
template <int kRounds>
FLASHATTN_HOST_DEVICE Bits128 philox4x32(Bits128 counter, std::uint32_t key0, std::uint32_t key1) {
FLASHATTN_UNROLL
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) {
      key0 += kWeyl0;
      key1 += kWeyl1;
    }
    const std::uint64_t product0 = static_cast<std::uint64_t>(kMultiplier0) * counter.word[0];
    const std::uint64_t product1 = static_cast<std::uint64_t>(kMultiplier1) * counter.word[2];
    const std::uint32_t hi0 = static_cast<std::uint32_t>(product0 >> 32), lo0 = static_cast<std::uint32_t>(product0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(product1 >> 32), lo1 = static_cast<std::uint32_t>(product1);
    counter = Bits128{{hi1 ^ counter.word[1] ^ key0, lo1, hi0 ^ counter.word[3] ^ key1, lo0}};
  }
  return counter;
}

}  // namespace philox

struct DropoutRule {
  static constexpr int kRounds = 7;
  static constexpr std::uint32_t kKeepAll = 65536u;

  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  std::uint32_t keep_threshold = kKeepAll;  // kKeepAll = no dropout
  float inverse_keep = 1.0f;                // 1 / (1 − p): the scale of kept entries

  // p in [0, 1): the threshold and scale of dropout probability p.
  static DropoutRule with_probability(double p, std::uint64_t seed, std::uint64_t offset) {
    DropoutRule rule;
    rule.seed = seed;
    rule.offset = offset;
    rule.keep_threshold = static_cast<std::uint32_t>(std::llround((1.0 - p) * 65536.0));
    rule.inverse_keep = static_cast<float>(1.0 / (1.0 - p));
    return rule;
  }

  FLASHATTN_HOST_DEVICE bool enabled() const { return keep_threshold < kKeepAll; }

  // The draw of the element set whose first element is (row_base, col_base)
  // (row_base with bit 3 clear, col_base with bits 0 and 3 clear) in head `batch_head`
  // (= batch · heads + head).
  FLASHATTN_HOST_DEVICE philox::Bits128 draw(std::uint32_t batch_head, std::int64_t row_base,
                                             std::int64_t col_base) const {
    const philox::Bits128 counter{{static_cast<std::uint32_t>(col_base), static_cast<std::uint32_t>(row_base),
                                   batch_head, static_cast<std::uint32_t>(offset)}};
    return philox::philox4x32<kRounds>(counter, static_cast<std::uint32_t>(seed),
                                       static_cast<std::uint32_t>(seed >> 32) ^ static_cast<std::uint32_t>(offset >> 32));
  }
  // Keep decision of number `index` (0-7, see the header) of a draw.
  FLASHATTN_HOST_DEVICE bool keeps(const philox::Bits128& bits, int index) const {
    return ((bits.word[index >> 1] >> (16 * (index & 1))) & 0xffffu) < keep_threshold;
  }
  // Both decisions of a 32-bit word (the column pair c, c + 1 of one row).
  FLASHATTN_HOST_DEVICE bool keeps_low(std::uint32_t word) const { return (word & 0xffffu) < keep_threshold; }
  FLASHATTN_HOST_DEVICE bool keeps_high(std::uint32_t word) const { return (word >> 16) < keep_threshold; }

  static FLASHATTN_HOST_DEVICE std::int64_t row_base_of(std::int64_t row) { return row & ~std::int64_t{8}; }
  static FLASHATTN_HOST_DEVICE std::int64_t col_base_of(std::int64_t col) { return col & ~std::int64_t{9}; }
  static FLASHATTN_HOST_DEVICE int index_of(std::int64_t row, std::int64_t col) {
    return static_cast<int>(4 * ((row >> 3) & 1) + 2 * ((col >> 3) & 1) + (col & 1));
  }
  // One element's decision (CPU paths and tests; kernels use draw() once per set).
  FLASHATTN_HOST_DEVICE bool keep(std::uint32_t batch_head, std::int64_t row, std::int64_t col) const {
    return keeps(draw(batch_head, row_base_of(row), col_base_of(col)), index_of(row, col));
  }
};

}  // namespace flashattn
