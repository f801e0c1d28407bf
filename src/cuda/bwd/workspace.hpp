// src/cuda/bwd/workspace.hpp — the backward pass's scratch layout and the
// alignment test that picks cp.async over element copies. Host only; shared by
// backward_api.cu and the timing tool so both size and carve the workspace alike.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/core/params.hpp"
#include "src/cuda/bwd/tile_config.hpp"

namespace flashattn::cuda::bwd {

// Per-row statistics are stored per head in padded rows: sequence b starts at a
// 16-byte-aligned row and owns round_up(seqlen_q(b), kMaxBlockM) rows, so a kernel
// loads whole block_m tiles with cp.async and no bounds checks. Rows past the
// sequence hold LSE = +inf, D = 0: P = 0 there.
inline constexpr std::int64_t kStatsPadRows = kMaxBlockM + 4;

// Scratch of one backward call, carved out of the caller's workspace.
struct Workspace {
  float* lse_log2 = nullptr;  // LSE * log2(e) (+inf for fully masked and padding rows), [heads_q, stats rows]
  float* dsum = nullptr;      // D = rowsum(dO ∘ O), [heads_q, stats rows]
  float* dq_accum = nullptr;  // unscaled dQ, fp32 [heads_q, dq rows, head_dim]
  std::int64_t stats_head_stride = 0;  // rows per head of lse_log2 / dsum
  std::int64_t dq_head_stride = 0;     // rows per head of dq_accum
  // Deterministic Hopper backward only: per (query head, sequence, query block) the
  // number of key blocks whose dQ tile has been added (hopper_bwd/kernel.cuh),
  // int32 [heads_q, semaphores_per_head]; zeroed by the preprocess. (No stride field:
  // the Hopper kernel's parameters fill exactly 512 bytes before its tensor maps.)
  std::int32_t* dq_semaphore = nullptr;
  // The Hopper backward's dynamic persistent grid (hopper_bwd/kernel.cuh): the tiles claimed
  // so far, one int32 zeroed by the preprocess; null where no Hopper kernel runs.
  std::int32_t* maybe_tile_counter = nullptr;

  // dq_accum rows of one head: the packed query rows plus kMaxBlockM, so a query tile
  // of block_m rows starting in the last sequence stays inside the head's rows. A
  // tile's rows past its sequence hold exact zeros (P = 0 there), so adding the whole
  // tile at once to the next sequence's rows changes nothing.
  FLASHATTN_HOST_DEVICE static std::int64_t dq_rows_per_head(const BackwardParams& params) {
    return params.total_q + kMaxBlockM;
  }
  // Offset (floats) of (sequence b, query i, head h, column 0) in dq_accum.
  FLASHATTN_HOST_DEVICE std::int64_t dq_offset(const BackwardParams& params, std::int64_t b, std::int64_t i,
                                               std::int64_t h) const {
    const std::int64_t packed = (params.is_varlen() ? params.q_start(b) : b * params.seqlen_q) + i;
    return (h * dq_head_stride + packed) * params.head_dim;
  }

  // dq_semaphore entries of one head: sequence b's query blocks of block_m >=
  // kMinSemaphoreBlockM rows start at floor(packed row of its query 0 / block_m) + b.
  // The +b keeps sequences apart: with s = packed start, L = seqlen_q(b), the next
  // sequence starts at floor((s + L) / block_m) + b + 1 >= floor(s / block_m) +
  // ceil(L / block_m) + b, past b's last block. The last sequence ends below
  // total_q / block_m + batch + 1.
  static constexpr std::int64_t kMinSemaphoreBlockM = 64;
  FLASHATTN_HOST_DEVICE static std::int64_t semaphores_per_head(const BackwardParams& params) {
    return params.total_q / kMinSemaphoreBlockM + params.batch + 1;
  }
  // Index of (sequence b, query block m_block of block_m rows, head h) in dq_semaphore.
  FLASHATTN_HOST_DEVICE std::int64_t semaphore_index(const BackwardParams& params, std::int64_t b,
                                                     std::int64_t m_block, int block_m, std::int64_t h) const {
    const std::int64_t packed = params.is_varlen() ? params.q_start(b) : b * params.seqlen_q;
    return h * semaphores_per_head(params) + packed / block_m + b + m_block;
  }

