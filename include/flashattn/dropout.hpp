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
// known-answer vectors in tests/core. One draw gives 128 bits = sixteen 8-bit numbers
// (flash_attn's width), the keep decisions of sixteen elements of one (batch, head):
//   rows {r, r + 8} × columns {c, c + 1, c + 8, c + 9, c + 16, c + 17, c + 24, c + 25},
//   r with bit 3 clear, c with bits 0, 3 and 4 clear,
// number 4·t + 2·(row bit 3) + (column bit 0), t = column bits 3–4 (the n8 tile of the
// 32-column block), byte (number mod 4) of word (number / 4), little-endian: word t is
// n8 tile t, its four bytes in the order of the m16n8 accumulator fragment (c0 c1 c2
// c3 = (r, c), (r, c + 1), (r + 8, c), (r + 8, c + 1)). That set is exactly what one
// thread holds of a 16×32 block (four adjacent n8 tiles) in the accumulator layout of
// mma.sync and wgmma, so the forward kernels need no exchange between lanes; the
// layout is defined here, not by any kernel.
// An element is kept iff its 8-bit number < keep_threshold = round((1 − p) · 256):
// the keep rate is 1 − p rounded to a multiple of 1/256, as flash_attn's; kept entries
// are scaled by 1 / (1 − p), as flash_attn's.
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
#if defined(__CUDA_ARCH__)
    // Each 32 x 32 -> 64 product as one mul.wide.u32 (SASS: one IMAD.WIDE.U32 giving both
    // halves). The 64-bit C++ product made NVVM pad a 64-bit multiply with additions of
    // zero (~12 per draw); __umulhi + a 32-bit multiply let ptxas emit IMAD.HI + IMAD, two
    // instructions per product, in the sm90 forward's dropout kernels (~40 per 128-key block).
    std::uint32_t hi0, lo0, hi1, lo1;
    asm("{.reg .u64 t; mul.wide.u32 t, %2, %3; mov.b64 {%0, %1}, t;}"
        : "=r"(lo0), "=r"(hi0) : "r"(counter.word[0]), "n"(kMultiplier0));
    asm("{.reg .u64 t; mul.wide.u32 t, %2, %3; mov.b64 {%0, %1}, t;}"
        : "=r"(lo1), "=r"(hi1) : "r"(counter.word[2]), "n"(kMultiplier1));
#else
    const std::uint64_t product0 = static_cast<std::uint64_t>(kMultiplier0) * counter.word[0];
    const std::uint64_t product1 = static_cast<std::uint64_t>(kMultiplier1) * counter.word[2];
    const std::uint32_t hi0 = static_cast<std::uint32_t>(product0 >> 32), lo0 = static_cast<std::uint32_t>(product0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(product1 >> 32), lo1 = static_cast<std::uint32_t>(product1);
#endif
    counter = Bits128{{hi1 ^ counter.word[1] ^ key0, lo1, hi0 ^ counter.word[3] ^ key1, lo0}};
  }
  return counter;
}

}  // namespace philox

struct DropoutRule {
  static constexpr int kRounds = 7;
  static constexpr std::uint32_t kKeepAll = 256u;

  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  std::uint32_t keep_threshold = kKeepAll;  // kKeepAll = no dropout
  float inverse_keep = 1.0f;                // 1 / (1 − p): the scale of kept entries

  // p in [0, 1): the threshold and scale of dropout probability p.
  static DropoutRule with_probability(double p, std::uint64_t seed, std::uint64_t offset) {
    DropoutRule rule;
    rule.seed = seed;
    rule.offset = offset;
    const long long threshold = std::llround((1.0 - p) * 256.0);
    rule.keep_threshold = static_cast<std::uint32_t>(threshold < 0 ? 0 : threshold > 256 ? 256 : threshold);
    // A p that rounds to "keep all" (p < 1/512) is no dropout at all: no scale either.
    rule.inverse_keep = rule.enabled() ? static_cast<float>(1.0 / (1.0 - p)) : 1.0f;
    return rule;
  }

  FLASHATTN_HOST_DEVICE bool enabled() const { return keep_threshold < kKeepAll; }

