// src/cuda/common/dropout_fragment.hpp — which Philox draws (flashattn/dropout.hpp) a
// lane makes for its accumulator fragment, and where each decision lands: the
// per-lane arithmetic of fragment.cuh's dropout hooks, host-callable (the lane's quad
// L % 4 is a parameter and the one warp exchange is left to the caller) so that
// tests/core emulates all 32 lanes against DropoutRule::keep.
//
// A draw covers rows {r, r + 8} × columns {c + 8t, c + 8t + 1 : t < 4} (a 16 × 32 block,
// c with bits 0, 3, 4 clear), its number 4·t + 2·(row bit 3) + (column bit 0):
// DropoutRule::keep_mask's bit 4·t + 2·half + e is exactly the plain fragment's element
// 4·t + 2·half + e of the 32-column block.
#pragma once

#include <cstdint>

#include "flashattn/config.hpp"
#include "flashattn/dropout.hpp"

namespace flashattn::cuda::fragment {

// Keep bits of a 16 × 8·kNTiles block in the plain layout (lane L: element 4·j + 2·half + e
// at row row0 + 8·half, column col0 + 8·j + 2·(L % 4) + e; row0 = block row + L/4):
// bit i % 32 of keep[i / 32] = element i. col0 is a multiple of 16, not necessarily of
// 32 (Hopper d256's block_n 80, split warp columns): the draws are those of the
// 32-column blocks the block touches, col_base = the block's first column with bits
// 0, 3, 4 cleared + 2·(L % 4); a draw straddling the block's edge is made once and only
// its tiles inside are used. kNTiles / 4 + 1 draws at most (the last one only where
// needed: col0 ≡ 16 mod 32 or kNTiles ≡ 2 mod 4). kAligned: the caller guarantees col0
// is a multiple of 32 (a block_n multiple of 32), which drops the unaligned code.
template <int kNTiles, bool kAligned = false>
FLASHATTN_HOST_DEVICE void dropout_keep_words(const DropoutRule& rule, std::uint32_t batch_head,
                                                     std::int64_t row0, std::int64_t col0, int quad,
                                                     std::uint32_t (&keep)[(kNTiles + 7) / 8]) {
  static_assert(kNTiles % 2 == 0, "blocks of 16-column halves of draws");
  constexpr int kWords = (kNTiles + 7) / 8;
  constexpr int kDraws = kNTiles / 4 + 1;
  constexpr int kMasks = 2 * kWords + 1;  // >= kDraws; the rest stay 0
  const bool odd = !kAligned && ((col0 >> 4) & 1) != 0;  // col0 ≡ 16 (mod 32): the first draw's upper half
  const std::int64_t col_base = (col0 & ~std::int64_t{31}) + 2 * quad;
  // Bit string: bit 16·d + i = number i of draw d (the 32-column block col_base + 32·d);
  // element b of the block is its bit b + 8·odd.
  std::uint32_t mask[kMasks];
FLASHATTN_UNROLL
  for (int d = 0; d < kMasks; ++d) mask[d] = 0;
FLASHATTN_UNROLL
  for (int d = 0; d < kDraws; ++d)
    if (d < kDraws - 1 || kNTiles % 4 == 2 || odd) mask[d] = rule.keep_mask(rule.draw(batch_head, row0, col_base + 32 * d));
FLASHATTN_UNROLL
  for (int w = 0; w < kWords; ++w) {
    const std::uint32_t aligned = mask[2 * w] | (mask[2 * w + 1] << 16);
    const std::uint32_t shifted = (mask[2 * w] >> 8) | (mask[2 * w + 1] << 8) | (mask[2 * w + 2] << 24);
    keep[w] = odd ? shifted : aligned;
  }
}

// The same decisions as sign bytes, one word per n8 tile, for kernels that zero the
// dropped entries of P after packing it to 16-bit pairs (kept_pair_mask): bit 7 of byte
// 2·half + e of flags[j] is set iff element 4·j + 2·half + e is kept (the plain layout
// above; the other bits are garbage). Word t of a draw is n8 tile t of its 32-column
// block with its bytes in the element order (DropoutRule::draw), so flags[j] is
// DropoutRule::kept_sign_bytes of one draw word: three integer operations per four
// decisions and no bit gathering (keep_mask's ~40 operations per draw). col0 ≡ 16 mod
// 32 (unaligned blocks): tile j is word j + 2 of the draws, one select per tile.
// Requires rule.enabled().
template <int kNTiles, bool kAligned = false>
FLASHATTN_HOST_DEVICE void dropout_keep_sign_bytes(const DropoutRule& rule, std::uint32_t batch_head,
                                                   std::int64_t row0, std::int64_t col0, int quad,
                                                   std::uint32_t (&flags)[kNTiles]) {
  static_assert(kNTiles % 2 == 0, "blocks of 16-column halves of draws");
  constexpr int kDraws = kAligned ? (kNTiles + 3) / 4 : kNTiles / 4 + 1;
  const bool odd = !kAligned && ((col0 >> 4) & 1) != 0;  // col0 ≡ 16 (mod 32): the first draw's upper half
  const std::int64_t col_base = (col0 & ~std::int64_t{31}) + 2 * quad;
  std::uint32_t words[4 * kDraws];  // word 4·d + t: n8 tile t of the 32-column block col_base + 32·d
FLASHATTN_UNROLL
  for (int d = 0; d < kDraws; ++d) {
    const bool is_needed = kAligned || d < kDraws - 1 || kNTiles % 4 == 2 || odd;
    const philox::Bits128 bits = is_needed ? rule.draw(batch_head, row0, col_base + 32 * d) : philox::Bits128{};
FLASHATTN_UNROLL
    for (int t = 0; t < 4; ++t) words[4 * d + t] = rule.kept_sign_bytes(bits.word[t]);
  }
FLASHATTN_UNROLL
  for (int j = 0; j < kNTiles; ++j) flags[j] = kAligned ? words[j] : odd ? words[j + 2] : words[j];
}

// The 16-bit pair `half` (elements 4·j + 2·half and 4·j + 2·half + 1, i.e. bytes 2·half
// and 2·half + 1) of a dropout_keep_sign_bytes word as an AND mask for the packed pair
// (low half: element e = 0): 0xffff where the element is kept, 0 where dropped. One
// byte permute with sign replication (PTX ISA §9.7.9.7 prmt: selector bit 3 of each
// byte replicates the selected byte's bit 7).
template <int kHalf>
FLASHATTN_HOST_DEVICE std::uint32_t kept_pair_mask(std::uint32_t flags) {
  static_assert(kHalf == 0 || kHalf == 1, "a word holds two pairs");
#if defined(__CUDA_ARCH__)
  std::uint32_t mask;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(mask) : "r"(flags), "n"(kHalf == 0 ? 0x9988 : 0xbbaa));
  return mask;
#else
  const std::uint32_t low = (flags >> (16 * kHalf + 7)) & 1u, high = (flags >> (16 * kHalf + 15)) & 1u;
  return (low ? 0x0000ffffu : 0u) | (high ? 0xffff0000u : 0u);
#endif
}

