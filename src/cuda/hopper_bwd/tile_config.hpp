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

// How kernel.cuh orders a step's products and barriers (PERFORMANCE ONLY; the gradients
// are the same: dK/dV bitwise, dQ up to the order of its fp32 additions, bitwise in
// deterministic mode). FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE selects it (launch.hpp).
//   lockstep:   one dS^T buffer; dV, dK, then dQ; both consumers meet twice per step (dS^T
//               written; dQ staged in one row-major tile, which consumer 0's first thread
//               adds to dq_accum with one bulk reduction).
//   overlapped: FA3's order. Two dS^T buffers (by step parity), so the consumers meet once
//               per step (dS^T written); dV, then dQ = dS K, then dK, so dQ's staging
//               stores overlap the dK product; each consumer stages its own part of dQ in
//               128-byte-swizzled 32-column fp32 panels (bank-conflict-free float2 stores)
//               and hands it to a dQ-writer warp of the producer warpgroup, which adds it
//               to dq_accum with TMA tensor reductions (and in deterministic mode waits for
//               the turns, so the consumers never spin).
//   deferred_dk: overlapped, but each step's dK product is issued in the next step, after
//               its S^T and dP^T products, so it runs during that step's dS^T math (when
//               the tensor cores idle otherwise); its stage is released a step later (a
//               third stage: kernel.cuh's run_backward_sm90). Head dim 128, default mode
//               only (elsewhere the overlapped schedule runs); experimental.
enum class BackwardSchedule { lockstep, overlapped, deferred_dk };

// The overlapped schedule's dQ staging: fp32 panels of 32 columns (128 bytes a row: the
// TMA's 128-byte swizzle) x 64 rows (a consumer's m64 wgmma rows); the dq_accum tensor
// map's box (launch.cu).
inline constexpr int kDqPanelColumns = 32;
inline constexpr int kDqPanelRows = 64;

inline constexpr int kPanelColumns = 64;  // 128 bytes of 16-bit elements: one swizzle row
inline constexpr int kMaxSharedBytes = 227 * 1024;
inline constexpr int kConsumerWarpgroups = 2;
inline constexpr int kKeysPerConsumer = 64;

struct HopperBwdTileConfig {
  int kernel_head_dim;  // head dim the kernel is compiled for (a multiple of 64)
  int block_m;          // query rows per step (the N of S^T = K Q^T; 64)
  int block_n;          // key rows per CTA (64 per consumer warpgroup)
  int stages;           // Q/dO/LSE/D shared-memory stages of the TMA ring
  int element_bytes = 2;  // of q, k, v, dO and dS^T (bf16, fp16)
  int ds_buffers = 1;     // dS^T tiles: 1 (lockstep), 2 (overlapped: one per step parity)

  // The config a schedule runs (the table holds the lockstep one).
  constexpr HopperBwdTileConfig for_schedule(BackwardSchedule schedule) const {
    HopperBwdTileConfig config = *this;
    config.ds_buffers = schedule == BackwardSchedule::lockstep ? 1 : 2;
    return config;
  }

