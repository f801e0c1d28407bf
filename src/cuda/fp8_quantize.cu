// src/cuda/fp8_quantize.cu — quantize_fp8 (flashattn/fp8.hpp) for CUDA tensors.
//
// One warp per row of head_dim values. With incoherent processing the row lives in
// registers, head_dim / 32 consecutive values per lane, and the fast Walsh–Hadamard
// transform runs in place: butterflies of stride < head_dim / 32 within a lane, wider
// ones across lanes with __shfl_xor_sync. Four launches on the stream:
//   1. zero the amax of every (batch, group) (kept in the descale tensor itself),
//   2. amax: each block owns a chunk of one (batch, group)'s rows; each warp keeps a
//      running max and adds it with one atomicMax (non-negative floats order like
//      their bit patterns, so the unsigned compare is the float compare),
//   3. quantise: each row rotated again, divided by amax / 448, rounded to e4m3,
//   4. descale = amax / 448 (1 where amax is 0).
// The arithmetic is src/cpu/fp8_quantize.cpp's operation for operation (same butterfly
// order and operands, IEEE division, no contraction: there is no multiply-add), and
// the e4m3 rounding is numeric.hpp's, so CPU and GPU give the same bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "flashattn/error.hpp"
#include "flashattn/fp8.hpp"
#include "src/core/fp8_quantize_params.hpp"
#include "src/cuda/common/call_guards.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/common/numeric.cuh"

namespace flashattn::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 8;
constexpr std::int64_t kRowsPerBlock = 256;  // rows of one (batch, group) per block

template <class T>
__device__ __forceinline__ float load_float(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return *p;
  } else {
    return Numeric<T>::to_float(*p);
  }
}

// numeric::float_to_float8_e4m3 (PyTorch's rounding), in device arithmetic.
__device__ __forceinline__ std::uint8_t float_to_e4m3(float x) {
  const std::uint32_t u = __float_as_uint(x);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x43e80001u) return static_cast<std::uint8_t>(sign | 0x7fu);  // NaN, Inf, > 464
  if (abs < 0x3c800000u)  // subnormal: units of 2^-9, rounded to nearest even
    return static_cast<std::uint8_t>(sign | static_cast<std::uint32_t>(rintf(__uint_as_float(abs) * 512.0f)));
  const std::uint32_t rebased = abs - (120u << 23);
  const std::uint32_t rounding = 0x7ffffu + ((rebased >> 20) & 1u);
  return static_cast<std::uint8_t>(sign | ((rebased + rounding) >> 20));
}

// The block's (batch, group) and its chunk of that group's rows: row r of a group is
// (row i = r / heads_per_group, head h = first head + r % heads_per_group).
struct BlockRows {
  std::int64_t b, group, begin, end;
};
__device__ __forceinline__ BlockRows block_rows(const QuantizeFp8Params& p) {
  const std::int64_t rows = p.seqlen * p.heads_per_group;
  const std::int64_t chunks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const std::int64_t block = blockIdx.x;
  const std::int64_t batch_group = block / chunks, chunk = block % chunks;
  const std::int64_t begin = chunk * kRowsPerBlock;
  return {batch_group / p.groups, batch_group % p.groups, begin, begin + kRowsPerBlock < rows ? begin + kRowsPerBlock : rows};
}

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Row (b, i, h) in registers: value e of this lane is element lane * kPerLane + e, as
// float32, rotated (y = x H diag(s) / sqrt(d)) when the params ask. kPerLane = 0: the
// plain path for any head_dim (values d = lane, lane + 32, ... handled by the caller).
template <class T, int kPerLane>
__device__ __forceinline__ void load_rotated_row(const QuantizeFp8Params& p, std::int64_t b, std::int64_t i, std::int64_t h,
                                                 float inverse_sqrt, float (&row)[kPerLane]) {
  const int lane = threadIdx.x % kWarpSize;
  const T* x = static_cast<const T*>(p.x) + p.x_offset(b, i, h) + lane * kPerLane;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) row[e] = load_float(x + e);
  // Butterflies within a lane: element j and j + half, half < kPerLane.
