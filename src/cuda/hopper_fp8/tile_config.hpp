// src/cuda/hopper_fp8/tile_config.hpp — tile shapes and schedules of the FP8 (e4m3)
// Hopper forward kernel.
//
// PERFORMANCE ONLY: these numbers choose speed and shared-memory use; every entry
// computes the same attention (only the fp32 summation order inside a row may differ
// between entries, never between runs of one entry). fp8_tile_config() is the one
// selection: the tensor maps (launch.cu) and the launch (kernel.cuh) read it.
//
// CTA = 1 producer warpgroup + block_m / 64 consumer warpgroups (wgmma, 64 query rows
// each). The producer's thread 0 issues the TMA copies; all 128 producer threads
// transpose each V tile in shared memory into the K-major Vt tile the FP8 P V product
// needs (kernel.cuh). Two schedules (Fp8Schedule), selectable at run time:
//   transpose_copy      Vt written to a ring of its own; K, V and Vt rings of one depth.
//   transpose_in_place  Vt written over its own V tile (V and Vt share one ring, as deep
//                       as the memory of both), K's ring of its own depth.
//   in_place_ping_pong  transpose_in_place with the consumer warpgroups taking turns
//                       issuing their GEMMs (d128, d256).
//   in_place_overlap    transpose_in_place with the consumer loop rotated so that the
//                       softmax of block j really runs under O += P V_(j-1) (kernel.cuh);
//                       in_place_overlap_ping_pong is the same kernel taking turns.
// Shared memory, all 1-byte elements (Fp8TileConfig::shared_bytes):
//   Q (block_m, d) + k_stages x K (block_n, d) + v_stages x V (block_n, d)
//     [+ vt_stages x Vt (d, block_n) for transpose_copy]
// Q, K and V rows are d bytes: one swizzle panel of d bytes (64-byte swizzle) at d64,
// 128-byte panels (128-byte swizzle) at d128 and d256. Vt rows are block_n bytes in
// 128-byte panels (128-byte swizzle), one per 128 keys: one panel at block_n 128; two in
// the wide entries (in_place_overlap_n160 at d64, _n192/_n224 at d128: the second panel
// part-used), each the transpose in place of the part of the V stage that holds keys
// 128 P.. (d128: a 128 x 128-byte square, 16 KB; d64: 128 keys x 64 bytes, 8 KB); a V
// stage is then two whole panels, of which the TMA fills block_n rows.
// Host and device code; no CUDA headers.
#pragma once

#include "src/cuda/hopper/tile_config.hpp"

