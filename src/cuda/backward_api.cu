// src/cuda/backward_api.cu — the CUDA backward entry points: workspace layout,
// head-dim dispatch, and the order of the kernels (src/cuda/bwd/).
//
//   1. preprocess: D = rowsum(dO ∘ O); dq_accum = 0         (bwd/pre_post.cu)
//   2. dK/dV kernel, dQ by fp32 atomics into dq_accum      (bwd/kernel.cuh)
//      deterministic: + dQ kernel writing dQ directly, no atomics
//   3. dQ = scale * dq_accum in the user's dtype/strides   (skipped when deterministic)
#include <cstdint>
#include <string>

#include "flashattn/error.hpp"
#include "src/core/backend.hpp"
#include "src/cuda/bwd/kernel.cuh"
#include "src/cuda/bwd/launch.hpp"

namespace flashattn::cuda {
namespace {

constexpr std::size_t kWorkspaceAlignment = 256;

std::size_t round_up(std::size_t bytes) { return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment; }

// Workspace: D [heads_q, total_q] fp32 | dq_accum [total_q, heads_q, head_dim] fp32 (not
// needed by the deterministic path). Sections start on 256-byte boundaries.
struct WorkspaceLayout {
  std::size_t dsum_bytes = 0;
  std::size_t dq_accum_bytes = 0;
  std::size_t total() const { return dsum_bytes + dq_accum_bytes; }
};

WorkspaceLayout workspace_layout(const BackwardParams& params) {
  const auto rows = static_cast<std::size_t>(params.total_q) * static_cast<std::size_t>(params.heads_q);
  WorkspaceLayout layout;
  layout.dsum_bytes = round_up(sizeof(float) * rows);
  if (!params.deterministic) layout.dq_accum_bytes = round_up(sizeof(float) * rows * static_cast<std::size_t>(params.head_dim));
  return layout;
}

bool is_aligned_16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

// Whether every 8-element chunk the kernels move is 16-byte aligned (cp.async and
// paired stores); otherwise they fall back to element copies.
bool allows_vector_access(const BackwardParams& p) {
  const void* pointers[] = {p.q, p.k, p.v, p.dout, p.dq, p.dk, p.dv};
  for (const void* pointer : pointers)
    if (!is_aligned_16(pointer)) return false;
  const std::int64_t strides[] = {p.q_batch_stride,    p.q_row_stride,    p.q_head_stride,    p.k_batch_stride,
                                  p.k_row_stride,      p.k_head_stride,   p.v_batch_stride,   p.v_row_stride,
                                  p.v_head_stride,     p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride,
                                  p.dq_batch_stride,   p.dq_row_stride,   p.dq_head_stride,   p.dk_batch_stride,
                                  p.dk_row_stride,     p.dk_head_stride,  p.dv_batch_stride,  p.dv_row_stride,
                                  p.dv_head_stride};
  for (const std::int64_t stride : strides)
    if (stride % 8 != 0) return false;
  return true;
}

// The compiled head dims (CMake FLASHATTN_CUDA_HEAD_DIMS) as one dispatch: the
// smallest instantiated head dim >= params.head_dim, the rest padded in-kernel.
template <class Element>
void dispatch_head_dim(const BackwardParams& params, const bwd::Workspace& workspace, bool is_aligned,
                       cudaStream_t stream) {
  const std::int64_t d = params.head_dim;
#ifdef FLASHATTN_BWD_HAS_HDIM_32
  if (d <= 32) return bwd::launch_main<Element, 32>(params, workspace, is_aligned, stream);
#endif
#ifdef FLASHATTN_BWD_HAS_HDIM_64
  if (d <= 64) return bwd::launch_main<Element, 64>(params, workspace, is_aligned, stream);
#endif
#ifdef FLASHATTN_BWD_HAS_HDIM_96
  if (d <= 96) return bwd::launch_main<Element, 96>(params, workspace, is_aligned, stream);
#endif
#ifdef FLASHATTN_BWD_HAS_HDIM_128
  if (d <= 128) return bwd::launch_main<Element, 128>(params, workspace, is_aligned, stream);
#endif
#ifdef FLASHATTN_BWD_HAS_HDIM_192
  if (d <= 192) return bwd::launch_main<Element, 192>(params, workspace, is_aligned, stream);
#endif
#ifdef FLASHATTN_BWD_HAS_HDIM_256
  if (d <= 256) return bwd::launch_main<Element, 256>(params, workspace, is_aligned, stream);
#endif
  throw NotSupported("flashattn: cuda backward: head_dim " + std::to_string(d) +
                     " is not compiled into this build (see FLASHATTN_CUDA_HEAD_DIMS)");
}

}  // namespace

std::size_t backward_workspace_bytes(const BackwardParams& params) { return workspace_layout(params).total(); }

void backward(const BackwardParams& params, void* stream_handle) {
  if (params.dtype != DType::float16 && params.dtype != DType::bfloat16)
    throw NotSupported(std::string("flashattn: cuda backward: dtype ") + dtype_name(params.dtype) +
                       " is not supported (float16, bfloat16)");
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const WorkspaceLayout layout = workspace_layout(params);
  auto* base = static_cast<unsigned char*>(params.maybe_workspace);
  bwd::Workspace workspace;
  workspace.dsum = reinterpret_cast<float*>(base);
  if (layout.dq_accum_bytes > 0) workspace.dq_accum = reinterpret_cast<float*>(base + layout.dsum_bytes);
  if (params.batch == 0 || params.heads_q == 0) return;

  bwd::launch_preprocess(params, workspace, stream);
  const bool is_aligned = allows_vector_access(params);
  if (params.dtype == DType::float16) {
    dispatch_head_dim<__half>(params, workspace, is_aligned, stream);
  } else {
    dispatch_head_dim<__nv_bfloat16>(params, workspace, is_aligned, stream);
  }
  if (!params.deterministic) bwd::launch_convert_dq(params, workspace, stream);
}

}  // namespace flashattn::cuda
