// src/cuda/bwd/workspace.hpp — the backward pass's scratch layout and the
// alignment test that picks cp.async over element copies. Host only; shared by
// backward_api.cu and the timing tool so both size and carve the workspace alike.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/core/params.hpp"

namespace flashattn::cuda::bwd {

// Scratch of one backward call, carved out of the caller's workspace.
struct Workspace {
  float* dsum = nullptr;      // D, [heads_q, total_q rows]
  float* dq_accum = nullptr;  // unscaled dQ, fp32 [total_q rows, heads_q, head_dim]
};

inline constexpr std::size_t kWorkspaceAlignment = 256;

inline std::size_t round_up_to_alignment(std::size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// D [heads_q, total_q] fp32 | dq_accum [total_q, heads_q, head_dim] fp32 (absent when
// deterministic: the dQ kernel writes dQ directly). Sections start on 256-byte boundaries.
struct WorkspaceLayout {
  std::size_t dsum_bytes = 0;
  std::size_t dq_accum_bytes = 0;
  std::size_t total() const { return dsum_bytes + dq_accum_bytes; }
};

inline WorkspaceLayout workspace_layout(const BackwardParams& params) {
  const auto rows = static_cast<std::size_t>(params.total_q) * static_cast<std::size_t>(params.heads_q);
  WorkspaceLayout layout;
  layout.dsum_bytes = round_up_to_alignment(sizeof(float) * rows);
  if (!params.deterministic)
    layout.dq_accum_bytes = round_up_to_alignment(sizeof(float) * rows * static_cast<std::size_t>(params.head_dim));
  return layout;
}

inline Workspace carve_workspace(const BackwardParams& params) {
  const WorkspaceLayout layout = workspace_layout(params);
  auto* base = static_cast<unsigned char*>(params.maybe_workspace);
  Workspace workspace;
  workspace.dsum = reinterpret_cast<float*>(base);
  if (layout.dq_accum_bytes > 0) workspace.dq_accum = reinterpret_cast<float*>(base + layout.dsum_bytes);
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
