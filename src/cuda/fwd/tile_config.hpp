// src/cuda/fwd/tile_config.hpp — tile sizes of the FA2 (mma.sync) forward kernel.
//
// PERFORMANCE ONLY: these numbers choose speed, register pressure and shared-memory
// use; they must not change results (every tile shape computes the same exact
// attention; only the fp32 summation order inside a row may differ between configs,
// never between runs of one config).
//
// Kernels exist for a few head dims only (kernel_head_dim); every other multiple of
// 8 runs on the next larger one, the head-dim tail zero-filled inside the kernel. The
// one selection of that kernel, ForwardHeadDims::smallest_holding (src/cuda/head_dims.hpp),
// is used both by cuda::limits() (what is advertised) and by cuda::forward() (what is
// launched), so the two cannot disagree.
// Host and device code; no CUDA headers.
#pragma once

namespace flashattn::cuda::fwd {

struct TileConfig {
  int kernel_head_dim;     // head dim the kernel is compiled for (smem/register tile width)
  int block_m;             // query rows per CTA = 16 * warps * m_tiles_per_warp
  int block_n;             // key rows per pipeline stage
  int warps;               // warps per CTA; each owns block_m / warps query rows
  int stages;              // K/V shared-memory stages of the cp.async pipeline (>= 2)
  int min_blocks_per_sm;   // __launch_bounds__ hint: caps registers so this many CTAs fit
  int element_bytes = 2;   // of q, k and v (the mma.sync kernel: bf16, fp16)

  constexpr int threads() const { return warps * 32; }
  constexpr int m_tiles_per_warp() const { return block_m / (16 * warps); }
  // Q tile + (K tile + V tile) per stage.
  constexpr int shared_bytes() const { return element_bytes * kernel_head_dim * (block_m + 2 * stages * block_n); }
};

// Sized for sm_80..sm_90 (Ampere's 164 KB and Hopper's 227 KB of shared memory per
// CTA; every entry also fits sm_86/89's 99 KB). Rationale (H100 timings,
// 2026-11-22, in src/cuda/fwd/TUNING.md):
//  - 4 warps x 32 query rows (two m16 tiles per warp) for d <= 128: each K/V
//    fragment read from shared memory feeds two mma, which halves shared-memory
//    traffic per flop against 16 rows per warp (+15% at d64 and d128). The fp32 O
//    accumulator is then d registers per thread, so d96/d128 take 255 registers
//    with a small spill outside the hot path; 2 CTAs (8 warps) per SM.
//  - d64 keeps 3 K/V stages (96 KB for two CTAs per SM): 301 vs 278 TF/s at 4k and
//    298 vs 273 at 16k tokens against 2 stages, same run.
//  - d 192/256: 16 rows per warp (O alone is d/2 registers); Q + two K/V stages stay
//    under 99 KB. d192 runs 8 warps x block_m 128 (251 vs 233 TF/s for 4 warps x 64 at
//    4k tokens); at d256 the two are even and 4 warps x 64 keeps 2 CTAs per SM.
inline constexpr TileConfig kForwardTileTable[] = {
    // dim  M    N    warps stages minCTAs
    {32, 128, 64, 4, 2, 2},
    {64, 128, 64, 4, 3, 2},
    {96, 128, 32, 4, 2, 2},
    {128, 128, 64, 4, 2, 2},
    {192, 128, 32, 8, 2, 1},
    {256, 64, 32, 4, 2, 2},
};

constexpr TileConfig tile_config_for(int kernel_head_dim) {
  for (const TileConfig& config : kForwardTileTable)
    if (config.kernel_head_dim == kernel_head_dim) return config;
  return TileConfig{0, 0, 0, 0, 0, 0};
}

}  // namespace flashattn::cuda::fwd
