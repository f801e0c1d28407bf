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
// HopperTileConfig carries its element size: the FP8 (e4m3) forward
// (hopper_fp8/tile_config.hpp) uses the same type with 1-byte elements.
// Host and device code; no CUDA headers.
#pragma once

namespace flashattn::cuda::hopper {

inline constexpr int kMaxConsumerWarpgroups = 3;
inline constexpr int kPanelColumns = 64;  // 128 bytes of 16-bit elements: one swizzle row
inline constexpr int kSwizzleRowBytes = 128;  // the widest TMA/wgmma swizzle
inline constexpr int kMaxSharedBytes = 227 * 1024;
inline constexpr int kTileRecordsMaxBytes = 128;  // shared_bytes(): two TileRecords (tile_scheduler.cuh)
inline constexpr int kOutputStoreRows = 64;  // box rows of out's TMA store map: one consumer warpgroup's

struct HopperTileConfig {
  int kernel_head_dim;  // head dim the kernel is compiled for (a multiple of 64)
  int block_m;          // query rows per CTA (64 per consumer warpgroup)
  int block_n;          // key rows per pipeline stage (the N of S = Q K^T)
  int stages;           // K/V shared-memory stages of the TMA rings
  bool is_intra_overlap;  // issue S_j = Q K_j^T before O += P_(j-1) V_(j-1), softmax in between
  bool is_ping_pong;      // the consumer warpgroups take turns issuing GEMMs (needs is_intra_overlap)
  bool is_persistent;     // one CTA per SM looping over tiles; O stored from registers while
                          // the producer loads the next tile
  int element_bytes = 2;  // of q, k and v: 2 (bf16, fp16), 1 (e4m3: hopper_fp8/)

