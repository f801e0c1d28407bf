// src/cuda/decode/tma_config.hpp — tile geometry of the sm_90 TMA decode kernel
// (kernel_tma.cuh), host-compilable so tests/cuda/test_kvcache.cpp checks it without a
// GPU: the shared-memory budget, the 128-byte swizzle addressing of the K/V tiles, and
// the keys per TMA box of a paged cache.
#pragma once

#include <cstdint>

#include "flashattn/config.hpp"

namespace flashattn::cuda::decode {

// Tile geometry (performance-only: results do not depend on it).
template <int kHeadDim_>
struct TmaDecodeConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kRows = 16;  // packed query rows per CTA: one mma M tile
  static constexpr int kConsumerWarps = 4;
  static constexpr int kWarps = kConsumerWarps + 1;  // + the producer warp
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kConsumerThreads = kConsumerWarps * 32;
  static constexpr int kKeysPerWarp = 16;
  static constexpr int kTileN = kConsumerWarps * kKeysPerWarp;  // 64
  static constexpr int kPanelColumns = 64;                      // 128 bytes: the swizzle span
  static constexpr int kPanels = kHeadDim / kPanelColumns;
  static constexpr int kPanelBytes = kTileN * kPanelColumns * 2;
  static constexpr int kTileBytes = kPanels * kPanelBytes;
  static constexpr int kStageBytes = 2 * kTileBytes;  // K and V
  // As many stages as keep 2 CTAs per SM (<= ~113 KB each) for d <= 128, so the next
  // step's CTAs can be resident early (PDL); d = 256 runs one CTA per SM.
  static constexpr int kStages = kHeadDim <= 64 ? 6 : 3;
  static constexpr int kMinBlocksPerSm = kHeadDim <= 128 ? 2 : 1;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kQRowElements = kHeadDim + 8;  // padded rows: 8 rows in 8 bank groups
  static constexpr int kQBytes = kRows * kQRowElements * 2;
  static constexpr int kPipelineBytes = kRingBytes + kQBytes;
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr int kDTiles = kHeadDim / 8;
  // q's mma fragments held in registers across the tiles at d64 (16 registers); at d128
  // the 32 they take spill within the 168 registers two CTAs per SM leave (ptxas, sm_90a).
  static constexpr bool kQInRegisters = kHeadDim <= 64;
  // Merge area (reuses the pipeline): per warp and row m, l, then o (kRows, kHeadDim),
  // per row the LSE, the CTA's normalised rows.
  static constexpr int kMergeBytes = (kConsumerWarps * kRows * (2 + kHeadDim) + kRows + kRows * kHeadDim) * 4;
  // The barriers live past both, so the merge never overwrites a live mbarrier.
  static constexpr int kBarrierOffset = ((kPipelineBytes > kMergeBytes ? kPipelineBytes : kMergeBytes) + 15) / 16 * 16;
  static constexpr int kAlignment = 1024;  // the 128-byte swizzle's atom: TMA destinations
  static constexpr int kSharedBytes = kBarrierOffset + 2 * kStages * 8 + kAlignment;
  static_assert(kHeadDim % kPanelColumns == 0, "whole 64-column panels");
  static_assert(kDTiles % 2 == 0, "ldmatrix x4 covers pairs of tiles");
  static_assert(kMinBlocksPerSm == 1 || kSharedBytes <= 113 * 1024, "two CTAs per SM");
  static_assert(kSharedBytes <= 227 * 1024, "shared memory per CTA");

  // Element offset of logical 16-byte chunk `chunk` of key row `row` in a K/V tile: panel
  // chunk / 8, its 128-byte row, chunk ^ (row % 8) inside it (the TMA's 128-byte swizzle).
  FLASHATTN_HOST_DEVICE static constexpr int tile_offset(int row, int chunk) {
    return (chunk / 8) * (kTileN * kPanelColumns) + row * kPanelColumns + ((chunk % 8) ^ (row % 8)) * 8;
  }
  FLASHATTN_HOST_DEVICE static constexpr int q_offset(int row, int chunk) { return row * kQRowElements + chunk * 8; }
};

// Keys per TMA box: 64 (one per panel of a tile) for a contiguous cache (page_size 0);
// for a paged one gcd(page_size, 64) — page_size is a multiple of 16 (validate_kvcache) —
// so boxes tile both a 64-key tile and a page, and a box starting at a multiple of it
// never crosses a page.
constexpr int tma_box_rows(std::int64_t page_size) {
  if (page_size == 0 || page_size % 64 == 0) return 64;
  return page_size % 32 == 0 ? 32 : 16;
}

}  // namespace flashattn::cuda::decode
