// src/cuda/hopper/tile_order.hpp — which (query tile, head and batch) a persistent Hopper
// forward CTA runs for the running tile index it takes (kernel.cuh's decode_tile).
//
// flat (section_heads == 0): each (batch, head)'s query tiles in turn, its last — under a
//   causal mask the heaviest — first. The order of the static round-robin and of the
//   one-CTA-per-tile grids, and what the dynamic scheduler measured on 2026-11-27.
// L2 sections (section_heads > 0): heads x batches are cut into sections of
//   section_heads, chosen on the host so that a section's K and V fit in L2; inside a
//   section the query tile varies slowest, heaviest first across all its heads: the
//   longest-processing-time-first order that FA3's dynamic scheduler also uses, while
//   the tiles in flight still share the section's K/V in L2. The dynamic scheduler's
//   default (FLASHATTN_CUDA_HOPPER_TILE_ORDER=flat turns it off, launch.hpp).
// Host and device code; no CUDA headers.
#pragma once

#include <cstdint>

#include "flashattn/config.hpp"

namespace flashattn::cuda::hopper {

struct TileOrder {
  std::int32_t num_m_blocks = 0;        // query tiles per (batch, head)
  std::int32_t num_heads_batches = 0;   // heads_q * batch
  std::int32_t section_heads = 0;       // 0: flat

  struct Coordinates {
    std::int32_t m_block;      // query tile
    std::int32_t head_batch;   // batch * heads_q + head
  };

  // A bijection of [0, num_m_blocks * num_heads_batches) onto the tiles.
  FLASHATTN_HOST_DEVICE Coordinates at(std::int32_t linear) const {
    if (section_heads <= 0)
      return {num_m_blocks - 1 - linear % num_m_blocks, linear / num_m_blocks};
    const std::int32_t section_tiles = section_heads * num_m_blocks;
    const std::int32_t section = linear / section_tiles, in_section = linear % section_tiles;
    const std::int32_t first_head = section * section_heads;
    const std::int32_t rest = num_heads_batches - first_head;
    const std::int32_t heads = rest < section_heads ? rest : section_heads;  // the last section may be short
    return {num_m_blocks - 1 - in_section / heads, first_head + in_section % heads};
  }
};

// The section size for K/V heads of kv_head_bytes (K and V of one head, all keys) and
// query heads per K/V head: the largest power of two of K/V heads within l2_budget_bytes
// (at least one), times group_size so a section holds whole groups.
constexpr std::int32_t l2_section_heads(std::int64_t kv_head_bytes, std::int32_t group_size,
                                        std::int64_t l2_budget_bytes = std::int64_t{32} << 20) {
  std::int64_t kv_heads = 1;
  while (kv_head_bytes > 0 && kv_heads * 2 * kv_head_bytes <= l2_budget_bytes && kv_heads < (1 << 20)) kv_heads *= 2;
  return static_cast<std::int32_t>(kv_heads) * (group_size > 0 ? group_size : 1);
}

}  // namespace flashattn::cuda::hopper
