// src/cuda/decode/append_combine.cu — the two small kernels around the split-KV
// kernel: the in-place append of k_new/v_new (with rotary on k) that runs first,
// and the combine that merges the splits' partial rows with online_softmax's
// merge_weights and rescale_factor — the same rules as merge_attention_states and
// the CPU path. Both are launched with PDL (launch_kernel.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "flashattn/error.hpp"
#include "flashattn/kvcache.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/core/float8.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/decode/launch_kernel.cuh"
#include "src/cuda/decode/launch.hpp"
#include "src/cuda/decode/rotary.cuh"

namespace flashattn::cuda::decode {
namespace {

// One CTA per (new row j, kv head, sequence); one thread per feature.
template <class T>
__global__ void append_kernel(const __grid_constant__ KVCacheParams params) {
  wait_for_prior_grids();  // k_new/v_new/cache_seqlens may come from the previous kernel
  allow_dependent_launch();  // the split-KV kernel waits for this grid's completion anyway
  const AttentionParams& a = params.attention;
  const std::int64_t j = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t position = params.cache_seqlen(b) + j;
  // Device-resident cache_seqlens/block_table are not checked on the host inside a CUDA
  // graph: a position past the capacity or on a page outside the pool is never written.
  if (!params.page_is_valid(b, position)) return;
  const T* k_new = static_cast<const T*>(params.maybe_k_new) + b * params.k_new_batch_stride + j * params.k_new_row_stride +
                   h * params.k_new_head_stride;
  const T* v_new = static_cast<const T*>(params.maybe_v_new) + b * params.v_new_batch_stride + j * params.v_new_row_stride +
                   h * params.v_new_head_stride;
  T* k_dst = static_cast<T*>(params.k_cache) + params.k_cache_offset(b, position, h);
  T* v_dst = static_cast<T*>(params.v_cache) + params.v_cache_offset(b, position, h);
  for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
    const bool is_rotated = params.has_rotary() && d < params.rotary_dim;
    k_dst[d] = is_rotated ? Numeric<T>::from_float(rotate_feature<T>(params, k_new, d, position)) : k_new[d];
    v_dst[d] = v_new[d];
  }
}

// The FP8-cache form of append_kernel: rows in q's dtype T quantised with the (b, h)
// descales after the rotary (rounded to T first, as a 16-bit cache would hold them: the
// CPU path's rule), or e4m3 rows (T = unsigned char) copied.
template <class T>
__global__ void append_fp8_kernel(const __grid_constant__ KVCacheParams params) {
  wait_for_prior_grids();
  allow_dependent_launch();
  const AttentionParams& a = params.attention;
  const std::int64_t j = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t position = params.cache_seqlen(b) + j;
  if (!params.page_is_valid(b, position)) return;
  const T* k_new = static_cast<const T*>(params.maybe_k_new) + b * params.k_new_batch_stride + j * params.k_new_row_stride +
                   h * params.k_new_head_stride;
  const T* v_new = static_cast<const T*>(params.maybe_v_new) + b * params.v_new_batch_stride + j * params.v_new_row_stride +
                   h * params.v_new_head_stride;
  std::uint8_t* k_dst = static_cast<std::uint8_t*>(params.k_cache) + params.k_cache_offset(b, position, h);
  std::uint8_t* v_dst = static_cast<std::uint8_t*>(params.v_cache) + params.v_cache_offset(b, position, h);
  if constexpr (std::is_same_v<T, std::uint8_t>) {
    for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) k_dst[d] = k_new[d], v_dst[d] = v_new[d];
  } else {
    const float k_descale = params.k_descale(b, h), v_descale = params.v_descale(b, h);
    for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
      const bool is_rotated = params.has_rotary() && d < params.rotary_dim;
      const float key = is_rotated ? Numeric<T>::to_float(Numeric<T>::from_float(rotate_feature<T>(params, k_new, d, position)))
                                   : Numeric<T>::to_float(k_new[d]);
      k_dst[d] = float8::quantize_e4m3(key, k_descale);
      v_dst[d] = float8::quantize_e4m3(Numeric<T>::to_float(v_new[d]), v_descale);
    }
  }
}

// Splits per lane of the combine's warp (kMaxKVCacheSplits = 128 = 32 lanes x 4).
constexpr int kCombineSplitsPerLane = (kMaxKVCacheSplits + 31) / 32;
// Small CTAs (4 warps x ~48 registers = 6K registers) fit beside two split-KV CTAs
// (2 x 27K of the SM's 64K registers), so the combine launches early (PDL) and waits
// on the SM instead of launching after the split-KV kernel's last CTA has exited.
constexpr int kCombineWarps = 4;

// One warp per output row (sequence b, head h, position i): out = sum over splits s of
// w_s o_s with w_s = e^(lse_s - lse), lse = log sum_s e^(lse_s) — the merge of the
// normalised partials. Every load is independent of the others: the LSEs are read
// in one step (lane s holds split s), the row's LSE is reduced across lanes with
// merge_weights, and the weights come from the shared rescale rule, so the warp
// waits for memory twice rather than twice per split (the chain used to cost
// ~28 us at batch 1 / 64k keys / 28 splits on the H100).
template <class T>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(const __grid_constant__ KVCacheParams params) {
  constexpr int kMaxChunksPerLane = 2;  // float4 chunks: head_dim <= 256 = 32 lanes x 2 x 4
  wait_for_prior_grids();  // the partials are the split-KV kernel's output
  allow_dependent_launch();
  const AttentionParams& a = params.attention;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kCombineWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= params.partial_rows()) return;
  const std::int64_t i = row % a.seqlen_q, h = (row / a.seqlen_q) % a.heads_q, b = row / (a.seqlen_q * a.heads_q);
  const float* partial_o = static_cast<const float*>(params.maybe_workspace);
  const float* partial_lse = partial_o + params.num_splits * params.partial_rows() * a.head_dim;
  const int num_splits = params.num_splits;

  // The row's LSE: lane-local merge of its splits, then a butterfly over the lanes
  // (merge_weights is symmetric in its arguments, so every lane ends with the same bits).
  float split_lse[kCombineSplitsPerLane];
  float lse = online_softmax::negative_infinity<float>();
