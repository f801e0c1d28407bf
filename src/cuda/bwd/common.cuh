// src/cuda/bwd/common.cuh — small device helpers shared by the backward kernels.
#pragma once

#include <cstdint>

#include "src/core/params.hpp"
#include "src/cuda/common/numeric.cuh"

namespace flashattn::cuda::bwd {

// Row of query i of sequence b in the packed dQ accumulator (dense_q_row of the reference).
__host__ __device__ inline std::int64_t packed_q_row(const BackwardParams& params, std::int64_t b, std::int64_t i) {
  return params.is_varlen() ? params.q_start(b) + i : b * params.seqlen_q + i;
}

// Writes a warp's (16, 8*kTiles) fp32 fragment tile at (row0, col0), times `scale`,
// to a strided global tensor of Element; rows < rows_valid, columns < head_dim.
template <class Element, int kTiles>
__device__ __forceinline__ void store_fragment_tile(const float (&acc)[kTiles][4], float scale, Element* gmem,
                                                    std::int64_t row_stride, int row0, int col0,
                                                    std::int64_t rows_valid, int head_dim, bool is_aligned,
                                                    int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    if (row >= rows_valid) continue;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int col = col0 + 8 * j + 2 * t;
      if (col >= head_dim) continue;
      const float x = acc[j][2 * half] * scale, y = acc[j][2 * half + 1] * scale;
      Element* destination = gmem + row * row_stride + col;
      if (is_aligned) {
        *reinterpret_cast<std::uint32_t*>(destination) = pack_pair<Element>(x, y);
      } else {
        destination[0] = Numeric<Element>::from_float(x);
        destination[1] = Numeric<Element>::from_float(y);
      }
    }
  }
}

}  // namespace flashattn::cuda::bwd