namespace flashattn::cuda::hopper_fp8 {

using hopper::kMaxConsumerWarpgroups;
using hopper::kMaxSharedBytes;
// Keys per tile of every entry but the wide one (Fp8TileConfig::block_n).
inline constexpr int kDefaultBlockN = 128;

// How the producer warpgroup turns V into Vt and when it issues its loads (kernel.cuh).
enum class Fp8Schedule : int {
  // Vt_j in a ring of its own (V_j's stage freed once transposed); thread 0 issues K_j,
  // V_j in order, blocking on each stage, between its warp's transposes. At d256 only 2
  // stages of each fit: Vt_j's stage frees one consumer round before Vt_j is needed.
  transpose_copy = 0,
  // Vt_j written over V_j in its own stage (kernel.cuh: each producer warp reads a set of
  // blocks that is closed under the transposition, then writes it back), so the V/Vt
  // ring is as deep as both rings were (d256: 4 stages instead of 2 + 2); thread 0
  // issues whichever K or V load has a free stage between transposes, never blocking
  // its warp on one while V tiles wait to be transposed.
  transpose_in_place = 1,
  // transpose_in_place, and the two consumer warpgroups take turns issuing their GEMMs
  // (FA3's ping-pong, section 3.1: one's softmax runs under the other's GEMMs; FA3 uses
  // it for FP8 from d128). Two consumer warpgroups only: d64 (three) runs
  // transpose_in_place (kernel_schedule below).
  in_place_ping_pong = 2,
  // transpose_in_place with the consumer loop rotated (kernel.cuh, "rotated loop"): an
  // iteration ends with the softmax of S_j and starts with the wait for O += P'_(j-1)
  // V_(j-1), so the softmax runs while that GEMM does. (In the loop of the schedules
  // above ptxas hoists that wait to the top of the softmax's basic block: TUNING.md,
  // "FA3's FP8 d256 path vs ours", point 1.) Its producer moves the same blocks as
  // transpose_in_place with each warp's items resolved at compile time (fewer address
  // instructions).
  in_place_overlap = 3,
  // in_place_overlap, and the two consumer warpgroups take turns issuing their GEMMs (as
  // in_place_ping_pong; FA3's FP8 schedule from d128: ping-pong and intra-warpgroup
  // overlap together). The in_place_overlap kernel reads this at run time (a uniform
  // branch, no kernel of its own); d64 (three consumer warpgroups) takes no turns.
  in_place_overlap_ping_pong = 4,
  // in_place_overlap with a wider key tile: 192 or 224 keys at d128, 160 at d64 (FA3's FP8
  // tiles, hopper/tile_size.h: d128 non-causal 128 x 224, d64 192 x 160). The per-key-block
  // costs (row max/sum reductions, the rescale of O, barriers, GEMM issue) spread over more
  // keys and each P V GEMM runs longer. Vt rows span two 128-byte panels. Head dims
  // without an entry run in_place_overlap. (d128 at 256 keys: ptxas serialises the
  // wgmmas, C7512: S 128 + O 64 + P 32 registers live across the GEMM issue.)
  in_place_overlap_n192 = 5,
  in_place_overlap_n224 = 6,
  in_place_overlap_n160 = 7,
  // in_place_overlap_n224 with the two consumer warpgroups taking turns, as
  // in_place_overlap_ping_pong is in_place_overlap taking turns: no kernel of its own (the
  // n224 kernel has the turn code; run_forward_fp8 launches it told to take turns). Head
  // dims without the n224 kernel run in_place_overlap_ping_pong.
  in_place_overlap_n224_ping_pong = 8,
};

constexpr bool is_wide_overlap(Fp8Schedule schedule) {
  return schedule == Fp8Schedule::in_place_overlap_n192 || schedule == Fp8Schedule::in_place_overlap_n224 ||
         schedule == Fp8Schedule::in_place_overlap_n160;
}

constexpr const char* fp8_schedule_name(Fp8Schedule schedule) {
  switch (schedule) {
    case Fp8Schedule::transpose_copy: return "copy";
    case Fp8Schedule::transpose_in_place: return "in_place";
    case Fp8Schedule::in_place_ping_pong: return "ping_pong";
    case Fp8Schedule::in_place_overlap: return "overlap";
    case Fp8Schedule::in_place_overlap_ping_pong: return "overlap_ping_pong";
    case Fp8Schedule::in_place_overlap_n192: return "overlap_n192";
    case Fp8Schedule::in_place_overlap_n224: return "overlap_n224";
    case Fp8Schedule::in_place_overlap_n160: return "overlap_n160";
    case Fp8Schedule::in_place_overlap_n224_ping_pong: return "overlap_n224_ping_pong";
  }
  return "unknown";
}
inline constexpr Fp8Schedule kFp8Schedules[] = {Fp8Schedule::transpose_copy, Fp8Schedule::transpose_in_place,
                                                Fp8Schedule::in_place_ping_pong, Fp8Schedule::in_place_overlap,
                                                Fp8Schedule::in_place_overlap_ping_pong,
                                                Fp8Schedule::in_place_overlap_n192,
                                                Fp8Schedule::in_place_overlap_n224,
                                                Fp8Schedule::in_place_overlap_n160,
                                                Fp8Schedule::in_place_overlap_n224_ping_pong};
inline constexpr Fp8Schedule kFp8WideSchedules[] = {Fp8Schedule::in_place_overlap_n160,
                                                    Fp8Schedule::in_place_overlap_n192,
                                                    Fp8Schedule::in_place_overlap_n224};

// When the in_place_overlap kernel multiplies O by the rescale factor of its rows
// (kernel.cuh, rescale_o). The factor is exactly 1 when a row's running max did not
// move, so skipping the multiply then changes no bit of the result.
enum class Fp8Rescale : int {
  every_block = 0,     // every key block, as the other schedules and FA3 do
  when_max_moves = 1,  // a warp skips it when none of its 16 rows' maxima moved (a vote)
};

constexpr const char* fp8_rescale_name(Fp8Rescale rescale) {
  switch (rescale) {
    case Fp8Rescale::every_block: return "every_block";
    case Fp8Rescale::when_max_moves: return "when_max_moves";
  }
  return "unknown";
}
inline constexpr Fp8Rescale kFp8Rescales[] = {Fp8Rescale::every_block, Fp8Rescale::when_max_moves};

struct Fp8TileConfig {
  int kernel_head_dim;     // head dim the kernel is compiled for: 64, 128 or 256
  int block_m;             // query rows per CTA (64 per consumer warpgroup)
  int block_n;             // keys per tile: kDefaultBlockN, or the wide entries' 160 (d64), 192/224 (d128)
  int k_stages;            // K tiles in flight (TMA ring)
  int v_stages;            // V tiles in flight (TMA ring; in place: V then Vt in each stage)
  int vt_stages;           // Vt tiles (transpose_copy: a ring of their own; in place: = v_stages)
  Fp8Schedule schedule;
  bool is_ping_pong;       // the consumer warpgroups take turns issuing GEMMs (exactly 2 of them)
  int producer_registers;  // setmaxnreg of the producer warpgroup (TMA + transpose)
  int consumer_registers;  // and of each consumer warpgroup

