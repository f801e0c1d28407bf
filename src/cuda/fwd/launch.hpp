// src/cuda/fwd/launch.hpp — the forward kernels' entry points, one explicit
// instantiation per (dtype, kernel head dim) in src/cuda/instantiations/ (generated
// by src/cuda/generate_instantiations.py). Including this header compiles no kernel.
#pragma once

#include <cuda_runtime.h>

#include "src/core/params.hpp"

namespace flashattn::cuda::fwd {

template <class T, int kHeadDim>
void run_forward(const AttentionParams& params, cudaStream_t stream);

}  // namespace flashattn::cuda::fwd