#pragma unroll
  for (int k = 0; k < kCombineSplitsPerLane; ++k) {
    const int split = lane + 32 * k;
    split_lse[k] = split < num_splits ? partial_lse[params.partial_row(split, b, h, i)] : online_softmax::negative_infinity<float>();
    lse = online_softmax::merge_weights(lse, split_lse[k]).lse;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    lse = online_softmax::merge_weights(lse, __shfl_xor_sync(0xffffffffu, lse, offset)).lse;
  // Weight of each split: its LSE rescaled to the row's (0 for an empty split or row).
  const float lse_log2 = lse * static_cast<float>(online_softmax::kLog2e);
  float split_weight[kCombineSplitsPerLane];
#pragma unroll
  for (int k = 0; k < kCombineSplitsPerLane; ++k)
    split_weight[k] = online_softmax::rescale_factor(split_lse[k] * static_cast<float>(online_softmax::kLog2e), lse_log2);

  // out = sum_s w_s o_s, four features per lane per chunk (head_dim is a multiple of 8).
  float4 acc[kMaxChunksPerLane];
#pragma unroll
  for (int c = 0; c < kMaxChunksPerLane; ++c) acc[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int split = 0; split < num_splits; ++split) {
    float weight = 0.0f;
#pragma unroll
    for (int k = 0; k < kCombineSplitsPerLane; ++k) {
      const float w = __shfl_sync(0xffffffffu, split_weight[k], split % 32);
      if (split / 32 == k) weight = w;
    }
    const float4* o = reinterpret_cast<const float4*>(partial_o + params.partial_row(split, b, h, i) * a.head_dim);
#pragma unroll
    for (int c = 0; c < kMaxChunksPerLane; ++c) {
      const int d = 4 * (lane + 32 * c);
      if (d < a.head_dim) {
        const float4 x = o[d / 4];
        acc[c].x += weight * x.x, acc[c].y += weight * x.y, acc[c].z += weight * x.z, acc[c].w += weight * x.w;
      }
    }
  }
  T* out = static_cast<T*>(a.out) + a.out_offset(b, h) + i * a.out_row_stride;
#pragma unroll
  for (int c = 0; c < kMaxChunksPerLane; ++c) {
    const int d = 4 * (lane + 32 * c);
    if (d < a.head_dim) {
      out[d] = Numeric<T>::from_float(acc[c].x);
      out[d + 1] = Numeric<T>::from_float(acc[c].y);
      out[d + 2] = Numeric<T>::from_float(acc[c].z);
      out[d + 3] = Numeric<T>::from_float(acc[c].w);
    }
  }
  if (lane == 0 && a.maybe_lse) a.maybe_lse[a.lse_offset(b, h) + i * a.lse_row_stride] = lse;
}

// kernel: append_kernel<T>, or append_fp8_kernel<T> for an FP8 cache.
template <class Kernel>
void launch_append(Kernel* kernel, const KVCacheParams& p, cudaStream_t stream) {
  const AttentionParams& a = p.attention;
  if (p.seqlen_new > 0x7fffffff || a.heads_kv > 65535 || a.batch > 65535)
    throw NotSupported("flashattn: k: too many new rows, kv heads or sequences for one append launch");
  const dim3 grid(static_cast<unsigned>(p.seqlen_new), static_cast<unsigned>(a.heads_kv), static_cast<unsigned>(a.batch));
  const dim3 block(static_cast<unsigned>(a.head_dim < 256 ? a.head_dim : 256));
  FLASHATTN_CUDA_CHECK(launch_kernel(kernel, grid, block, 0, stream, 1, p));
}

template <class T>
void launch_combine(const KVCacheParams& p, cudaStream_t stream) {
  const std::int64_t blocks = (p.partial_rows() + kCombineWarps - 1) / kCombineWarps;
  if (blocks > 0x7fffffff) throw NotSupported("flashattn: out: too many rows for one combine launch");
  FLASHATTN_CUDA_CHECK(launch_kernel(&combine_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kCombineWarps * 32), 0, stream, 1, p));
}

}  // namespace

void run_append(const KVCacheParams& params, cudaStream_t stream) {
  if (params.seqlen_new == 0 || params.attention.batch == 0) return;
  if (params.is_fp8_cache()) {
    if (params.new_dtype == DType::float8_e4m3) return launch_append(&append_fp8_kernel<std::uint8_t>, params, stream);
    if (params.attention.dtype == DType::bfloat16) return launch_append(&append_fp8_kernel<__nv_bfloat16>, params, stream);
    return launch_append(&append_fp8_kernel<__half>, params, stream);
  }
  if (params.attention.dtype == DType::bfloat16) return launch_append(&append_kernel<__nv_bfloat16>, params, stream);
  return launch_append(&append_kernel<__half>, params, stream);
}

void run_combine(const KVCacheParams& params, cudaStream_t stream) {
  if (params.partial_rows() == 0) return;
  if (params.attention.dtype == DType::bfloat16) return launch_combine<__nv_bfloat16>(params, stream);
  return launch_combine<__half>(params, stream);
}

}  // namespace flashattn::cuda::decode