  // The draw of the element set whose first element is (row_base, col_base)
  // (row_base with bit 3 clear, col_base with bits 0, 3 and 4 clear) in head
  // `batch_head` (= batch · heads + head).
  FLASHATTN_HOST_DEVICE philox::Bits128 draw(std::uint32_t batch_head, std::int64_t row_base,
                                             std::int64_t col_base) const {
    const philox::Bits128 counter{{static_cast<std::uint32_t>(col_base), static_cast<std::uint32_t>(row_base),
                                   batch_head, static_cast<std::uint32_t>(offset)}};
    return philox::philox4x32<kRounds>(counter, static_cast<std::uint32_t>(seed),
                                       static_cast<std::uint32_t>(seed >> 32) ^ static_cast<std::uint32_t>(offset >> 32));
  }
  // Keep decision of number `index` (0-15, see the header) of a draw.
  FLASHATTN_HOST_DEVICE bool keeps(const philox::Bits128& bits, int index) const {
    return ((bits.word[index >> 2] >> (8 * (index & 3))) & 0xffu) < keep_threshold;
  }
  // All sixteen decisions of a draw: bit i = number i kept. Integer-only (no byte
  // compares): a 16-bit lane holding number + (256 − threshold) has bit 8 set iff the
  // number is ≥ threshold (it lies in [0, 511], so lanes never carry into each other;
  // threshold 0 drops all, 256 keeps all).
  FLASHATTN_HOST_DEVICE std::uint32_t keep_mask(const philox::Bits128& bits) const {
    const std::uint32_t bias = (256u - keep_threshold) * 0x00010001u;
    std::uint32_t dropped = 0;  // bytes 0, 1 of word w at bits 4w, 4w + 1; bytes 2, 3 at 16 + 4w, 17 + 4w
FLASHATTN_UNROLL
    for (int w = 0; w < 4; ++w) {
      const std::uint32_t even = (bits.word[w] & 0x00ff00ffu) + bias;         // bytes 0, 2
      const std::uint32_t odd = ((bits.word[w] >> 8) & 0x00ff00ffu) + bias;  // bytes 1, 3
      dropped |= (((even >> 8) & 0x00010001u) | ((odd >> 7) & 0x00020002u)) << (4 * w);
    }
    return ~((dropped & 0x3333u) | ((dropped >> 14) & 0xccccu)) & 0xffffu;
  }
  // The four decisions of one word of a draw (numbers 4·w .. 4·w + 3 of word w) as sign
  // bits: bit 7 of byte i is set iff byte i is kept (< keep_threshold); the other bits
  // are garbage. For kernels that zero dropped entries of packed 16-bit P pairs with a
  // byte permute (sign replication) instead of testing a bit per element: three integer
  // operations per four decisions. A byte-wise unsigned x < y without borrows between
  // bytes: d = (x | 0x80) − (y & 0x7f) lies in [1, 255] per byte, its bit 7 set iff
  // x mod 128 ≥ y mod 128; then x < y iff (x's bit 7 clear and y's set) or (the bits 7
  // equal and d's clear) — one three-input logic operation on x, y, d.
  // Requires enabled(): the threshold (< 256) fits a byte.
  FLASHATTN_HOST_DEVICE std::uint32_t kept_sign_bytes(std::uint32_t word) const {
    const std::uint32_t threshold = keep_threshold * 0x01010101u;
    const std::uint32_t d = (word | 0x80808080u) - (threshold & 0x7f7f7f7fu);
    return (~word & threshold) | (~(word ^ threshold) & ~d);
  }

  static FLASHATTN_HOST_DEVICE std::int64_t row_base_of(std::int64_t row) { return row & ~std::int64_t{8}; }
  static FLASHATTN_HOST_DEVICE std::int64_t col_base_of(std::int64_t col) { return col & ~std::int64_t{25}; }
  static FLASHATTN_HOST_DEVICE int index_of(std::int64_t row, std::int64_t col) {
    return static_cast<int>(4 * ((col >> 3) & 3) + 2 * ((row >> 3) & 1) + (col & 1));
  }
  // One element's decision (CPU paths and tests; kernels use draw() once per set).
  FLASHATTN_HOST_DEVICE bool keep(std::uint32_t batch_head, std::int64_t row, std::int64_t col) const {
    return keeps(draw(batch_head, row_base_of(row), col_base_of(col)), index_of(row, col));
  }
};

}  // namespace flashattn
