// bench/gpu/ladder/element.cuh — the 16-bit storage types of the ladder kernels and
// their float conversions (the ladder computes in float32 everywhere).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>

#include "flashattn/tensor.hpp"

namespace ladder {

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class Element>
__device__ __forceinline__ Element from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

inline cudaDataType_t cublas_type(flashattn::DType dtype) {
  switch (dtype) {
    case flashattn::DType::float16: return CUDA_R_16F;
    case flashattn::DType::bfloat16: return CUDA_R_16BF;
    default: throw std::invalid_argument("ladder: only float16 and bfloat16 inputs");
  }
}

// Calls fn(Element{}) with the CUDA type of a 16-bit dtype.
template <class Fn>
void dispatch_element(flashattn::DType dtype, Fn&& fn) {
  switch (dtype) {
    case flashattn::DType::float16: fn(__half{}); return;
    case flashattn::DType::bfloat16: fn(__nv_bfloat16{}); return;
    default: throw std::invalid_argument("ladder: only float16 and bfloat16 inputs");
  }
}

}  // namespace ladder
