// src/core/fp8_quantize_params.hpp — the plain description of a quantize_fp8 call
// (flashattn/fp8.hpp), shared by the CPU and CUDA implementations.
#pragma once

#include <cstdint>

#include "flashattn/config.hpp"
#include "flashattn/tensor.hpp"

namespace flashattn {

struct QuantizeFp8Params {
  DType dtype = DType::float32;  // of x
  Device device{};
  const void* x = nullptr;
  std::uint8_t* out = nullptr;  // e4m3 codes
  float* descale = nullptr;     // written
  // A rank-3 x is one batch (batch 1, batch strides 0).
  std::int64_t batch = 0, seqlen = 0, heads = 0, head_dim = 0;
  std::int64_t heads_per_group = 1;  // heads / groups: head h belongs to group h / heads_per_group
  std::int64_t groups = 0;
  std::int64_t x_strides[3] = {0, 0, 0};    // batch, row, head
  std::int64_t out_strides[3] = {0, 0, 0};  // batch, row, head
  std::int64_t descale_strides[2] = {0, 0};  // batch, group
  bool incoherent = false;
  std::uint64_t seed = 0;

  FLASHATTN_HOST_DEVICE std::int64_t x_offset(std::int64_t b, std::int64_t row, std::int64_t h) const {
    return b * x_strides[0] + row * x_strides[1] + h * x_strides[2];
  }
  FLASHATTN_HOST_DEVICE std::int64_t out_offset(std::int64_t b, std::int64_t row, std::int64_t h) const {
    return b * out_strides[0] + row * out_strides[1] + h * out_strides[2];
  }
  FLASHATTN_HOST_DEVICE std::int64_t descale_offset(std::int64_t b, std::int64_t group) const {
    return b * descale_strides[0] + group * descale_strides[1];
  }
};

// Whether incoherent processing takes this head_dim: a power of two in [32, 256] (the
// CUDA kernel keeps one row in a warp's registers, head_dim / 32 values per lane).
inline bool is_hadamard_head_dim(std::int64_t head_dim) {
  return head_dim >= 32 && head_dim <= 256 && (head_dim & (head_dim - 1)) == 0;
}

namespace cpu {
void quantize_fp8(const QuantizeFp8Params& params);
}
namespace cuda {
void quantize_fp8(const QuantizeFp8Params& params, void* stream);  // NotSupported without CUDA
}

}  // namespace flashattn
