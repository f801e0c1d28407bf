// src/cuda/bwd/launch.hpp — host entry points of the backward kernels, one
// explicit instantiation per (dtype, head dim) in src/cuda/bwd/instantiations/.
#pragma once

#include <cuda_runtime.h>

#include "src/core/params.hpp"
#include "src/cuda/bwd/select.hpp"
#include "src/cuda/bwd/workspace.hpp"

namespace flashattn::cuda::bwd {

// The fused passes (default; FLASHATTN_CUDA_HOPPER_BWD_PASSES=separate, read once per process,
// restores the earlier kernels): the preprocess and the dQ conversion below as 16-byte-access
// kernels, the workspace zeroing inside the preprocess kernel (one launch instead of up to
// three); where head_dim % 8 == 0 and out, dout, dq allow 16-byte accesses, else the
// separate kernels. Timed on the H200 2026-11-27: backward 1k +9-29%, 4k +3-12%.
bool are_fused_passes_selected();
// D = rowsum(dO ∘ O) into workspace.dsum; workspace.dq_accum and .dq_semaphore zeroed
// where present (the FA2-class deterministic kernels use neither: pass them null).
void launch_preprocess(const BackwardParams& params, const Workspace& workspace, cudaStream_t stream);
// dQ = scale * dq_accum, converted to the dtype and strides of params.dq.
void launch_convert_dq(const BackwardParams& params, const Workspace& workspace, cudaStream_t stream);
// The dK/dV kernel (with dQ atomics) or, deterministic, dK/dV kernel + dQ kernel.
// is_aligned: every q/k/v/dout/dq/dk/dv pointer and stride allows 16-byte accesses.
// The configs are those select_kernels picks for current_device_limits(); NotSupported
// where none fits.
template <class Element, int kHeadDim>
void launch_main(const BackwardParams& params, const Workspace& workspace, bool is_aligned, cudaStream_t stream);

// The current device's limits (queried once per device), capped by the testing limit.
DeviceLimits current_device_limits();
// Tests only: caps the shared memory per block the configs are picked for (0: no cap),
// so that one GPU runs the configs of GPUs with less shared memory. Process-wide.
void set_shared_memory_limit_for_testing(int bytes);

}  // namespace flashattn::cuda::bwd
