// src/cuda/bwd/launch.hpp — host entry points of the backward kernels, one
// explicit instantiation per (dtype, head dim) in src/cuda/bwd/instantiations/.
#pragma once

#include <cuda_runtime.h>

#include "src/core/params.hpp"
#include "src/cuda/bwd/workspace.hpp"

namespace flashattn::cuda::bwd {

// D = rowsum(dO ∘ O) into workspace.dsum (and dq_accum zeroed unless deterministic).
void launch_preprocess(const BackwardParams& params, const Workspace& workspace, cudaStream_t stream);
// dQ = scale * dq_accum, converted to the dtype and strides of params.dq.
void launch_convert_dq(const BackwardParams& params, const Workspace& workspace, cudaStream_t stream);
// The dK/dV kernel (with dQ atomics) or, deterministic, dK/dV kernel + dQ kernel.
// is_aligned: every q/k/v/dout/dq/dk/dv pointer and stride allows 16-byte accesses.
template <class Element, int kHeadDim>
void launch_main(const BackwardParams& params, const Workspace& workspace, bool is_aligned, cudaStream_t stream);

}  // namespace flashattn::cuda::bwd