// kept_pair_mask of tile 4·q + tile from pack_sign_bytes's packed[q] (tile < 4; a
// constant once unrolled: one shift, none for tile 0).
template <int kHalf>
FLASHATTN_HOST_DEVICE std::uint32_t kept_packed_pair_mask(std::uint32_t packed, int tile) {
  return kept_pair_mask<kHalf>(packed << tile);
}

// Four tiles' sign bytes in one word, for kernels short of registers between the draws
// and the packing of P: bit 7 − t of byte i of packed[q] is bit 7 of byte i of flags[4·q
// + t] (the other bits are garbage). Two operations per tile after the first (a shift
// and a three-input merge); kept_packed_pair_mask undoes the shift.
template <int kNTiles>
FLASHATTN_HOST_DEVICE void pack_sign_bytes(const std::uint32_t (&flags)[kNTiles],
                                           std::uint32_t (&packed)[(kNTiles + 3) / 4]) {
FLASHATTN_UNROLL
  for (int q = 0; q < (kNTiles + 3) / 4; ++q) {
    std::uint32_t word = flags[4 * q];
FLASHATTN_UNROLL
    for (int t = 1; t < 4 && 4 * q + t < kNTiles; ++t) {
      const std::uint32_t high_bits = (0xff00u >> t) & 0xffu;  // bits 7 .. 8 − t of each byte: kept
      const std::uint32_t keep = high_bits * 0x01010101u;
      word = (word & keep) | ((flags[4 * q + t] >> t) & ~keep);
    }
    packed[q] = word;
  }
}

