// src/cuda/bwd/tile_config.hpp — tile sizes of the backward kernels, per head dim.
//
// Performance only: results never depend on these (every product accumulates in
// fp32 in a fixed order for a given config). Host and kernels read the same table.
#pragma once

#include "src/cuda/kernel_registry.hpp"

namespace flashattn::cuda::bwd {

// The dK/dV kernel (dkdv_kernel.cuh). Three products run on three warp grids:
//   S, dP   (block_m, block_n):  sdp_warps_m warps along the queries, the rest along the keys;
//   dK, dV  (block_n, head_dim): dkdv_warps_n warps along the keys, the rest along the head dim;
//   dQ      (block_m, head_dim): dq_warps_m warps along the queries, the rest along the head dim.
struct DkdvConfig {
  int block_m;  // query rows per step
  int block_n;  // key rows per CTA
  int warps;
  int stages;   // Q/dO/LSE/D buffers: 2 = the next step's tiles load during this one
  int sdp_warps_m;
  int dkdv_warps_n;
  int dq_warps_m;
  // How a step's dQ reaches the fp32 accumulator: false = staged in shared memory and
  // added as one bulk TMA reduction (sm_90); true = vector atomics from the registers.
  bool dq_atomics = false;
  // Load the next k-step's mma fragments before the current k-step's mma (more registers).
  bool prefetch_fragments = false;
  friend constexpr bool operator==(const DkdvConfig&, const DkdvConfig&) = default;
};

// The deterministic dQ kernel (dq_kernel.cuh): one CTA per query block sums dS K over
// the key blocks in registers. Two products on two warp grids:
//   S, dP (block_m, block_n):  sdp_warps_m warps along the queries, the rest along the keys;
//   dQ    (block_m, head_dim): dq_warps_m warps along the queries, the rest along the head dim.
struct TileConfig {
  int block_m;  // query rows per CTA
  int block_n;  // key rows per step
  int warps;
  int stages;   // K/V buffers: 2 = the next step's tiles load during this one
  int sdp_warps_m;
  int dq_warps_m;
  bool prefetch_fragments = true;  // as in DkdvConfig
  friend constexpr bool operator==(const TileConfig&, const TileConfig&) = default;
};

// Head dims instantiated (a head dim in between runs padded to the next one): the
// registry's (generate_instantiations.py); a build compiles those of FLASHATTN_CUDA_HEAD_DIMS.
inline constexpr auto& kHeadDims = registry::kSm80HeadDims;

// The largest block_m of any config: the padding of the per-sequence statistics rows
// (workspace.hpp) lets every step load whole block_m tiles of LSE and D.
inline constexpr int kMaxBlockM = 128;

// Each head dim has one config per shared-memory tier, the opt-in shared memory per
// block of a GPU family. A device runs the first tier whose config fits its limit
// (select.hpp); tiers whose config equals an earlier one are not instantiated twice.
enum class SmemTier : int {
  hopper = 0,   // 227 KB: H100, H200 (and the sm_100 datacenter parts)
  ampere = 1,   // 163 KB: A100, and the sm_87 Jetson Orin
  compact = 2,  // 99 KB: sm_86, sm_89 (RTX 30xx/40xx, A10, L4, L40) and sm_120
};
inline constexpr int kSmemTierCount = 3;
inline constexpr int kSmemTierBytes[kSmemTierCount] = {227 * 1024, 163 * 1024, 99 * 1024};

// hopper: as FA2 picks them for sm80/sm90 (flash_bwd_launch_template.h), with dK and
// dV of the CTA's key block in registers: 2 * block_n * head_dim fp32 over warps * 32
// threads = 64 (d <= 64), 128 (d128, d256) per thread. One CTA per SM (~200 KB of
// shared memory: K, V, Q/dO stages, P, dS, the fp32 dQ staging tile).
//  - d <= 64: 128 x 128 steps halve the per-flop Q/dO traffic and dQ reductions of 64 x 128.
//  - d96: all warps along the keys (48-column warp tiles do not divide a 32-column grid).
//  - d >= 192: block_n 64 keeps dK/dV in registers; d256 single-buffers Q/dO to fit
//    the dQ staging tile in 227 KB.
// Measurements (H100, 2026-11-22) in src/cuda/bwd/TUNING.md: bulk-reduced and atomic
// dQ, with and without fragment prefetch, are within 3% at d64 4k; prefetch is on (no
// extra spills at 255 registers). This table: 0.73-0.82x (d64), 0.78-0.95x (d128),
// 0.76-1.00x (d256) of PyTorch FA2's backward over the BENCHMARKS.md sweeps.
//
// ampere and compact: no staging tile (the bulk reduction is sm_90 only), dQ by
// atomics from the registers as FA2 does on sm80/sm86. block_n stays as large as the
// budget allows (the number of dQ atomics and of Q/dO loads scale with 1/block_n),
// then block_m and the Q/dO double buffer give way:
//  - ampere: the hopper tiles for d >= 128 (161, 161, 144.5 KB), FA2's A100 choices;
//    d <= 96 use the compact config (d64 64 x 128 is FA2's A100 choice).
//  - compact: d32/d64 64 x 128 (65/97 KB); d96 64 x 64 (89 KB; 64 x 128 needs 129 KB);
//    d128 64 x 64 single-buffered (80.5 KB, FA2's sm86 tiles); d192 32 x 64
//    single-buffered (80 KB); d256 32 x 32, 4 warps, single-buffered (68 KB) — every
//    tile with more rows needs > 99 KB here (FA2 fits 64 x 32 by keeping V in registers).
constexpr DkdvConfig dkdv_config(int head_dim, SmemTier tier = SmemTier::hopper) {
  // block_m, block_n, warps, stages, sdp_warps_m, dkdv_warps_n, dq_warps_m, dq_atomics, prefetch
  if (tier == SmemTier::hopper) {
    if (head_dim <= 64) return {128, 128, 8, 2, 2, 4, 4, false, true};
    if (head_dim <= 96) return {64, 128, 8, 2, 2, 8, 4, false, true};
    if (head_dim <= 128) return {64, 128, 8, 2, 2, 4, 2, false, true};
    if (head_dim <= 192) return {64, 64, 8, 2, 4, 2, 2, false, true};
    return {64, 64, 8, 1, 4, 2, 2, false, true};
  }
  if (tier == SmemTier::ampere && head_dim > 96) {
    if (head_dim <= 128) return {64, 128, 8, 2, 2, 4, 2, true, true};
    if (head_dim <= 192) return {64, 64, 8, 2, 4, 2, 2, true, true};
    return {64, 64, 8, 1, 4, 2, 2, true, true};
  }
  if (head_dim <= 64) return {64, 128, 8, 2, 2, 4, 4, true, true};
  if (head_dim <= 96) return {64, 64, 8, 2, 4, 4, 4, true, true};
  if (head_dim <= 128) return {64, 64, 8, 1, 4, 2, 2, true, true};
  if (head_dim <= 192) return {32, 64, 8, 1, 2, 2, 2, true, true};
  return {32, 32, 4, 1, 2, 2, 2, true, true};
}

// The deterministic dQ kernel: block_m 128 where it fits (K/V are streamed once per
// query block, so block_m sets the K/V traffic), block_n 64 (S, dP and dQ of 32 fp32
// per thread at d128), two K/V stages. hopper = ampere (<= 152.5 KB); for 99 KB the K/V
// stream is single-buffered and the blocks shrink from d128 (d256 takes 4 warps: a
// 32 x 32 S tile has no 8-warp grid of 16 x 16 warp tiles).
constexpr TileConfig dq_config(int head_dim, SmemTier tier = SmemTier::hopper) {
  // block_m, block_n, warps, stages, sdp_warps_m, dq_warps_m
  if (tier == SmemTier::compact) {
    if (head_dim <= 64) return {128, 64, 8, 2, 4, 4};  // 49 / 81 KB
    if (head_dim <= 96) return {128, 64, 8, 1, 4, 4};  // 89 KB
    if (head_dim <= 128) return {64, 64, 8, 1, 4, 4};  // 72.5 KB
    if (head_dim <= 192) return {64, 32, 8, 1, 4, 4};  // 76.5 KB
    return {32, 32, 4, 2, 2, 2};                       // 98.3 KB
  }
  if (head_dim <= 128) return {128, 64, 8, 2, 4, 4};  // 145 KB at d128
  if (head_dim <= 192) return {64, 64, 8, 2, 4, 4};   // 152.5 KB
  return {64, 32, 8, 2, 4, 4};                        // 132.5 KB
}

}  // namespace flashattn::cuda::bwd
