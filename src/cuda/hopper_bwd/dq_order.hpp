// src/cuda/hopper_bwd/dq_order.hpp — which query blocks a key block's CTA visits, and
// the dual: which key blocks visit a query block. The deterministic Hopper backward
// orders the dQ additions of each (sequence, query head, query block) by key block
// with these (kernel.cuh); the two functions must agree exactly, or a CTA waits for a
// turn that never comes. tests/cuda/test_hopper_bwd_dq_order.cpp checks them against
// each other by brute force. Host and device code; no CUDA headers.
#pragma once

#include <cstdint>

#include "flashattn/config.hpp"
#include "flashattn/mask.hpp"
#include "src/cuda/hopper/tile_order.hpp"

namespace flashattn::cuda::hopper_bwd {

// Query blocks [begin, begin + count) of block_m rows.
struct QueryBlockRange {
  int begin;
  int count;
};

// The query blocks the CTA of keys [n0, n0 + kv_rows) walks (kv_rows >= 1): every
// block holding a row that sees one of those keys (mask.rows_of_columns). The kernel
// calls this (int arithmetic as it always had: its code must not change).
FLASHATTN_HOST_DEVICE QueryBlockRange query_blocks_of_key_block(const MaskRule& mask, std::int64_t n0,
                                                                std::int64_t kv_rows, int block_m) {
  const MaskRule::RowRange rows = mask.rows_of_columns(n0, n0 + kv_rows);
  const int begin = static_cast<int>(rows.begin / block_m);
  const int count = rows.end > rows.begin ? static_cast<int>((rows.end + block_m - 1) / block_m) - begin : 0;
  return {begin, count};
}

// Key blocks [first, first + count) of block_n keys.
struct KeyBlockRange {
  std::int64_t first;
  std::int64_t count;
};

FLASHATTN_HOST_DEVICE std::int64_t floor_div(std::int64_t a, std::int64_t b) {  // b > 0
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}
FLASHATTN_HOST_DEVICE std::int64_t ceil_div(std::int64_t a, std::int64_t b) {  // b > 0
  return -floor_div(-a, b);
}

// The key blocks n (n * block_n < seqlen_k: CTAs past the keys return at once) whose
// query_blocks_of_key_block range holds query block m_block (m_block * block_m <
// seqlen_q). They are contiguous. With offset = seqlen_k - seqlen_q, the key block n
// (keys [n0, n0 + kv_rows)) reaches the rows [lo, hi) ∩ [0, seqlen_q) where
//   lo = n0 - offset - window_right            (-inf when window_right < 0)
//   hi = n0 + kv_rows - offset + window_left   (+inf when window_left  < 0)
// (mask.hpp: col < col_end(row) and col >= col_begin(row) solved for the row), and
// hi - lo >= kv_rows >= 1. It visits block m iff that set meets [m0, u), u =
// min(m0 + block_m, seqlen_q), i.e. iff lo < u and hi > m0. lo and hi grow with n
// (n0 + kv_rows = min(n0 + block_n, seqlen_k)), so the first condition holds for a
// prefix of the key blocks, the second for a suffix: the visitors are an interval.
//   hi > m0  <=>  min(n0 + block_n, seqlen_k) > t, t = m0 + offset - window_left
//            <=>  seqlen_k > t and n >= floor(t / block_n)
//   lo < u   <=>  n block_n < u + offset + window_right  <=>  n < ceil((u + offset + window_right) / block_n)
FLASHATTN_HOST_DEVICE KeyBlockRange key_blocks_of_query_block(const MaskRule& mask, std::int64_t m_block,
                                                              int block_m, int block_n) {
  const std::int64_t key_blocks = (mask.seqlen_k + block_n - 1) / block_n;
  const std::int64_t m0 = m_block * block_m;
  if (key_blocks == 0 || m0 >= mask.seqlen_q) return {0, 0};
  const std::int64_t offset = mask.seqlen_k - mask.seqlen_q;
  std::int64_t first = 0;
  if (mask.window_left >= 0) {
    const std::int64_t t = m0 + offset - mask.window_left;
    if (mask.seqlen_k <= t) return {0, 0};
    first = floor_div(t, block_n);
    if (first < 0) first = 0;
  }
  std::int64_t end = key_blocks;
  if (mask.window_right >= 0) {
    const std::int64_t u = m0 + block_m < mask.seqlen_q ? m0 + block_m : mask.seqlen_q;
    end = ceil_div(u + offset + mask.window_right, block_n);
    if (end > key_blocks) end = key_blocks;
  }
  return {first, end > first ? end - first : 0};
}

// The key block and (kv head, sequence) = head_batch (batch * heads_kv + kv head) of CTA
// `linear` (blockIdx.x) in `order` (over num_m_blocks = the key blocks; launch.hpp).
// TileOrder puts its "m_block" num_m_blocks - 1 first (the forward's heaviest query
// tile): here that position is key block 0 (under a causal mask the most query blocks),
// or in deterministic mode the last key block, the first turn. So in both orders (flat,
// L2 sections) a deterministic CTA's higher key blocks of the same head_batch, the ones it
// waits for, have lower blockIdx.x: the deadlock argument at the top of kernel.cuh.
// tests/cuda/test_hopper_bwd_dq_order.cpp checks both properties.
struct KeyBlockOfCta {
  std::int32_t n_block;
  std::int32_t head_batch;
};
FLASHATTN_HOST_DEVICE KeyBlockOfCta key_block_of_cta(const hopper::TileOrder& order, std::int32_t linear,
                                                           bool deterministic) {
  const hopper::TileOrder::Coordinates at = order.at(linear);
  return {deterministic ? at.m_block : order.num_m_blocks - 1 - at.m_block, at.head_batch};
}

// The tiles CTA `cta` of `ctas` runs (kernel.cuh; every role walks them alike): rounds of
// `ctas` consecutive tiles of the order, the CTA taking the round's cta-th tile in even
// rounds and its (ctas - 1 - cta)-th in odd ones; indices past num_tiles (the last round)
// are skipped. Every tile once over the CTAs, increasing per CTA (the deterministic mode's
// deadlock argument, top of kernel.cuh). The reversal pairs a CTA's heavy tiles with light
// ones under causal masks: in the flat order tile t has key block t % key_blocks, and with
// the plain stride (cta, cta + ctas, ...) a CTA met few key blocks when ctas is not a
// multiple of them (1k causal at d128, 132 CTAs, 8 key blocks: two of eight, some CTAs twice
// the work of others). ctas == num_tiles (one CTA per tile): tile cta only.
// tests/cuda/test_hopper_bwd_dq_order.cpp checks both properties.
class CtaTiles {
 public:
  FLASHATTN_HOST_DEVICE CtaTiles(std::int32_t cta, std::int32_t ctas, std::int32_t num_tiles)
      : cta_(static_cast<std::uint32_t>(cta)),
        ctas_(static_cast<std::uint32_t>(ctas)),
        num_tiles_(static_cast<std::uint32_t>(num_tiles)) {}
  // The next tile into `tile`; false when the CTA is done.
  FLASHATTN_HOST_DEVICE bool next(std::int32_t& tile) {
    const std::uint32_t candidate = tile_of_round(cta_, ctas_, round_++);
    if (candidate >= num_tiles_) return false;
    tile = static_cast<std::int32_t>(candidate);
    return true;
  }
  // The walk without state (the kernel's scheduler lane: 24 registers): the CTA's tile of
  // round `round` (its round-th tile), num_tiles or more when the walk has ended before it.
  // Only the last round can be partial, so the first candidate past num_tiles ends the walk.
  // Below 2^32: num_tiles and ctas are below 2^31, round <= num_tiles / ctas + 1.
  FLASHATTN_HOST_DEVICE static std::uint32_t tile_of_round(std::uint32_t cta, std::uint32_t ctas,
                                                            std::uint32_t round) {
    return round * ctas + ((round & 1u) != 0 ? ctas - 1 - cta : cta);
  }

