// src/cuda/backward_api.cu — the CUDA backward entry points: workspace layout,
// head-dim dispatch, and the order of the kernels (src/cuda/bwd/).
//
//   1. preprocess: D = rowsum(dO ∘ O), LSE in log2 units; dq_accum = 0   (bwd/pre_post.cu)
//      (the fused passes: the zeroing inside the preprocess kernel, 16-byte-access
//      preprocess/conversion kernels; FLASHATTN_CUDA_HOPPER_BWD_PASSES=separate restores
//      the memsets and the earlier kernels: bwd/launch.hpp)
//   2. sm_90 where hopper_bwd::why_unsupported is empty: the wgmma kernels
//      (hopper_bwd/kernel.cuh: d64/d128; hopper_bwd/kernel_wide.cuh: d256; fp16/bf16,
//      TMA-encodable strides), dQ added to dq_accum by bulk reductions; deterministic:
//      the same kernels, the reductions of each query block ordered by key block
//      (semaphores in the workspace, zeroed in 1).
//      Elsewhere the FA2-class dK/dV kernel, dQ added to dq_accum (bwd/dkdv_kernel.cuh);
//      deterministic: + dQ kernel writing dQ directly, no atomics    (bwd/dq_kernel.cuh)
//   3. dQ = scale * dq_accum in the user's dtype/strides   (skipped by the FA2-class
//      deterministic path, whose dQ kernel wrote dQ)
// A head_dim that is not a multiple of 8 runs staged (staging.hpp): q/k/v/out/dout
// copied zero-padded to round_up(head_dim, 8) into the front of the workspace, steps
// 1-3 on the padded problem (dq/dk/dv into padded scratch, the rest of the workspace
// as theirs), then dq/dk/dv cropped into the caller's tensors.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "flashattn/error.hpp"
#include "src/core/backend.hpp"
#include "src/cuda/bwd/launch.hpp"
#include "src/cuda/bwd/workspace.hpp"
#include "src/cuda/head_dims.hpp"
#include "src/cuda/hopper_bwd/launch.hpp"
#include "src/cuda/staging.hpp"