// The high 32 bits of a 32 × 32-bit product (one IMAD.HI).
FLASHATTN_HOST_DEVICE std::uint32_t high_word(std::uint32_t a, std::uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(a) * b) >> 32);
#endif
}

// The transposed layout (the sm90 backward's Sᵀ = K Qᵀ: rows are keys, columns queries):
// lane L holds, of n8 tile j, element 4·j + 2·half + e at key key_row0 + 8·half, query
// query_col0 + 8·j + 2·(L % 4) + e, key_row0 = a 16-key block's first key + L/4 (bit 3
// clear), query_col0 a multiple of 16; kNTiles even and <= 8 (32 bits).
//
// A draw covers queries {r, r + 8} × keys {c + 8t, c + 8t + 1}; the warp holds 16 keys, of
// which (key bit 4 = u) the tiles t = 2u, 2u + 1 of each draw, so the draw's byte
// 8u + 4·half + 2·qt + k (half = key bit 3, qt = query bit 3, k = key bit 0) is of
// query r + 8·qt, key c + 16u + 8·half + k. Of the 16-query block p the lane holds
// queries query_col0 + 16p + 2·(L % 4) + e + 8·qt × keys key_row0 + 8·half, so
//   e = 0 and e = 1 are two draws, r = query_col0 + 16p + 2·(L % 4) + e (bit 3 clear),
//   c = key_row0 with bits 0 and 4 cleared,
//   element 8p + 4·qt + 2·half + e is byte 8u + 4·half + 2·qt + (key bit 0) of draw e.
// Lane L ^ 4 holds the other key of each pair (L/4 differs in bit 0) and the same
// queries: it needs the same two draws, the other k. So each lane draws only
// e = (its key bit 0) and returns its own decisions (`mine`) and, at the same bit
// positions, its partner's (`partners`): the caller ORs mine with lane L ^ 4's
// partners (__shfl_xor_sync(…, 4)), which sit at this lane's e = 1 − key bit 0.
// One draw per 8 of the lane's elements (the other 8 numbers of each draw belong to
// the neighbouring warp's 16 keys and are not used).
struct TransposedKeepHalves {
  std::uint32_t mine = 0, partners = 0;
};

// Bit 7 of byte 2·qt + k of word `half` of the warp's two draw words → element order
// 4·qt + 2·half + k (8 bits): one multiply-high gathers the four sign bits of a word (bit
// 7 + 8·b moves by 32 − shift_b with shifts 25, 18, 13, 6: to bits 0, 1, 4, 5; no two of
// the sixteen partial products share a bit, so nothing carries; the rest lands at bits
// >= 8 and is masked off).
FLASHATTN_HOST_DEVICE std::uint32_t transposed_ordered_byte(const DropoutRule& rule, std::uint32_t word0,
                                                            std::uint32_t word1) {
  const std::uint32_t half0 = rule.kept_sign_bytes(word0);
  const std::uint32_t half1 = rule.kept_sign_bytes(word1);
  return (high_word(half0 & 0x80808080u, 0x02042040u) | high_word(half1 & 0x80808080u, 0x02042040u << 2)) & 0xffu;
}

template <int kNTiles>
FLASHATTN_HOST_DEVICE TransposedKeepHalves dropout_keep_halves_transposed(const DropoutRule& rule,
                                                                                 std::uint32_t batch_head,
                                                                                 std::int64_t key_row0,
                                                                                 std::int64_t query_col0, int quad) {
  static_assert(kNTiles % 2 == 0 && 4 * kNTiles <= 32, "a draw spans two n8 tiles; 32 bits hold 8 tiles");
  const int key_bit0 = static_cast<int>(key_row0 & 1);  // = (L/4) & 1: which draw this lane makes
  const int key_bit4 = static_cast<int>((key_row0 >> 4) & 1);
  const std::int64_t key_base = key_row0 & ~std::int64_t{17};  // bits 0, 4 cleared (bit 3 is clear)
  const std::int64_t query_base = query_col0 + 2 * quad + key_bit0;
  const std::uint32_t own_bits = key_bit0 ? 0xaau : 0x55u;
  TransposedKeepHalves halves;
FLASHATTN_UNROLL
  for (int block = 0; block < kNTiles / 2; ++block) {
    // This warp's byte 4·half + 2·qt + k is byte 2·qt + k of draw word 2·u + half: only
    // those two words are compared (DropoutRule::kept_sign_bytes, 3 operations per 4
    // decisions, where keep_mask compared all 16 and gathered them bit by bit).
    const philox::Bits128 bits = rule.draw(batch_head, query_base + 16 * block, key_base);
    const std::uint32_t ordered = transposed_ordered_byte(rule, key_bit4 ? bits.word[2] : bits.word[0],
                                                          key_bit4 ? bits.word[3] : bits.word[1]);
    const std::uint32_t own = ordered & own_bits;  // k = key bit 0, already at e = key bit 0
    const std::uint32_t other = key_bit0 ? (ordered & 0x55u) << 1 : (ordered & 0xaau) >> 1;  // k = 1 − key bit 0
    halves.mine |= own << (8 * block);
    halves.partners |= other << (8 * block);
  }
  return halves;
}