 private:
  std::uint32_t cta_, ctas_, num_tiles_;
  std::uint32_t round_ = 0;
};

// The tiles CTA `cta` of `ctas` runs under the dynamic persistent grid (kernel.cuh,
// FLASHATTN_CUDA_HOPPER_BWD_GRID=dynamic): tile cta first, then tile ctas + c for each value
// c that `claim` draws from the grid's counter (kernel: atomicAdd on the workspace's, zeroed
// by the preprocess), until one reaches num_tiles. Every tile once over the CTAs (the first
// ctas by blockIdx, the rest by the counter, which hands out every value once), and
// increasing per CTA, since the counter only grows. Deterministic mode (top of kernel.cuh):
// when a tile waits for tile t' < t, t' has been claimed (the counter handed out every value
// below t's), and its CTA runs it after its own lower tiles only. ctas == num_tiles: tile
// cta only, no claim. tests/cuda/test_hopper_bwd_dq_order.cpp checks both properties and
// simulates the deterministic waits under interleaved claims.
class ClaimedTiles {
 public:
  FLASHATTN_HOST_DEVICE ClaimedTiles(std::int32_t cta, std::int32_t ctas, std::int32_t num_tiles)
      : cta_(static_cast<std::uint32_t>(cta)),
        ctas_(static_cast<std::uint32_t>(ctas)),
        num_tiles_(static_cast<std::uint32_t>(num_tiles)) {}
  // The next tile into `tile`; false when the CTA is done. claim(): the counter's next value.
  template <class Claim>
  FLASHATTN_HOST_DEVICE bool next(std::int32_t& tile, Claim&& claim) {
    const std::uint32_t candidate = tile_of_take(cta_, ctas_, num_tiles_, taken_++, claim);
    if (candidate >= num_tiles_) return false;
    tile = static_cast<std::int32_t>(candidate);
    return true;
  }
  // The walk without state (the kernel's scheduler lane): the CTA's taken-th tile (taken
  // counts from 0 and stops at the first result of num_tiles or more), claiming from the
  // counter for every take but the first (none when the first tiles are all: ctas >=
  // num_tiles). 32-bit: ctas + any value the counter reaches stays below 2^32.
  template <class Claim>
  FLASHATTN_HOST_DEVICE static std::uint32_t tile_of_take(std::uint32_t cta, std::uint32_t ctas,
                                                          std::uint32_t num_tiles, int taken, Claim&& claim) {
    if (taken == 0) return cta;
    if (ctas >= num_tiles) return num_tiles;
    return ctas + static_cast<std::uint32_t>(claim());
  }

 private:
  std::uint32_t cta_, ctas_, num_tiles_;
  int taken_ = 0;
};

}  // namespace flashattn::cuda::hopper_bwd
