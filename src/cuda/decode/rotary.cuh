// src/cuda/decode/rotary.cuh — the rotary embedding of one feature, as flash_attn
// applies it to q and to the appended keys (see flashattn/kvcache.hpp):
//   pair (x1, x2) at angle (cos, sin)[position][t]:  x1' = x1 cos - x2 sin,  x2' = x1 sin + x2 cos
//   interleaved (GPT-J):     x1 = x[2t],  x2 = x[2t + 1]
//   not interleaved (NeoX):  x1 = x[t],   x2 = x[t + rotary_dim / 2]
// One feature per call (it reads its partner itself), so any thread layout can use it.
#pragma once

#include <cstdint>

#include "src/core/kvcache_params.hpp"
#include "src/cuda/common/numeric.cuh"

namespace flashattn::cuda::decode {

// Feature d (< rotary_dim) of `row` rotated to `position`, in float.
template <class T>
__device__ __forceinline__ float rotate_feature(const KVCacheParams& p, const T* row, int d, std::int64_t position) {
  const int half = static_cast<int>(p.rotary_dim / 2);
  bool is_first;
  int t, partner;
  if (p.is_rotary_interleaved) {
    is_first = (d % 2) == 0;
    t = d / 2;
    partner = d ^ 1;
  } else {
    is_first = d < half;
    t = is_first ? d : d - half;
    partner = is_first ? d + half : d - half;
  }
  const float c = Numeric<T>::to_float(static_cast<const T*>(p.maybe_rotary_cos)[position * p.rotary_cos_row_stride + t]);
  const float s = Numeric<T>::to_float(static_cast<const T*>(p.maybe_rotary_sin)[position * p.rotary_sin_row_stride + t]);
  const float x = Numeric<T>::to_float(row[d]);
  const float y = Numeric<T>::to_float(row[partner]);
  return is_first ? x * c - y * s : y * s + x * c;
}

}  // namespace flashattn::cuda::decode
