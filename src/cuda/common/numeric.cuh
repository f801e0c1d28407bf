// src/cuda/common/numeric.cuh — 16-bit element types on the device: pairs packed in
// one 32-bit register (the unit of mma fragments), conversions from float.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "flashattn/tensor.hpp"
#include "src/cuda/ptx/mma_type.cuh"

namespace flashattn::cuda {

// Element traits: the storage type, its packed pair, and the float conversions.
template <class T>
struct Numeric;

template <>
struct Numeric<__half> {
  using Pair = __half2;
  static constexpr ptx::MmaInput kMmaInput = ptx::MmaInput::f16;  // its tensor-core input type
  static constexpr DType kDType = DType::float16;
  __device__ __forceinline__ static Pair pair_from_floats(float low, float high) {
    return __floats2half2_rn(low, high);
  }
  __device__ __forceinline__ static float to_float(__half x) { return __half2float(x); }
  __device__ __forceinline__ static __half from_float(float x) { return __float2half_rn(x); }
};

template <>
struct Numeric<__nv_bfloat16> {
  using Pair = __nv_bfloat162;
  static constexpr ptx::MmaInput kMmaInput = ptx::MmaInput::bf16;
  static constexpr DType kDType = DType::bfloat16;
  __device__ __forceinline__ static Pair pair_from_floats(float low, float high) {
    return __floats2bfloat162_rn(low, high);
  }
  __device__ __forceinline__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ __forceinline__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

// Two floats rounded to T and packed into one register, `low` in bits 0-15 — the
// layout of one mma A/B fragment register (the lower column in the low half).
template <class T>
__device__ __forceinline__ std::uint32_t pack_pair(float low, float high) {
  const typename Numeric<T>::Pair pair = Numeric<T>::pair_from_floats(low, high);
  return *reinterpret_cast<const std::uint32_t*>(&pair);
}

// Unpack a register holding two T into floats.
template <class T>
__device__ __forceinline__ void unpack_pair(std::uint32_t packed, float& low, float& high) {
  const T* halves = reinterpret_cast<const T*>(&packed);
  low = Numeric<T>::to_float(halves[0]);
  high = Numeric<T>::to_float(halves[1]);
}

}  // namespace flashattn::cuda