#pragma unroll
  for (int half = 1; half < kPerLane; half *= 2)
#pragma unroll
    for (int e = 0; e < kPerLane; ++e)
      if ((e & half) == 0) {
        const float a = row[e], c = row[e + half];
        row[e] = a + c;
        row[e + half] = a - c;
      }
  // Across lanes: element j's partner j ^ half lives in lane ^ (half / kPerLane), same e.
  // The lower element of the pair becomes lower + upper, the upper one lower - upper.
#pragma unroll
  for (int lane_mask = 1; lane_mask < kWarpSize; lane_mask *= 2) {
    const bool is_upper = (lane & lane_mask) != 0;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const float partner = __shfl_xor_sync(0xffffffffu, row[e], lane_mask);
      row[e] = is_upper ? partner - row[e] : row[e] + partner;
    }
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) row[e] = row[e] * inverse_sqrt * hadamard_sign(p.seed, lane * kPerLane + e);
}

// Pass 2 (kIsQuantise false): amax. Pass 3 (true): codes. Incoherent rows, head_dim =
// 32 * kPerLane.
template <class T, int kPerLane, bool kIsQuantise>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarpSize) rotated_rows_kernel(const __grid_constant__ QuantizeFp8Params p,
                                                                                  float inverse_sqrt) {
  const BlockRows rows = block_rows(p);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  auto* amax_bits = reinterpret_cast<unsigned int*>(p.descale + p.descale_offset(rows.b, rows.group));
  const float scale_amax = kIsQuantise ? __uint_as_float(*amax_bits) : 0.0f;
  const float descale = scale_amax > 0.0f ? __fdiv_rn(scale_amax, kFloat8E4M3Max) : 1.0f;
  float amax = 0.0f;
  for (std::int64_t r = rows.begin + warp; r < rows.end; r += kWarpsPerBlock) {
    const std::int64_t i = r / p.heads_per_group, h = rows.group * p.heads_per_group + r % p.heads_per_group;
    float row[kPerLane];
    load_rotated_row<T, kPerLane>(p, rows.b, i, h, inverse_sqrt, row);
    if constexpr (kIsQuantise) {
      std::uint8_t* codes = p.out + p.out_offset(rows.b, i, h) + lane * kPerLane;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) codes[e] = float_to_e4m3(__fdiv_rn(row[e], descale));
    } else {
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) amax = fmaxf(amax, fabsf(row[e]));
    }
  }
  if constexpr (!kIsQuantise) {
    amax = warp_max(amax);
    if (lane == 0 && amax > 0.0f) atomicMax(amax_bits, __float_as_uint(amax));
  }
}

// The same passes without rotation, for any head_dim.
template <class T, bool kIsQuantise>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarpSize) plain_rows_kernel(const __grid_constant__ QuantizeFp8Params p) {
  const BlockRows rows = block_rows(p);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  auto* amax_bits = reinterpret_cast<unsigned int*>(p.descale + p.descale_offset(rows.b, rows.group));
  const float scale_amax = kIsQuantise ? __uint_as_float(*amax_bits) : 0.0f;
  const float descale = scale_amax > 0.0f ? __fdiv_rn(scale_amax, kFloat8E4M3Max) : 1.0f;
  float amax = 0.0f;
  for (std::int64_t r = rows.begin + warp; r < rows.end; r += kWarpsPerBlock) {
    const std::int64_t i = r / p.heads_per_group, h = rows.group * p.heads_per_group + r % p.heads_per_group;
    const T* x = static_cast<const T*>(p.x) + p.x_offset(rows.b, i, h);
    std::uint8_t* codes = p.out + p.out_offset(rows.b, i, h);
    for (std::int64_t d = lane; d < p.head_dim; d += kWarpSize) {
      const float value = load_float(x + d);
      if constexpr (kIsQuantise) {
        codes[d] = float_to_e4m3(__fdiv_rn(value, descale));
      } else {
        amax = fmaxf(amax, fabsf(value));
      }
    }
  }
  if constexpr (!kIsQuantise) {
    amax = warp_max(amax);
    if (lane == 0 && amax > 0.0f) atomicMax(amax_bits, __float_as_uint(amax));
  }
}