  constexpr int consumer_warpgroups() const { return block_m / 64; }
  // Whether the kernel compiles the attn_mask / block mask path (kernel.cuh): one CTA
  // per tile and 240-register consumers; the other kernels sit at their register limit.
  // The FP8 kernel has no mask path (it refuses masks).
  constexpr bool has_mask_lists() const { return element_bytes == 2 && !is_persistent && consumer_warpgroups() == 2; }
  constexpr int threads() const { return 128 * (1 + consumer_warpgroups()); }
  // setmaxnreg split of the 64K registers: the producer keeps few, consumers get the rest.
  constexpr int producer_registers() const { return consumer_warpgroups() == 2 ? 24 : 32; }
  constexpr int consumer_registers() const { return consumer_warpgroups() == 2 ? 240 : 160; }
  // Q/K/V rows in panels of up to one swizzle row: 64 columns of 16-bit elements (the
  // 128-byte swizzle); e4m3 rows of d bytes, 64 (64-byte swizzle) or 128 per panel.
  constexpr int row_bytes() const { return kernel_head_dim * element_bytes; }
  constexpr int panel_bytes() const { return row_bytes() < kSwizzleRowBytes ? row_bytes() : kSwizzleRowBytes; }
  constexpr int panels() const { return row_bytes() / panel_bytes(); }
  constexpr int q_bytes() const { return block_m * row_bytes(); }
  constexpr int kv_tile_bytes() const { return block_n * row_bytes(); }
  // Tiles per stage: K and V; 8-bit wgmma reads its B operand only K-major, so the FP8
  // kernel adds Vt (d, block_n), V transposed in shared memory (as many bytes as V).
  constexpr int kv_tiles_per_stage() const { return element_bytes == 1 ? 3 : 2; }
  // The mask lists' row intervals after the mbarriers (kernel.cuh, FLASHATTN_CUDA_MASKS_ROW_INTERVALS):
  // one int2 per query row of the tile, kept in shared memory rather than in registers
  // across the key loop (there they spilled the mask kernels, ptxas -v).
  constexpr int row_interval_bytes() const { return has_mask_lists() ? block_m * 8 : 0; }
  // The persistent 16-bit kernels' decoded tiles, one per tile-queue slot (TileRecord,
  // tile_scheduler.cuh), in the place of the row intervals (kernels with mask lists are
  // never persistent).
  constexpr int tile_record_bytes() const { return is_persistent && element_bytes == 2 ? kTileRecordsMaxBytes : 0; }
  // Tiles + mbarriers (256 bytes) + row intervals or tile records + slack to align the
  // tiles to 1024 bytes (the swizzle atom).
  constexpr int shared_bytes() const {
    return q_bytes() + kv_tiles_per_stage() * stages * kv_tile_bytes() + 256 + row_interval_bytes() +
           tile_record_bytes() + 1024;
  }
  // The tile-overlap schedule of persistent kernels (kernel.cuh, FLASHATTN_CUDA_HOPPER_EPILOGUE
  // =tma_overlap) adds a second Q buffer after the mbarriers, padded to a 1024-byte atom:
  // Q of tile t + 1 loads while tile t runs, and each tile's O is staged in its own Q
  // buffer for the TMA store. d64 (block_m 128: 98 KB, 192: 114 KB) and d128 (194 KB)
  // have room; d256 (Q 64 KB + 160 KB of K/V stages) does not and keeps one buffer.
  // Whether a kernel uses it: overlaps_with_two_q_buffers (launch.hpp).
  constexpr int second_q_offset() const { return q_bytes() + kv_tiles_per_stage() * stages * kv_tile_bytes() + 1024; }
  constexpr int two_q_shared_bytes() const { return second_q_offset() + q_bytes() + 1024; }
  constexpr bool has_room_for_two_q() const { return two_q_shared_bytes() <= kMaxSharedBytes; }
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
//    unequal CTAs), which keep block_m 128 (ProblemClass::short_masked).
//  - d128: block_n 176 lost at 1k-16k but 16k causal (600 vs 633 at 4k); 3 stages of
//    128 were slower than 2. d256: block_n 80 over 64 (16k 753 vs 560).
//  - persistent grid (one CTA per SM looping over tiles, O stored from registers while
//    the next tile loads): +8-20% on unmasked problems at 1k (d64 bf16 354 vs 299, d128
//    484 vs 448), +2-10% beyond (d256 16k 759 vs 690); on causal problems the static
//    round-robin of unequal tiles loses badly (d128 16k causal 429 vs 629). Short
//    masked problems (seqlen_q <= 2048) run the persistent kernels with the dynamic tile
//    scheduler instead (tiles from an atomic counter, each head's heaviest first, kernel.cuh); H200,
//    2026-11-27, ours / cuDNN causal, dynamic vs one CTA per tile: d64 1k 0.78 vs 0.64,
//    2k 0.80 vs 0.73; d128 1k 0.81 vs 0.76, 2k 0.87 vs 0.87 — but d128 4k 0.92 vs 0.95,
//    16k 0.96 vs 1.03, so longer masked problems keep one CTA per tile.
enum class ProblemClass : int {
  unmasked,      // every tile visits the same number of key blocks
  masked,        // causal or local: tiles of unequal work
  short_masked,  // masked with seqlen_q <= kShortMaskedSeqlen
  mask_lists,    // attn_mask or block mask: the one-CTA-per-tile configs with two consumer
                 // warpgroups, whose kernels have the mask lists' path (has_mask_lists());
                 // masked's where the table has no entry of its own.
  short_masked_on_unmasked_tiles,  // short_masked run on unmasked's config (an A/B switch,
                                   // FLASHATTN_CUDA_HOPPER_SHORT_MASKED_TILES=unmasked, launch.hpp):
                                   // d64 block_m 192 with three consumer warpgroups, persistent
                                   // with the dynamic scheduler (1k causal lost 172 vs 197 TF/s
                                   // with one CTA per tile, H100 2026-11-22; not timed since);
                                   // the same kernel as short_masked's elsewhere. No new kernel.
};
inline constexpr int kShortMaskedSeqlen = 2048;

struct HopperTileEntry {
  ProblemClass problem_class;
  HopperTileConfig config;
};

inline constexpr HopperTileEntry kHopperTileTable[] = {
    //                            dim  M    N   stages overlap ping-pong persistent
    {ProblemClass::unmasked,     {64, 192, 128, 2, true, false, true}},
    {ProblemClass::masked,       {64, 192, 128, 2, true, false, false}},
    {ProblemClass::short_masked, {64, 128, 128, 2, true, false, true}},
    {ProblemClass::mask_lists,   {64, 128, 128, 2, true, false, false}},
    {ProblemClass::unmasked,     {128, 128, 128, 2, true, false, true}},
    {ProblemClass::masked,       {128, 128, 128, 2, true, false, false}},
    {ProblemClass::short_masked, {128, 128, 128, 2, true, false, true}},
    {ProblemClass::unmasked,     {256, 128, 80, 2, true, false, true}},
    {ProblemClass::masked,       {256, 128, 80, 2, true, false, false}},
    {ProblemClass::short_masked, {256, 128, 80, 2, true, false, true}},
};

// Dropout problems run a kHasDropout kernel (kernel.cuh). Where its Philox draws do not
// fit an entry's registers, the entry below replaces it: d64 with three consumer
// warpgroups (160 registers each) spills ~900 bytes in the persistent mainloop once the
// round keys of a seed read from device memory take vector registers; two consumer
// warpgroups (240 registers) do not spill.
inline constexpr HopperTileEntry kHopperDropoutTileTable[] = {
    //                            dim  M    N   stages overlap ping-pong persistent
    {ProblemClass::unmasked,     {64, 128, 128, 2, true, false, true}},
    {ProblemClass::masked,       {64, 128, 128, 2, true, false, false}},
    {ProblemClass::short_masked, {64, 128, 128, 2, true, false, true}},
};

constexpr ProblemClass problem_class_of(bool is_masked, long long seqlen_q) {
  if (!is_masked) return ProblemClass::unmasked;
  return seqlen_q <= kShortMaskedSeqlen ? ProblemClass::short_masked : ProblemClass::masked;
}

// The tile config that runs a problem of this class with this kernel head dim, with or
// without dropout (the one selection: the tensor maps in launch.cu and the launch in
// kernel.cuh read it). short_masked and mask_lists fall back to masked where the table
// has no entry of their own, short_masked_on_unmasked_tiles is unmasked's; dropout falls
// back to the entries without it.
constexpr HopperTileConfig hopper_tile_config(int kernel_head_dim, ProblemClass problem_class,
                                              bool has_dropout = false) {
  if (has_dropout)
    for (const HopperTileEntry& entry : kHopperDropoutTileTable)
      if (entry.config.kernel_head_dim == kernel_head_dim && entry.problem_class == problem_class)
        return entry.config;
  for (const HopperTileEntry& entry : kHopperTileTable)
    if (entry.config.kernel_head_dim == kernel_head_dim && entry.problem_class == problem_class) return entry.config;
  if (problem_class == ProblemClass::short_masked_on_unmasked_tiles)
    return hopper_tile_config(kernel_head_dim, ProblemClass::unmasked, has_dropout);
  if (problem_class == ProblemClass::short_masked || problem_class == ProblemClass::mask_lists)
    return hopper_tile_config(kernel_head_dim, ProblemClass::masked, has_dropout);
  return HopperTileConfig{0, 0, 0, 0, false, false, false};
}

}  // namespace flashattn::cuda::hopper
