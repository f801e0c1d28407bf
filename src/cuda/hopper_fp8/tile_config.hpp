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
// Shared memory, all 1-byte elements:
//   Q (block_m, d) + stages x [K (block_n, d) + V (block_n, d) + Vt (d, block_n)]
// Q, K and V rows are d bytes: one swizzle panel of d bytes (64-byte swizzle) at d64,
// 128-byte panels (128-byte swizzle) at d128 and d256. Vt rows are block_n = 128 bytes:
// one 128-byte panel.
// Host and device code; no CUDA headers.
#pragma once

namespace flashattn::cuda::hopper_fp8 {

inline constexpr int kMaxConsumerWarpgroups = 3;
inline constexpr int kMaxSharedBytes = 227 * 1024;
// Keys per tile: the Vt rows are block_n e4m3 = one 128-byte swizzle row, which the
// transpose's addressing and the P V descriptor assume.
inline constexpr int kBlockN = 128;

struct Fp8TileConfig {
  int head_dim;  // kernel head dim: 64, 128 or 256
  int block_m;   // query rows per CTA (64 per consumer warpgroup)
  int block_n;   // key rows per pipeline stage (kBlockN)
  int stages;    // K / V / Vt shared-memory stages

  constexpr int consumer_warpgroups() const { return block_m / 64; }
  constexpr int threads() const { return 128 * (1 + consumer_warpgroups()); }
  // setmaxnreg split of the 64K registers, the bf16 kernel's: the producer's V transpose
  // is written to fit 24 (one 4x4-byte block at a time).
  constexpr int producer_registers() const { return consumer_warpgroups() == 2 ? 24 : 32; }
  constexpr int consumer_registers() const { return consumer_warpgroups() == 2 ? 240 : 160; }
  // Bytes of one swizzled row of a Q/K/V panel: the whole head-dim row up to 128 bytes.
  constexpr int qkv_panel_bytes() const { return head_dim < 128 ? head_dim : 128; }
  constexpr int qkv_panels() const { return head_dim / qkv_panel_bytes(); }
  constexpr int q_bytes() const { return block_m * head_dim; }
  constexpr int kv_tile_bytes() const { return block_n * head_dim; }  // K, V and Vt alike
  // Tiles + mbarriers (256 bytes) + slack to align the tiles to 1024 bytes (the largest swizzle atom).
  constexpr int shared_bytes() const { return q_bytes() + 3 * stages * kv_tile_bytes() + 256 + 1024; }
};

// First version (not tuned on the device yet; TUNING.md): block_n 128 everywhere (one
// Vt swizzle row), block_m 128 with two consumer warpgroups at d128/d256 (240
// registers: O is 128 fp32 registers per thread at d256), three at d64 as the bf16
// kernel found best; as many stages as fit (d256: 2 stages = 225 KB of 227).
inline constexpr Fp8TileConfig kFp8TileTable[] = {
    // dim  M    N   stages
    {64, 192, kBlockN, 3},
    {128, 128, kBlockN, 3},
    {256, 128, kBlockN, 2},
};

constexpr Fp8TileConfig fp8_tile_config(int kernel_head_dim) {
  for (const Fp8TileConfig& config : kFp8TileTable)
    if (config.head_dim == kernel_head_dim) return config;
  return Fp8TileConfig{0, 0, 0, 0};
}

}  // namespace flashattn::cuda::hopper_fp8
