// src/cuda/decode/append_combine.cu — the two small kernels around the split-KV
// kernel: the in-place append of k_new/v_new (with rotary on k) that runs first,
// and the combine that merges the splits' partial rows with online_softmax's
// merge_weights — the same rule as merge_attention_states and the CPU path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "flashattn/error.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/decode/launch.hpp"
#include "src/cuda/decode/rotary.cuh"

namespace flashattn::cuda::decode {
namespace {

// One CTA per (new row j, kv head, sequence); one thread per feature.
template <class T>
__global__ void append_kernel(const __grid_constant__ KVCacheParams params) {
  const AttentionParams& a = params.attention;
  const std::int64_t j = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t position = params.cache_seqlen(b) + j;
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

// One warp per output row (sequence b, head h, position i): out = merge of the
// num_splits normalised partials, pairwise with merge_weights.
template <class T>
__global__ void combine_kernel(const __grid_constant__ KVCacheParams params) {
  constexpr int kMaxPerLane = 8;  // head_dim <= 256 = 32 lanes x 8
  const AttentionParams& a = params.attention;
  const std::int64_t row = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= params.partial_rows()) return;
  const std::int64_t i = row % a.seqlen_q, h = (row / a.seqlen_q) % a.heads_q, b = row / (a.seqlen_q * a.heads_q);
  const float* partial_o = static_cast<const float*>(params.maybe_workspace);
  const float* partial_lse = partial_o + params.num_splits * params.partial_rows() * a.head_dim;
  float acc[kMaxPerLane];
  float lse = online_softmax::negative_infinity<float>();
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) acc[k] = 0.0f;
  for (int split = 0; split < params.num_splits; ++split) {
    const std::int64_t part = params.partial_row(split, b, h, i);
    const auto w = online_softmax::merge_weights(lse, partial_lse[part]);
    if (w.weight_b > 0.0f) {  // an empty split (weight 0) contributes nothing
#pragma unroll
      for (int k = 0; k < kMaxPerLane; ++k) {
        const int d = lane + 32 * k;
        if (d < a.head_dim) acc[k] = (w.weight_a > 0.0f ? w.weight_a * acc[k] : 0.0f) + w.weight_b * partial_o[part * a.head_dim + d];
      }
    }
    lse = w.lse;
  }
  T* out = static_cast<T*>(a.out) + a.out_offset(b, h) + i * a.out_row_stride;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int d = lane + 32 * k;
    if (d < a.head_dim) out[d] = Numeric<T>::from_float(acc[k]);
  }
  if (lane == 0 && a.maybe_lse) a.maybe_lse[a.lse_offset(b, h) + i * a.lse_row_stride] = lse;
}

template <class T>
void launch_append(const KVCacheParams& p, cudaStream_t stream) {
  const AttentionParams& a = p.attention;
  if (p.seqlen_new > 0x7fffffff || a.heads_kv > 65535 || a.batch > 65535)
    throw NotSupported("flashattn: k: too many new rows, kv heads or sequences for one append launch");
  const dim3 grid(static_cast<unsigned>(p.seqlen_new), static_cast<unsigned>(a.heads_kv), static_cast<unsigned>(a.batch));
  append_kernel<T><<<grid, static_cast<unsigned>(a.head_dim < 256 ? a.head_dim : 256), 0, stream>>>(p);
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_combine(const KVCacheParams& p, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const std::int64_t blocks = (p.partial_rows() * 32 + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) throw NotSupported("flashattn: out: too many rows for one combine launch");
  combine_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void run_append(const KVCacheParams& params, cudaStream_t stream) {
  if (params.seqlen_new == 0 || params.attention.batch == 0) return;
  if (params.attention.dtype == DType::bfloat16) return launch_append<__nv_bfloat16>(params, stream);
  return launch_append<__half>(params, stream);
}

void run_combine(const KVCacheParams& params, cudaStream_t stream) {
  if (params.partial_rows() == 0) return;
  if (params.attention.dtype == DType::bfloat16) return launch_combine<__nv_bfloat16>(params, stream);
  return launch_combine<__half>(params, stream);
}

}  // namespace flashattn::cuda::decode