// Passes 1 and 4: one thread per (batch, group).
__global__ void zero_amax_kernel(const __grid_constant__ QuantizeFp8Params p) {
  const std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index < p.batch * p.groups) p.descale[p.descale_offset(index / p.groups, index % p.groups)] = 0.0f;
}
__global__ void finish_descale_kernel(const __grid_constant__ QuantizeFp8Params p) {
  const std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= p.batch * p.groups) return;
  float& descale = p.descale[p.descale_offset(index / p.groups, index % p.groups)];
  descale = descale > 0.0f ? __fdiv_rn(descale, kFloat8E4M3Max) : 1.0f;
}

template <class T>
void launch_rows(const QuantizeFp8Params& p, std::int64_t blocks, cudaStream_t stream) {
  constexpr int kThreads = kWarpsPerBlock * kWarpSize;
  const auto grid = static_cast<unsigned>(blocks);
  if (!p.incoherent) {
    plain_rows_kernel<T, false><<<grid, kThreads, 0, stream>>>(p);
    FLASHATTN_CUDA_CHECK_LAUNCH();
    plain_rows_kernel<T, true><<<grid, kThreads, 0, stream>>>(p);
    FLASHATTN_CUDA_CHECK_LAUNCH();
    return;
  }
  // The CPU's expression, so both multiply by the same float.
  const float inverse_sqrt = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  auto run = [&](auto per_lane) {
    constexpr int kPerLane = decltype(per_lane)::value;
    rotated_rows_kernel<T, kPerLane, false><<<grid, kThreads, 0, stream>>>(p, inverse_sqrt);
    FLASHATTN_CUDA_CHECK_LAUNCH();
    rotated_rows_kernel<T, kPerLane, true><<<grid, kThreads, 0, stream>>>(p, inverse_sqrt);
    FLASHATTN_CUDA_CHECK_LAUNCH();
  };
  switch (p.head_dim) {
    case 32: return run(std::integral_constant<int, 1>{});
    case 64: return run(std::integral_constant<int, 2>{});
    case 128: return run(std::integral_constant<int, 4>{});
    case 256: return run(std::integral_constant<int, 8>{});
    default:
      throw NotSupported("flashattn: x: head_dim must be a power of two in [32, 256] for incoherent processing, got " +
                         std::to_string(p.head_dim));
  }
}

}  // namespace

void quantize_fp8(const QuantizeFp8Params& p, void* stream_handle) {
  const std::int64_t groups = p.batch * p.groups;
  if (groups == 0) return;
  const DeviceGuard device_guard(p.device.index);
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  constexpr int kThreads = 256;
  const std::int64_t group_blocks = (groups + kThreads - 1) / kThreads;
  const std::int64_t rows = p.seqlen * p.heads_per_group;
  const std::int64_t row_blocks = groups * ((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  if (group_blocks > 0x7fffffff || row_blocks > 0x7fffffff) throw NotSupported("flashattn: x: too many rows for one quantize_fp8 launch");
  zero_amax_kernel<<<static_cast<unsigned>(group_blocks), kThreads, 0, stream>>>(p);
  FLASHATTN_CUDA_CHECK_LAUNCH();
  if (row_blocks > 0) {
    switch (p.dtype) {
      case DType::float32: launch_rows<float>(p, row_blocks, stream); break;
      case DType::float16: launch_rows<__half>(p, row_blocks, stream); break;
      case DType::bfloat16: launch_rows<__nv_bfloat16>(p, row_blocks, stream); break;
      default: throw NotSupported(std::string("flashattn: x: quantize_fp8 takes float32, float16 or bfloat16, got ") + dtype_name(p.dtype));
    }
  }
  finish_descale_kernel<<<static_cast<unsigned>(group_blocks), kThreads, 0, stream>>>(p);
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda
