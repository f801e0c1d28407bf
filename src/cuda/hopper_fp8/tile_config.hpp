// src/cuda/hopper_fp8/tile_config.hpp — tile shapes of the FP8 (e4m3) Hopper forward kernel.
//
// PERFORMANCE ONLY: these numbers choose speed and shared-memory use; every entry
// computes the same attention (only the fp32 summation order inside a row may differ
// between entries, never between runs of one entry). fp8_tile_config() is the one
// selection: the tensor maps (launch.cu) and the launch (kernel.cuh) read it.
//
// CTA = 1 producer warpgroup + block_m / 64 consumer warpgroups (wgmma, 64 query rows
// each). The producer's thread 0 issues the TMA copies; all 128 producer threads
// transpose each V tile in shared memory into the K-major Vt tile the FP8 P V product
// needs (kernel.cuh).
// Shared memory, all 1-byte elements (HopperTileConfig::shared_bytes):
//   Q (block_m, d) + stages x [K (block_n, d) + V (block_n, d) + Vt (d, block_n)]
// Q, K and V rows are d bytes: one swizzle panel of d bytes (64-byte swizzle) at d64,
// 128-byte panels (128-byte swizzle) at d128 and d256. Vt rows are block_n = 128 bytes:
// one 128-byte panel.
// Host and device code; no CUDA headers.
#pragma once

#include "src/cuda/hopper/tile_config.hpp"

namespace flashattn::cuda::hopper_fp8 {

using hopper::kMaxConsumerWarpgroups;
using hopper::kMaxSharedBytes;
// Keys per tile: the Vt rows are block_n e4m3 = one 128-byte swizzle row, which the
// transpose's addressing and the P V descriptor assume.
inline constexpr int kBlockN = 128;

// The bf16 kernel's config type with 1-byte elements (hopper/tile_config.hpp: panels of
// min(d, 128) bytes, K, V and Vt per stage); the schedule is the bf16 kernel's
// intra-warpgroup overlap, one CTA per tile.
using Fp8TileConfig = hopper::HopperTileConfig;
constexpr Fp8TileConfig fp8_tile_entry(int kernel_head_dim, int block_m, int stages) {
  return Fp8TileConfig{kernel_head_dim, block_m, kBlockN, stages, /*is_intra_overlap=*/true, /*is_ping_pong=*/false,
                       /*is_persistent=*/false, /*element_bytes=*/1};
}

// First version (not tuned on the device yet; TUNING.md): block_n 128 everywhere (one
// Vt swizzle row), block_m 128 with two consumer warpgroups at d128/d256 (240
// registers: O is 128 fp32 registers per thread at d256), three at d64 as the bf16
// kernel found best; as many stages as fit (d256: 2 stages = 225 KB of 227).
inline constexpr Fp8TileConfig kFp8TileTable[] = {
    //             dim  M   stages
    fp8_tile_entry(64, 192, 3),
    fp8_tile_entry(128, 128, 3),
    fp8_tile_entry(256, 128, 2),
};

constexpr Fp8TileConfig fp8_tile_config(int kernel_head_dim) {
  for (const Fp8TileConfig& config : kFp8TileTable)
    if (config.kernel_head_dim == kernel_head_dim) return config;
  return fp8_tile_entry(0, 0, 0);
}

}  // namespace flashattn::cuda::hopper_fp8