  constexpr bool is_in_place() const { return schedule != Fp8Schedule::transpose_copy; }
  // The consumer loop ends with the softmax and starts with the wait for the PV GEMM.
  constexpr bool has_rotated_loop() const {
    return schedule == Fp8Schedule::in_place_overlap || is_wide_overlap(schedule);
  }
  constexpr int consumer_warpgroups() const { return block_m / 64; }
  constexpr int threads() const { return 128 * (1 + consumer_warpgroups()); }
  // Registers per thread at launch: __launch_bounds__(threads, 1) caps it at the 64K
  // register file over the threads, in units of 8; setmaxnreg only moves registers
  // between the warpgroups of this budget.
  constexpr int launch_registers() const { return (65536 / threads()) / 8 * 8; }
  constexpr bool fits_register_file() const {
    return 128 * producer_registers + 128 * consumer_warpgroups() * consumer_registers <= launch_registers() * threads();
  }
  // e4m3 rows of d bytes in panels of up to one 128-byte swizzle row.
  constexpr int row_bytes() const { return kernel_head_dim; }
  constexpr int panel_bytes() const { return row_bytes() < hopper::kSwizzleRowBytes ? row_bytes() : hopper::kSwizzleRowBytes; }
  constexpr int panels() const { return row_bytes() / panel_bytes(); }
  constexpr int q_bytes() const { return block_m * row_bytes(); }
  // Vt (d, block_n) in panels of 128 keys (128-byte rows), the last one whole even when
  // block_n is not a multiple of 128 (its rows' tails are never read).
  constexpr int vt_panels() const { return (block_n + hopper::kSwizzleRowBytes - 1) / hopper::kSwizzleRowBytes; }
  constexpr int vt_panel_bytes() const { return kernel_head_dim * hopper::kSwizzleRowBytes; }
  constexpr int k_tile_bytes() const { return block_n * row_bytes(); }
  // A V stage: the TMA's V tile (block_n, d), in place also its Vt (whole panels).
  constexpr int v_tile_bytes() const { return block_n * row_bytes(); }
  constexpr int vt_tile_bytes() const { return vt_panels() * vt_panel_bytes(); }
  constexpr int v_stage_bytes() const {
    return is_in_place() && vt_tile_bytes() > v_tile_bytes() ? vt_tile_bytes() : v_tile_bytes();
  }
  // Tiles + mbarriers (256 bytes) + slack to align the tiles to 1024 bytes (the swizzle atom).
  constexpr int tiles_bytes() const {
    return q_bytes() + k_stages * k_tile_bytes() + v_stages * v_stage_bytes() + (is_in_place() ? 0 : vt_stages * vt_tile_bytes());
  }
  constexpr int shared_bytes() const { return tiles_bytes() + 256 + 1024; }
};

constexpr Fp8TileConfig fp8_copy_entry(int kernel_head_dim, int block_m, int stages, int producer_registers,
                                       int consumer_registers) {
  return Fp8TileConfig{kernel_head_dim,    block_m, kDefaultBlockN, stages, stages, stages, Fp8Schedule::transpose_copy,
                       /*is_ping_pong=*/false, producer_registers, consumer_registers};
}
constexpr Fp8TileConfig fp8_in_place_entry(int kernel_head_dim, int block_m, int k_stages, int v_stages,
                                           int producer_registers, int consumer_registers,
                                           Fp8Schedule schedule = Fp8Schedule::transpose_in_place,
                                           int block_n = kDefaultBlockN) {
  return Fp8TileConfig{kernel_head_dim,
                       block_m,
                       block_n,
                       k_stages,
                       v_stages,
                       v_stages,
                       schedule,
                       schedule == Fp8Schedule::in_place_ping_pong,
                       producer_registers,
                       consumer_registers};
}

// transpose_copy (first version, TUNING.md): block_n 128 everywhere (one Vt swizzle row),
// block_m 128 with two consumer warpgroups at d128/d256 (240 registers: O is 128 fp32
// registers per thread at d256), three at d64 as the bf16 kernel found best; as many
// stages as fit (d256: 2 stages = 225 KB of 227).
// transpose_in_place (not timed yet): the same block_m; the V/Vt ring takes the memory
// the Vt ring had (d256: K 2 + V/Vt 4 stages = 225 KB); d64/d128 have memory to spare
// and take one V/Vt stage more than the copy's 3. d128's consumers have registers to
// spare (144 live of 240): 232, the producer 40 (room for its loader bookkeeping and
// transpose sets without spills); d256's consumers need all 240 (at 232 ptxas
// serialises their wgmmas), so the producer keeps 24 and moves 8-register sets.
inline constexpr Fp8TileConfig kFp8TileTable[] = {
    //              dim  M   stages        registers
    fp8_copy_entry(64, 192, 3,            32, 160),
    fp8_copy_entry(128, 128, 3,           24, 240),
    fp8_copy_entry(256, 128, 2,           24, 240),
    //                  dim  M   K  V/Vt  registers
    fp8_in_place_entry(64, 192, 3, 4,     32, 160),
    fp8_in_place_entry(128, 128, 3, 4,    40, 232),
    fp8_in_place_entry(256, 128, 2, 4,    24, 240),
    //                  dim  M   K  V/Vt  registers  schedule
    fp8_in_place_entry(128, 128, 3, 4,    40, 232,   Fp8Schedule::in_place_ping_pong),
    fp8_in_place_entry(256, 128, 2, 4,    24, 240,   Fp8Schedule::in_place_ping_pong),
    // in_place_overlap (and in_place_overlap_ping_pong, the same kernel): in_place's
    // shapes and registers.
    fp8_in_place_entry(64, 192, 3, 4,     32, 160,   Fp8Schedule::in_place_overlap),
    fp8_in_place_entry(128, 128, 3, 4,    40, 232,   Fp8Schedule::in_place_overlap),
    fp8_in_place_entry(256, 128, 2, 4,    24, 240,   Fp8Schedule::in_place_overlap),
    // in_place_overlap_n192/_n224 (not timed yet): d128 with 192 or 224 keys per tile. A
    // V/Vt stage is two whole Vt panels (32 KB; the TMA fills 24 or 28 KB of it), K stages
    // are 24 or 28 KB: Q 16 + K 3 x 24 + V/Vt 4 x 32 = 216 KB; Q 16 + K 2 x 28 + V/Vt 4 x 32
    // = 200 KB (a third K stage does not fit). Consumers hold S (96 or 112 fp32), O (64)
    // and P (24 or 28 e4m3 registers) across the GEMM issue: d128's 40 / 232 split keeps
    // the producer unspilled (at 24 / 240 the producer spills and the consumers spill the
    // same: ptxas -v, TUNING.md).
    //                  dim  M   K  V/Vt  registers  schedule                              N
    fp8_in_place_entry(128, 128, 3, 4,    40, 232,   Fp8Schedule::in_place_overlap_n192, 192),
    fp8_in_place_entry(128, 128, 2, 4,    40, 232,   Fp8Schedule::in_place_overlap_n224, 224),
    // in_place_overlap_n160 (not timed yet): d64 at FA3's 192 x 160. V/Vt stage two 8 KB
    // Vt panels (16 KB; the TMA fills 10 KB), K 10 KB: Q 12 + K 3 x 10 + V/Vt 4 x 16 = 106 KB.
    // Consumers hold S 80 + O 32 + P 20 registers across the GEMM issue, of 160.
    fp8_in_place_entry(64, 192, 3, 4,     32, 160,   Fp8Schedule::in_place_overlap_n160, 160),
};

// The schedule whose kernel runs `schedule` at this head dim: in_place_overlap for
// in_place_overlap_ping_pong (the kernel takes turns at run time), that of
// in_place_overlap_n224 for in_place_overlap_n224_ping_pong, else the table's entry
// if it has one, else the fallback: in_place_overlap for the wide overlaps (d64, d256),
// transpose_in_place for the ping-pong (d64: three consumer warpgroups).
constexpr Fp8Schedule kernel_schedule(int kernel_head_dim, Fp8Schedule schedule) {
  if (schedule == Fp8Schedule::in_place_overlap_ping_pong) return Fp8Schedule::in_place_overlap;
  if (schedule == Fp8Schedule::in_place_overlap_n224_ping_pong)
    return kernel_schedule(kernel_head_dim, Fp8Schedule::in_place_overlap_n224);
  for (const Fp8TileConfig& config : kFp8TileTable)
    if (config.kernel_head_dim == kernel_head_dim && config.schedule == schedule) return schedule;
  if (is_wide_overlap(schedule)) return Fp8Schedule::in_place_overlap;
  return Fp8Schedule::transpose_in_place;
}

// The entry of (head dim, kernel_schedule(head dim, schedule)); kernel_head_dim 0 if none.
constexpr Fp8TileConfig fp8_tile_config(int kernel_head_dim, Fp8Schedule schedule) {
  const Fp8Schedule resolved = kernel_schedule(kernel_head_dim, schedule);
  for (const Fp8TileConfig& config : kFp8TileTable)
    if (config.kernel_head_dim == kernel_head_dim && config.schedule == resolved) return config;
  return Fp8TileConfig{0, 0, 0, 0, 0, 0, resolved, false, 0, 0};
}

}  // namespace flashattn::cuda::hopper_fp8