namespace flashattn::cuda {
namespace {

// The compiled head dims (BackwardHeadDims, head_dims.hpp) as one dispatch: the
// smallest built head dim >= params.head_dim, the rest padded in-kernel.
template <class Element>
void dispatch_head_dim(const BackwardParams& params, const bwd::Workspace& workspace, bool is_aligned,
                       cudaStream_t stream) {
  const std::int64_t d = params.head_dim;
  const bool ran = BackwardHeadDims::visit(BackwardHeadDims::smallest_holding(d), [&](auto head_dim) {
    bwd::launch_main<Element, decltype(head_dim)::value>(params, workspace, is_aligned, stream);
  });
  if (!ran)
    throw NotSupported("flashattn: cuda backward: head_dim " + std::to_string(d) +
                       " is not compiled into this build (see FLASHATTN_CUDA_HEAD_DIMS)");
}

// The staged tensors of a padded backward, at the front of the workspace (256-byte
// aligned sections): q | out | dout | dq (query rows) | k | v | dk | dv (key rows),
// dense [rows, heads, padded_head_dim] 16-bit elements.
struct StagedLayout {
  std::size_t q_bytes = 0, k_bytes = 0;
  std::size_t total() const { return bwd::kWorkspaceAlignment + 4 * q_bytes + 4 * k_bytes; }
};

StagedLayout staged_layout(const BackwardParams& params) {
  const std::int64_t padded = staging::padded_head_dim(params.head_dim);
  StagedLayout layout;
  layout.q_bytes = bwd::round_up_to_alignment(2 * static_cast<std::size_t>(params.total_q * params.heads_q * padded));
  layout.k_bytes = bwd::round_up_to_alignment(2 * static_cast<std::size_t>(params.total_k * params.heads_kv * padded));
  return layout;
}

BackwardParams padded_params(const BackwardParams& params) {
  BackwardParams padded = params;
  padded.head_dim = staging::padded_head_dim(params.head_dim);
  return padded;
}

void backward_staged(const BackwardParams& params, cudaStream_t stream) {
  const StagedLayout layout = staged_layout(params);
  const std::int64_t head_dim = params.head_dim;
  BackwardParams staged = padded_params(params);
  const std::int64_t padded = staged.head_dim;
  const bool is_varlen = params.is_varlen();
  const std::int64_t batches = is_varlen ? 1 : params.batch;  // varlen: one batch of total rows
  const std::int64_t q_rows = is_varlen ? params.total_q : params.seqlen_q;
  const std::int64_t k_rows = is_varlen ? params.total_k : params.seqlen_k;

  const auto address = reinterpret_cast<std::uintptr_t>(params.maybe_workspace);
  auto* base = reinterpret_cast<unsigned char*>((address + bwd::kWorkspaceAlignment - 1) / bwd::kWorkspaceAlignment *
                                                bwd::kWorkspaceAlignment);
  unsigned char* section = base;
  auto next = [&](std::size_t bytes) {
    unsigned char* start = section;
    section += bytes;
    return start;
  };
  // Each staged tensor: its dense scratch view, and the params fields switched to it.
  auto stage = [&](std::size_t bytes, std::int64_t rows, std::int64_t heads, const void* source, std::int64_t& batch_stride,
                   std::int64_t& row_stride, std::int64_t& head_stride, bool copy_in) {
    const staging::RowsView view = staging::dense_view(next(bytes), rows, heads, padded);
    if (copy_in) {
      const staging::RowsView src{const_cast<void*>(source), batch_stride, row_stride, head_stride};
      staging::copy_columns(src, head_dim, view, padded, batches, rows, heads, nullptr, stream);
    }
    batch_stride = is_varlen ? 0 : view.batch_stride;
    row_stride = view.row_stride;
    head_stride = view.head_stride;
    return view;
  };
  const auto q = stage(layout.q_bytes, q_rows, params.heads_q, params.q, staged.q_batch_stride, staged.q_row_stride,
                       staged.q_head_stride, true);
  const auto out = stage(layout.q_bytes, q_rows, params.heads_q, params.out, staged.out_batch_stride,
                         staged.out_row_stride, staged.out_head_stride, true);
  const auto dout = stage(layout.q_bytes, q_rows, params.heads_q, params.dout, staged.dout_batch_stride,
                          staged.dout_row_stride, staged.dout_head_stride, true);
  const auto dq = stage(layout.q_bytes, q_rows, params.heads_q, nullptr, staged.dq_batch_stride, staged.dq_row_stride,
                        staged.dq_head_stride, false);
  const auto k = stage(layout.k_bytes, k_rows, params.heads_kv, params.k, staged.k_batch_stride, staged.k_row_stride,
                       staged.k_head_stride, true);
  const auto v = stage(layout.k_bytes, k_rows, params.heads_kv, params.v, staged.v_batch_stride, staged.v_row_stride,
                       staged.v_head_stride, true);
  const auto dk = stage(layout.k_bytes, k_rows, params.heads_kv, nullptr, staged.dk_batch_stride, staged.dk_row_stride,
                        staged.dk_head_stride, false);
  const auto dv = stage(layout.k_bytes, k_rows, params.heads_kv, nullptr, staged.dv_batch_stride, staged.dv_row_stride,
                        staged.dv_head_stride, false);
  staged.q = q.data, staged.out = out.data, staged.dout = dout.data;
  staged.k = k.data, staged.v = v.data;
  staged.dq = dq.data, staged.dk = dk.data, staged.dv = dv.data;
  staged.maybe_workspace = section;
  staged.workspace_bytes = params.workspace_bytes - static_cast<std::size_t>(section - static_cast<unsigned char*>(params.maybe_workspace));
  backward(staged, stream);
  // Rows no sequence owns (varlen, past cu_seqlens[batch]) stay untouched, as unstaged.
  const std::int32_t* q_row_end = is_varlen ? params.maybe_cu_seqlens_q + params.batch : nullptr;
  const std::int32_t* k_row_end = is_varlen ? params.maybe_cu_seqlens_k + params.batch : nullptr;
  staging::copy_columns(dq, padded, {params.dq, params.dq_batch_stride, params.dq_row_stride, params.dq_head_stride},
                        head_dim, batches, q_rows, params.heads_q, q_row_end, stream);
  staging::copy_columns(dk, padded, {params.dk, params.dk_batch_stride, params.dk_row_stride, params.dk_head_stride},
                        head_dim, batches, k_rows, params.heads_kv, k_row_end, stream);
  staging::copy_columns(dv, padded, {params.dv, params.dv_batch_stride, params.dv_row_stride, params.dv_head_stride},
                        head_dim, batches, k_rows, params.heads_kv, k_row_end, stream);
}

}  // namespace

// Staged (head_dim not a multiple of 8): the staged tensors, then the padded problem's own workspace.
std::size_t backward_workspace_bytes(const BackwardParams& params) {
  if (!staging::needs_head_dim_padding(params)) return bwd::workspace_layout(params).total();
  return staged_layout(params).total() + bwd::workspace_layout(padded_params(params)).total();
}

void backward(const BackwardParams& params, void* stream_handle) {
  if (params.dtype != DType::float16 && params.dtype != DType::bfloat16)
    throw NotSupported(std::string("flashattn: cuda backward: dtype ") + dtype_name(params.dtype) +
                       " is not supported (float16, bfloat16)");
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  if (params.batch == 0 || params.heads_q == 0) return;
  if (staging::needs_head_dim_padding(params)) return backward_staged(params, stream);
  bwd::Workspace workspace = bwd::carve_workspace(params);
  const bool runs_hopper_kernel = hopper_bwd::why_unsupported(params).empty();
  // The FA2-class deterministic kernels write dQ directly: nothing to zero or convert
  // (the workspace still holds both sections, sized without knowing the GPU).
  const bool uses_dq_accum = runs_hopper_kernel || !params.deterministic;
  if (!uses_dq_accum) workspace.dq_accum = nullptr;
  if (!runs_hopper_kernel) {
    workspace.dq_semaphore = nullptr;
    workspace.maybe_tile_counter = nullptr;
  }

  bwd::launch_preprocess(params, workspace, stream);
  const bool is_aligned = bwd::allows_vector_access(params);
  if (runs_hopper_kernel) {
    hopper_bwd::backward_main(params, workspace, stream);
  } else if (params.dtype == DType::float16) {
    dispatch_head_dim<__half>(params, workspace, is_aligned, stream);
  } else {
    dispatch_head_dim<__nv_bfloat16>(params, workspace, is_aligned, stream);
  }
  if (uses_dq_accum) bwd::launch_convert_dq(params, workspace, stream);
}

}  // namespace flashattn::cuda