  // Row of (sequence b, query 0) in the statistics of one head.
  FLASHATTN_HOST_DEVICE static std::int64_t stats_start(const BackwardParams& params, std::int64_t b) {
    const std::int64_t packed = params.is_varlen() ? params.q_start(b) : b * params.seqlen_q;
    return (packed + 3) / 4 * 4 + kStatsPadRows * b;
  }
  FLASHATTN_HOST_DEVICE static std::int64_t stats_rows_per_head(const BackwardParams& params) {
    return (params.total_q + kStatsPadRows * params.batch + 3) / 4 * 4;
  }
};

inline constexpr std::size_t kWorkspaceAlignment = 256;

inline std::size_t round_up_to_alignment(std::size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// LSE [heads_q, stats rows] fp32 | D [heads_q, stats rows] fp32 | dq_accum [heads_q,
// dq rows, head_dim] fp32 | dq_semaphore [heads_q, semaphore rows] int32 (deterministic
// only) | the tile counter, int32. Sections start on 256-byte boundaries.
// The size depends on the arguments only, never on the GPU: a deterministic call may
// run the Hopper kernel (ordered dQ bulk reductions into dq_accum, one semaphore per
// query block) or the FA2-class kernels (a dQ kernel writing dQ directly, neither
// section used), so deterministic mode is sized for both.
struct WorkspaceLayout {
  std::size_t stats_bytes = 0;  // each of LSE and D
  std::size_t dq_accum_bytes = 0;
  std::size_t semaphore_bytes = 0;
  // The tile counter (one int32, a section of its own in every layout).
  std::size_t tile_counter_bytes = kWorkspaceAlignment;
  // + alignment slack: the sections are carved from the caller's pointer rounded up to 256 bytes.
  std::size_t total() const {
    return 2 * stats_bytes + dq_accum_bytes + semaphore_bytes + tile_counter_bytes + kWorkspaceAlignment;
  }
};

inline WorkspaceLayout workspace_layout(const BackwardParams& params) {
  const auto rows = static_cast<std::size_t>(Workspace::dq_rows_per_head(params)) * static_cast<std::size_t>(params.heads_q);
  WorkspaceLayout layout;
  layout.stats_bytes = round_up_to_alignment(sizeof(float) * static_cast<std::size_t>(params.heads_q) *
                                             static_cast<std::size_t>(Workspace::stats_rows_per_head(params)));
  layout.dq_accum_bytes = round_up_to_alignment(sizeof(float) * rows * static_cast<std::size_t>(params.head_dim));
  if (params.deterministic)
    layout.semaphore_bytes = round_up_to_alignment(sizeof(std::int32_t) * static_cast<std::size_t>(params.heads_q) *
                                                   static_cast<std::size_t>(Workspace::semaphores_per_head(params)));
  return layout;
}

inline Workspace carve_workspace(const BackwardParams& params) {
  const WorkspaceLayout layout = workspace_layout(params);
  const auto address = reinterpret_cast<std::uintptr_t>(params.maybe_workspace);
  auto* base = reinterpret_cast<unsigned char*>((address + kWorkspaceAlignment - 1) / kWorkspaceAlignment *
                                                kWorkspaceAlignment);
  Workspace workspace;
  workspace.lse_log2 = reinterpret_cast<float*>(base);
  workspace.dsum = reinterpret_cast<float*>(base + layout.stats_bytes);
  if (layout.dq_accum_bytes > 0) workspace.dq_accum = reinterpret_cast<float*>(base + 2 * layout.stats_bytes);
  if (layout.semaphore_bytes > 0)
    workspace.dq_semaphore = reinterpret_cast<std::int32_t*>(base + 2 * layout.stats_bytes + layout.dq_accum_bytes);
  workspace.maybe_tile_counter =
      reinterpret_cast<std::int32_t*>(base + 2 * layout.stats_bytes + layout.dq_accum_bytes + layout.semaphore_bytes);
  workspace.stats_head_stride = Workspace::stats_rows_per_head(params);
  workspace.dq_head_stride = Workspace::dq_rows_per_head(params);
  return workspace;
}

// Whether every 8-element chunk the kernels move is 16-byte aligned (cp.async and
// paired stores); otherwise they fall back to element copies.
inline bool allows_vector_access(const BackwardParams& p) {
  const void* pointers[] = {p.q, p.k, p.v, p.dout, p.dq, p.dk, p.dv};
  for (const void* pointer : pointers)
    if (reinterpret_cast<std::uintptr_t>(pointer) % 16 != 0) return false;
  const std::int64_t strides[] = {p.q_batch_stride,    p.q_row_stride,     p.q_head_stride,    p.k_batch_stride,
                                  p.k_row_stride,      p.k_head_stride,    p.v_batch_stride,   p.v_row_stride,
                                  p.v_head_stride,     p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride,
                                  p.dq_batch_stride,   p.dq_row_stride,    p.dq_head_stride,   p.dk_batch_stride,
                                  p.dk_row_stride,     p.dk_head_stride,   p.dv_batch_stride,  p.dv_row_stride,
                                  p.dv_head_stride};
  for (const std::int64_t stride : strides)
    if (stride % 8 != 0) return false;
  return true;
}

}  // namespace flashattn::cuda::bwd
