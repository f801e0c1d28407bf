// src/cuda/hopper/tile_config.hpp — tile shapes of the Hopper (sm_90a) forward kernel.
//
// PERFORMANCE ONLY: these numbers choose speed and shared-memory use; every entry
// computes the same exact attention (only the fp32 summation order inside a row may
// differ between entries, never between runs of one entry). hopper_tile_config() is
// read by the support predicate (src/cuda/hopper/launch.cu) and by the launch, so what
// is advertised and what runs cannot disagree.
//
// CTA = 1 producer warpgroup (TMA) + kConsumerWarpgroups consumer warpgroups (wgmma),
// each consumer owning 64 query rows: block_m = 64 * consumer warpgroups.
// Shared memory: Q (block_m, d) + stages x [K (block_n, d) + V (block_n, d)], all in
// 64-column panels with the 128-byte swizzle, must stay under 227 KB.
// Host and device code; no CUDA headers.
#pragma once

namespace flashattn::cuda::hopper {

inline constexpr int kConsumerWarpgroups = 2;
inline constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
inline constexpr int kPanelColumns = 64;  // 128 bytes of 16-bit elements: one swizzle row
inline constexpr int kMaxSharedBytes = 227 * 1024;

struct HopperTileConfig {
  int kernel_head_dim;  // head dim the kernel is compiled for (a multiple of 64)
  int block_m;          // query rows per CTA (64 per consumer warpgroup)
  int block_n;          // key rows per pipeline stage (the N of S = Q K^T)
  int stages;           // K/V shared-memory stages of the TMA rings
  bool is_intra_overlap;  // issue S_j = Q K_j^T before O += P_(j-1) V_(j-1), softmax in between
  bool is_ping_pong;      // the consumer warpgroups take turns issuing GEMMs (needs is_intra_overlap)

  constexpr int panels() const { return kernel_head_dim / kPanelColumns; }
  constexpr int q_bytes() const { return block_m * kernel_head_dim * 2; }
  constexpr int kv_tile_bytes() const { return block_n * kernel_head_dim * 2; }
  // Tiles + mbarriers (256 bytes) + slack to align the tiles to 1024 bytes (the swizzle atom).
  constexpr int shared_bytes() const { return q_bytes() + 2 * stages * kv_tile_bytes() + 256 + 1024; }
};

// Sized after FA3's hopper/tile_size.h: 128 x 128 for d64/d128; d256 keeps block_n 80
// so Q + two K/V stages fit (224 KB). Schedules measured on the H100 (2026-11-22,
// flashattn_hopper_timing --quick, TF/s, plain / intra-warpgroup overlap / overlap +
// ping-pong): the overlap wins nearly everywhere — d128 bf16 4k 545/633/614, 4k causal
// 412/494/412; d256 4k 640/699/662, 16k causal 680/740/635; d64 fp16 16k 382/445/434 —
// while the ping-pong turn barriers cost more than they hide at these shapes. 3 stages
// (d64/d128) measured slower than 2 (d128 4k 544 vs 614 with ping-pong).
inline constexpr HopperTileConfig kHopperTileTable[] = {
    // dim  M    N   stages overlap ping-pong
    {64, 128, 128, 2, true, false},
    {128, 128, 128, 2, true, false},
    {256, 128, 80, 2, true, false},
};

constexpr HopperTileConfig hopper_tile_config(int kernel_head_dim) {
  for (const HopperTileConfig& config : kHopperTileTable)
    if (config.kernel_head_dim == kernel_head_dim) return config;
  return HopperTileConfig{0, 0, 0, 0, false, false};
}

}  // namespace flashattn::cuda::hopper
