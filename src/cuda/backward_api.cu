// src/cuda/backward_api.cu — the CUDA backward entry points: workspace layout,
// head-dim dispatch, and the order of the kernels (src/cuda/bwd/).
//
//   1. preprocess: D = rowsum(dO ∘ O), LSE in log2 units; dq_accum = 0   (bwd/pre_post.cu)
//   2. sm_90 where hopper_bwd::why_unsupported is empty: the wgmma kernels
//      (hopper_bwd/kernel.cuh: d64/d128; hopper_bwd/kernel_wide.cuh: d256; fp16/bf16,
//      TMA-encodable strides), dQ added to dq_accum by bulk reductions; deterministic:
//      the same kernels, the reductions of each query block ordered by key block
//      (semaphores in the workspace, zeroed in 1).
//      Elsewhere the FA2-class dK/dV kernel, dQ added to dq_accum (bwd/dkdv_kernel.cuh);
//      deterministic: + dQ kernel writing dQ directly, no atomics    (bwd/dq_kernel.cuh)
//   3. dQ = scale * dq_accum in the user's dtype/strides   (skipped by the FA2-class
//      deterministic path, whose dQ kernel wrote dQ)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "flashattn/error.hpp"
#include "src/core/backend.hpp"
#include "src/cuda/bwd/launch.hpp"
#include "src/cuda/bwd/workspace.hpp"
#include "src/cuda/hopper_bwd/launch.hpp"

namespace flashattn::cuda {
namespace {

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

std::size_t backward_workspace_bytes(const BackwardParams& params) { return bwd::workspace_layout(params).total(); }

void backward(const BackwardParams& params, void* stream_handle) {
  if (params.dtype != DType::float16 && params.dtype != DType::bfloat16)
    throw NotSupported(std::string("flashattn: cuda backward: dtype ") + dtype_name(params.dtype) +
                       " is not supported (float16, bfloat16)");
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  if (params.batch == 0 || params.heads_q == 0) return;
  bwd::Workspace workspace = bwd::carve_workspace(params);
  const bool runs_hopper_kernel = hopper_bwd::why_unsupported(params).empty();
  // The FA2-class deterministic kernels write dQ directly: nothing to zero or convert
  // (the workspace still holds both sections, sized without knowing the GPU).
  const bool uses_dq_accum = runs_hopper_kernel || !params.deterministic;
  if (!uses_dq_accum) workspace.dq_accum = nullptr;
  if (!runs_hopper_kernel) workspace.dq_semaphore = nullptr;

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