  constexpr int threads() const { return 128 * (1 + kConsumerWarpgroups); }
  constexpr int producer_registers() const { return 24; }
  constexpr int consumer_registers() const { return 240; }
  constexpr int panels() const { return kernel_head_dim / kPanelColumns; }
  constexpr int kv_tile_bytes() const { return block_n * kernel_head_dim * element_bytes; }
  constexpr int q_tile_bytes() const { return block_m * kernel_head_dim * element_bytes; }
  constexpr int stats_bytes() const { return block_m * 4; }
  constexpr int ds_bytes() const { return block_n * block_m * element_bytes; }  // one dS^T buffer
  constexpr int dq_staging_bytes() const { return block_m * kernel_head_dim * 4; }
  // Byte offsets from the 1024-aligned base (every 16-bit tile on a swizzle atom).
  constexpr int k_offset() const { return 0; }
  constexpr int v_offset() const { return kv_tile_bytes(); }
  constexpr int q_offset() const { return 2 * kv_tile_bytes(); }
  constexpr int do_offset() const { return q_offset() + stages * q_tile_bytes(); }
  constexpr int ds_offset() const { return do_offset() + stages * q_tile_bytes(); }
  constexpr int dq_offset() const { return ds_offset() + ds_buffers * ds_bytes(); }
  constexpr int lse_offset() const { return dq_offset() + dq_staging_bytes(); }
  constexpr int dsum_offset() const { return lse_offset() + stages * stats_bytes(); }
  constexpr int barrier_offset() const { return dsum_offset() + stages * stats_bytes(); }
  // mbarriers, the steps' and tiles' slots (kernel.cuh); deferred_dk's three stages at d128
  // fill exactly 227 KB with them and the alignment slack.
  static constexpr int kBarrierBytes = 512;
  // The key-interval pass (kernel.cuh, FLASHATTN_CUDA_MASKS_BWD_ROW_INTERVALS): one
  // 8-byte allowed-query interval per key row after the mbarriers, where it fits (not
  // beside deferred_dk's third stage at d128; its masks keep the fast pass).
  constexpr int key_interval_offset() const { return barrier_offset() + kBarrierBytes; }
  constexpr int key_interval_bytes() const { return block_n * 8; }
  constexpr bool has_key_intervals() const {
    return key_interval_offset() + key_interval_bytes() + 1024 <= kMaxSharedBytes;
  }
  // Dropout's draw exchange (kernel.cuh; the default, FLASHATTN_CUDA_HOPPER_BWD_DROPOUT_DRAW=
  // twice turns it off): per step parity, one 16-bit value per consumer thread and 64 queries of the step. Where it
  // does not fit (deferred_dk's three stages at d128) the kernel uses the alignment slack
  // when the base needed no more than 1024 − draw_exchange_bytes() of it, else draws twice.
  constexpr int draw_exchange_offset() const {
    return key_interval_offset() + (has_key_intervals() ? key_interval_bytes() : 0);
  }
  constexpr int draw_exchange_bytes() const { return 2 * 128 * kConsumerWarpgroups * 2 * (block_m / 64); }
  constexpr bool has_draw_exchange() const {
    return draw_exchange_offset() + draw_exchange_bytes() + 1024 <= kMaxSharedBytes;
  }
  // + the mbarriers (+ the key intervals) (+ the draw exchange) + slack to align the base to 1024 bytes.
  constexpr int shared_bytes() const {
    return draw_exchange_offset() + (has_draw_exchange() ? draw_exchange_bytes() : 0) + 1024;
  }
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

// ---- wide head dims (d256): FA3's d256 mapping, kernel_wide.cuh --------------------
// The mapping above holds dK and dV of 64 keys x d per consumer in registers: 2 d fp32
// per thread, 512 at d256. Here the consumers split the head dim instead: per step
// (64 queries x 64 keys) consumer w computes S and dP for the keys [32 w, 32 w + 32)
// (queries as the wgmma M, N = 32), writes its half of P and dS (16-bit) to shared
// memory, and then owns the columns [d/2 w, d/2 (w + 1)) of dV += P^T dO, dK += dS^T Q
// (64 keys x d/2: d/2 fp32 per thread each) and dQ = dS K (64 queries x d/2), all from
// shared memory. A stage is [Q | dO] (64 rows x d each): once both consumers are done
// with it, it is the fp32 dQ staging tile (64 x d x 4 bytes = the stage's bytes), which
// the producer adds to dq_accum with one bulk reduction before refilling the stage.
struct HopperBwdWideConfig {
  int kernel_head_dim;
  int block_m;  // queries per step (the M of S, dP, dQ)
  int block_n;  // keys per CTA (the M of dV, dK); 32 per consumer in S and dP
  int stages;   // [Q | dO | LSE | D] stages
  int element_bytes = 2;  // of q, k, v, dO, P and dS (bf16, fp16)

  constexpr int threads() const { return 128 * (1 + kConsumerWarpgroups); }
  constexpr int producer_registers() const { return 24; }
  constexpr int consumer_registers() const { return 240; }
  constexpr int panels() const { return kernel_head_dim / kPanelColumns; }
  constexpr int columns_per_consumer() const { return kernel_head_dim / kConsumerWarpgroups; }
  constexpr int keys_per_consumer() const { return block_n / kConsumerWarpgroups; }
  constexpr int kv_tile_bytes() const { return block_n * kernel_head_dim * element_bytes; }
  constexpr int q_tile_bytes() const { return block_m * kernel_head_dim * element_bytes; }
  constexpr int stage_bytes() const { return 2 * q_tile_bytes(); }  // [Q | dO]
  constexpr int dq_staging_bytes() const { return block_m * kernel_head_dim * 4; }
  constexpr int score_tile_bytes() const { return block_m * block_n * element_bytes; }  // P or dS
  constexpr int stats_bytes() const { return block_m * 4; }
  constexpr int k_offset() const { return 0; }
  constexpr int v_offset() const { return kv_tile_bytes(); }
  constexpr int stage_offset(int stage) const { return 2 * kv_tile_bytes() + stage * stage_bytes(); }
  constexpr int p_offset() const { return stage_offset(stages); }
  constexpr int ds_offset() const { return p_offset() + score_tile_bytes(); }
  constexpr int lse_offset() const { return ds_offset() + score_tile_bytes(); }
  constexpr int dsum_offset() const { return lse_offset() + stages * stats_bytes(); }
  constexpr int barrier_offset() const { return dsum_offset() + stages * stats_bytes(); }
  constexpr int shared_bytes() const { return barrier_offset() + 256 + 1024; }
};

// 64 x 64 tiles (FA3's d256 tiles), two stages: 209.5 KB.
inline constexpr HopperBwdWideConfig kHopperBwdWideTileTable[] = {
    //  dim  M   N  stages
    {256, 64, 64, 2},
};

constexpr HopperBwdWideConfig hopper_bwd_wide_tile_config(int kernel_head_dim) {
  for (const HopperBwdWideConfig& entry : kHopperBwdWideTileTable)
    if (entry.kernel_head_dim == kernel_head_dim) return entry;
  return HopperBwdWideConfig{0, 0, 0, 0};
}

}  // namespace flashattn::cuda::hopper_bwd
