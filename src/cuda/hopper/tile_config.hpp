// src/cuda/hopper/tile_config.hpp — tile shapes of the Hopper (sm_90a) forward kernel.
//
// PERFORMANCE ONLY: these numbers choose speed and shared-memory use; every entry
// computes the same exact attention (only the fp32 summation order inside a row may
// differ between entries, never between runs of one entry). hopper_tile_config() is
// the one selection: the tensor maps (launch.cu) and the launch (kernel.cuh) read it.
//
// CTA = 1 producer warpgroup (TMA) + block_m / 64 consumer warpgroups (wgmma), each
// consumer owning 64 query rows.
// Shared memory: Q (block_m, d) + stages x [K (block_n, d) + V (block_n, d)], all in
// 64-column panels with the 128-byte swizzle, must stay under 227 KB.
// Host and device code; no CUDA headers.
#pragma once

namespace flashattn::cuda::hopper {

inline constexpr int kMaxConsumerWarpgroups = 3;
inline constexpr int kPanelColumns = 64;  // 128 bytes of 16-bit elements: one swizzle row
inline constexpr int kMaxSharedBytes = 227 * 1024;

struct HopperTileConfig {
  int kernel_head_dim;  // head dim the kernel is compiled for (a multiple of 64)
  int block_m;          // query rows per CTA (64 per consumer warpgroup)
  int block_n;          // key rows per pipeline stage (the N of S = Q K^T)
  int stages;           // K/V shared-memory stages of the TMA rings
  bool is_intra_overlap;  // issue S_j = Q K_j^T before O += P_(j-1) V_(j-1), softmax in between
  bool is_ping_pong;      // the consumer warpgroups take turns issuing GEMMs (needs is_intra_overlap)

  constexpr int consumer_warpgroups() const { return block_m / 64; }
  constexpr int threads() const { return 128 * (1 + consumer_warpgroups()); }
  // setmaxnreg split of the 64K registers: the producer keeps few, consumers get the rest.
  constexpr int producer_registers() const { return consumer_warpgroups() == 2 ? 24 : 32; }
  constexpr int consumer_registers() const { return consumer_warpgroups() == 2 ? 240 : 160; }
  constexpr int panels() const { return kernel_head_dim / kPanelColumns; }
  constexpr int q_bytes() const { return block_m * kernel_head_dim * 2; }
  constexpr int kv_tile_bytes() const { return block_n * kernel_head_dim * 2; }
  // Tiles + mbarriers (256 bytes) + slack to align the tiles to 1024 bytes (the swizzle atom).
  constexpr int shared_bytes() const { return q_bytes() + 2 * stages * kv_tile_bytes() + 256 + 1024; }
};

// Sized after FA3's hopper/tile_size.h. Measured on the H100 (2026-11-22,
// flashattn_hopper_timing --quick, TF/s):
//  - schedule (plain / intra-warpgroup overlap / overlap + ping-pong): the overlap wins
//    nearly everywhere — d128 bf16 4k 545/633/614, 4k causal 412/494/412; d256 4k
//    640/699/662, 16k causal 680/740/635; d64 fp16 16k 382/445/434 — while the
//    ping-pong turn barriers cost more than they hide at these shapes.
//  - d64: 3 consumer warpgroups (block_m 192, 160 registers each) beat 2 (block_m 128)
//    from 4k on (fp16 4k 461 vs 422, 16k causal 427 vs 410) and non-causal at 1k (309
//    vs 293), but lose on short causal problems (1k causal 172 vs 197: fewer, more
//    unequal CTAs), which keep block_m 128 (kShortMaskedTileTable).
//  - d128: block_n 176 lost at 1k-16k but 16k causal (600 vs 633 at 4k); 3 stages of
//    128 were slower than 2. d256: block_n 80 over 64 (16k 753 vs 560).
inline constexpr HopperTileConfig kHopperTileTable[] = {
    // dim  M    N   stages overlap ping-pong
    {64, 192, 128, 2, true, false},
    {128, 128, 128, 2, true, false},
    {256, 128, 80, 2, true, false},
};
// Causal/local problems with at most kShortMaskedSeqlen query rows.
inline constexpr int kShortMaskedSeqlen = 1024;
inline constexpr HopperTileConfig kShortMaskedTileTable[] = {
    {64, 128, 128, 2, true, false},
};

// The tile config that runs a problem with this kernel head dim; is_short_masked: a
// causal or local mask with seqlen_q <= kShortMaskedSeqlen (see is_short_masked()).
constexpr HopperTileConfig hopper_tile_config(int kernel_head_dim, bool is_short_masked = false) {
  if (is_short_masked)
    for (const HopperTileConfig& config : kShortMaskedTileTable)
      if (config.kernel_head_dim == kernel_head_dim) return config;
  for (const HopperTileConfig& config : kHopperTileTable)
    if (config.kernel_head_dim == kernel_head_dim) return config;
  return HopperTileConfig{0, 0, 0, 0, false, false};
}

constexpr bool is_short_masked(bool is_masked, long long seqlen_q) {
  return is_masked && seqlen_q <= kShortMaskedSeqlen;
}

}  // namespace flashattn::cuda::hopper
