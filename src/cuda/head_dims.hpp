// src/cuda/head_dims.hpp — the kernel head dims built into this library, per kernel
// family, and the one dispatch from a runtime kernel head dim to a compile-time one.
//
// One source of truth: the registry of head dims is src/cuda/generate_instantiations.py
// (it writes the units and kernel_registry.cmake); src/cuda/CMakeLists.txt builds the part
// of it that FLASHATTN_CUDA_HEAD_DIMS selects and writes each family's built list into
// flashattn_cuda_built_head_dims.hpp (build tree). No dispatch lists head dims itself.
// Host code.
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>

#include "flashattn_cuda_built_head_dims.hpp"

namespace flashattn::cuda {

template <int... kHeadDims>
struct HeadDimList {
  static constexpr std::array<int, sizeof...(kHeadDims)> kValues{kHeadDims...};

  static constexpr bool empty() { return sizeof...(kHeadDims) == 0; }
  static constexpr bool contains(std::int64_t head_dim) { return (false || ... || (head_dim == kHeadDims)); }
  // The smallest listed head dim >= head_dim (its kernel runs head_dim zero-padded); 0 if none.
  static constexpr int smallest_holding(std::int64_t head_dim) {
    int best = 0;
    for (int d : kValues)
      if (d >= head_dim && (best == 0 || d < best)) best = d;
    return best;
  }
  static constexpr int largest() {
    int largest = 0;
    for (int d : kValues) largest = d > largest ? d : largest;
    return largest;
  }
  // Calls f(std::integral_constant<int, d>{}) for the listed d == head_dim and returns
  // true; false (f not called) when head_dim is not listed.
  template <class F>
  static bool visit(std::int64_t head_dim, F&& f) {
    return (false || ... || (head_dim == kHeadDims && (f(std::integral_constant<int, kHeadDims>{}), true)));
  }
};

using ForwardHeadDims = HeadDimList<FLASHATTN_CUDA_FWD_HEAD_DIMS>;                // fwd/ (mma.sync)
using BackwardHeadDims = HeadDimList<FLASHATTN_CUDA_BWD_HEAD_DIMS>;               // bwd/ (mma.sync)
using HopperForwardHeadDims = HeadDimList<FLASHATTN_CUDA_HOPPER_HEAD_DIMS>;       // hopper/
using HopperFp8HeadDims = HeadDimList<FLASHATTN_CUDA_HOPPER_FP8_HEAD_DIMS>;       // hopper_fp8/
using HopperBackwardHeadDims = HeadDimList<FLASHATTN_CUDA_HOPPER_BWD_HEAD_DIMS>;  // hopper_bwd/kernel.cuh
using HopperBackwardWideHeadDims = HeadDimList<FLASHATTN_CUDA_HOPPER_BWD_WIDE_HEAD_DIMS>;  // hopper_bwd/kernel_wide.cuh
using DecodeHeadDims = HeadDimList<FLASHATTN_CUDA_DECODE_HEAD_DIMS>;              // decode/ (bf16/fp16 and FP8 caches)

}  // namespace flashattn::cuda
