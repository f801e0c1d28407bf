// src/cuda/hopper_bwd/tile_config.hpp — tile shapes of the Hopper (sm_90a) backward kernel.
//
// PERFORMANCE ONLY: every entry computes the same exact gradients (only the fp32
// summation order differs between entries). hopper_bwd_tile_config() is the one
// selection: the tensor maps (launch.cu) and the launch (kernel.cuh) read it.
//
// CTA = 1 producer warpgroup (TMA) + 2 consumer warpgroups (wgmma); consumer w owns
// the key rows [64 w, 64 w + 64) of the CTA's block_n = 128 keys: its S^T, dP^T, dV
// and dK rows. block_m is 64 or 128 (one or two 64-query panels of dS^T). Shared memory: K, V (block_n, d) resident; stages x [Q, dO (block_m, d),
// LSE, D (block_m floats)]; dS^T (block_n, block_m) 16-bit; the fp32 dQ staging tile
// (block_m, d). Host and device code; no CUDA headers.
#pragma once

namespace flashattn::cuda::hopper_bwd {

inline constexpr int kPanelColumns = 64;  // 128 bytes of 16-bit elements: one swizzle row
inline constexpr int kMaxSharedBytes = 227 * 1024;
inline constexpr int kConsumerWarpgroups = 2;
inline constexpr int kKeysPerConsumer = 64;

struct HopperBwdTileConfig {
  int kernel_head_dim;  // head dim the kernel is compiled for (a multiple of 64)
  int block_m;          // query rows per step (the N of S^T = K Q^T; 64)
  int block_n;          // key rows per CTA (64 per consumer warpgroup)
  int stages;           // Q/dO/LSE/D shared-memory stages of the TMA ring

  constexpr int threads() const { return 128 * (1 + kConsumerWarpgroups); }
  constexpr int producer_registers() const { return 24; }
  constexpr int consumer_registers() const { return 240; }
  constexpr int panels() const { return kernel_head_dim / kPanelColumns; }
  constexpr int kv_tile_bytes() const { return block_n * kernel_head_dim * 2; }
  constexpr int q_tile_bytes() const { return block_m * kernel_head_dim * 2; }
  constexpr int stats_bytes() const { return block_m * 4; }
  constexpr int ds_bytes() const { return block_n * block_m * 2; }
  constexpr int dq_staging_bytes() const { return block_m * kernel_head_dim * 4; }
  // Byte offsets from the 1024-aligned base (every 16-bit tile on a swizzle atom).
  constexpr int k_offset() const { return 0; }
  constexpr int v_offset() const { return kv_tile_bytes(); }
  constexpr int q_offset() const { return 2 * kv_tile_bytes(); }
  constexpr int do_offset() const { return q_offset() + stages * q_tile_bytes(); }
  constexpr int ds_offset() const { return do_offset() + stages * q_tile_bytes(); }
  constexpr int dq_offset() const { return ds_offset() + ds_bytes(); }
  constexpr int lse_offset() const { return dq_offset() + dq_staging_bytes(); }
  constexpr int dsum_offset() const { return lse_offset() + stages * stats_bytes(); }
  constexpr int barrier_offset() const { return dsum_offset() + stages * stats_bytes(); }
  // + 256 bytes of mbarriers + slack to align the base to 1024 bytes.
  constexpr int shared_bytes() const { return barrier_offset() + 256 + 1024; }
};

// After FA3's hopper/flash_bwd_launch_template.h (hdim 64: 128 x 128 tiles; hdim 128:
// 64 x 128 tiles; 2 MMA warpgroups, dK/dV split over the keys). Registers per consumer
// thread: dK + dV = d fp32, S^T + dP^T = block_m fp32 (64 + 128 at d64, 128 + 64 at d128).
inline constexpr HopperBwdTileConfig kHopperBwdTileTable[] = {
    //  dim  M    N   stages
    {64, 128, 128, 2},  // dQ split by rows; S^T/dP^T 64 x 128 per consumer
    {128, 64, 128, 2},  // dQ split by columns
};

constexpr HopperBwdTileConfig hopper_bwd_tile_config(int kernel_head_dim) {
  for (const HopperBwdTileConfig& entry : kHopperBwdTileTable)
    if (entry.kernel_head_dim == kernel_head_dim) return entry;
  return HopperBwdTileConfig{0, 0, 0, 0};
}

}  // namespace flashattn::cuda::hopper_bwd