// Draw once per step (the caller's switch): the two warps whose 16 keys differ only in
// key bit 4 (warps 2i, 2i + 1 of a warpgroup) need the same draws, lane L of one the
// same as lane L of the other (r and c above do not depend on key bit 4), each warp 8
// of the 16 numbers (words 2u, 2u + 1 of draw u = its key bit 4). So warp u makes only
// the draws of the 16-query blocks with block % 2 == u, keeps its own 8 decisions of
// each (`own`: the byte order above at byte `block`, 0 in the other blocks) and hands
// the other warp its 8 (`others`: byte block / 2, i.e. bits 8·(block / 2) ..), which
// transposed_keep_halves_of places at blocks of the other parity: half the draws of
// dropout_keep_halves_transposed, the same decisions.
struct TransposedOrderedHalf {
  std::uint32_t own = 0, others = 0;
};

template <int kNTiles>
FLASHATTN_HOST_DEVICE TransposedOrderedHalf dropout_ordered_half_transposed(const DropoutRule& rule,
                                                                            std::uint32_t batch_head,
                                                                            std::int64_t key_row0,
                                                                            std::int64_t query_col0, int quad) {
  static_assert(kNTiles % 4 == 0 && 4 * kNTiles <= 32, "pairs of 16-query blocks; 32 bits hold 8 tiles");
  const int key_bit0 = static_cast<int>(key_row0 & 1);
  const int key_bit4 = static_cast<int>((key_row0 >> 4) & 1);
  const std::int64_t key_base = key_row0 & ~std::int64_t{17};
  const std::int64_t query_base = query_col0 + 2 * quad + key_bit0;
  TransposedOrderedHalf half;
FLASHATTN_UNROLL
  for (int pair = 0; pair < kNTiles / 4; ++pair) {
    const int block = 2 * pair + key_bit4;
    const philox::Bits128 bits = rule.draw(batch_head, query_base + 16 * block, key_base);
    const std::uint32_t words_u0 = transposed_ordered_byte(rule, bits.word[0], bits.word[1]);
    const std::uint32_t words_u1 = transposed_ordered_byte(rule, bits.word[2], bits.word[3]);
    half.own |= (key_bit4 ? words_u1 : words_u0) << (8 * block);
    half.others |= (key_bit4 ? words_u0 : words_u1) << (8 * pair);
  }
  return half;
}

// dropout_keep_halves_transposed's result from this lane's TransposedOrderedHalf::own and
// the other warp's lane L `others`.
template <int kNTiles>
FLASHATTN_HOST_DEVICE TransposedKeepHalves transposed_keep_halves_of(std::uint32_t own, std::uint32_t from_other,
                                                                     std::int64_t key_row0) {
  static_assert(kNTiles % 4 == 0 && 4 * kNTiles <= 32, "pairs of 16-query blocks; 32 bits hold 8 tiles");
  const int key_bit0 = static_cast<int>(key_row0 & 1);
  const int key_bit4 = static_cast<int>((key_row0 >> 4) & 1);
  std::uint32_t ordered = own;
FLASHATTN_UNROLL
  for (int pair = 0; pair < kNTiles / 4; ++pair)
    ordered |= ((from_other >> (8 * pair)) & 0xffu) << (8 * (2 * pair + 1 - key_bit4));
  TransposedKeepHalves halves;
  halves.mine = ordered & (key_bit0 ? 0xaaaaaaaau : 0x55555555u);
  halves.partners = key_bit0 ? (ordered & 0x55555555u) << 1 : (ordered & 0xaaaaaaaau) >> 1;
  return halves;
}

}  // namespace flashattn::cuda::fragment
