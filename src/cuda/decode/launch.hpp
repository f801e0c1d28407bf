// src/cuda/decode/launch.hpp — entry points of the decode kernels. The split-KV
// kernel has one explicit instantiation per (dtype, kernel head dim) in
// instantiations/ (both row counts in each); append and combine live in
// append_combine.cu. Including this header compiles no kernel.
#pragma once

#include <cuda_runtime.h>

#include "src/core/kvcache_params.hpp"
#include "src/cuda/decode/kernel_choice.hpp"
#include "src/cuda/hopper/launch.hpp"

namespace flashattn::cuda::decode {

// The split-KV kernels and the rule that picks one: kernel_choice.hpp.

#if defined(FLASHATTN_CUDA_DECODE_FMA)
// CUDA-core kernel (kernel_fma.cuh). Query rows packed per CTA: the whole GQA group of
// one position when it fits in 4, else 8 (more rows re-read K/V once per query block).
inline int rows_per_cta(std::int64_t packed_rows) { return packed_rows <= 4 ? 4 : 8; }
// Keys per tile of the kernel for a kernel head dim (DecodeConfig::kTileN).
inline int tile_keys(int kernel_head_dim) { return (128 / (kernel_head_dim / 8)) * 4; }
// CTAs resident per SM (160-254 registers x 128 threads, 64 KiB shared memory).
inline int ctas_per_sm(int) { return 2; }
#else
// Tensor-core kernel (kernel_mma.cuh): 16 packed rows (one mma M tile), 64-key tiles
// (MmaDecodeConfig::kRows, kTileN).
inline int rows_per_cta(std::int64_t) { return 16; }
inline int tile_keys(int) { return 64; }
#endif

// Whether the TMA kernel's tensor maps can describe this call's caches (the kernel
// also needs sm_90 code on the device: launch_decode.cuh checks the loaded kernel): no
// cache_batch_idx, strides a tensor map encodes, coordinates in int32.
inline bool tma_maps_can_describe(const KVCacheParams& params) {
  const AttentionParams& a = params.attention;
  if (params.maybe_cache_batch_idx != nullptr) return false;
  const std::int64_t rows = params.is_paged() ? params.page_size : params.capacity;
  const std::int64_t groups = params.is_paged() ? params.num_blocks : a.batch;
  return hopper::is_tma_encodable_stride(a.k_row_stride, rows) && hopper::is_tma_encodable_stride(a.k_head_stride, a.heads_kv) &&
         hopper::is_tma_encodable_stride(a.k_batch_stride, groups) && hopper::is_tma_encodable_stride(a.v_row_stride, rows) &&
         hopper::is_tma_encodable_stride(a.v_head_stride, a.heads_kv) && hopper::is_tma_encodable_stride(a.v_batch_stride, groups) &&
         groups < 0x7fffffff;
}

// The split-KV kernel (`choice.kernel`, or the cp.async kernel where the TMA one cannot
// run the call): writes out/LSE (one split, or
// splits merged inside the kernel by thread-block clusters: returns true) or the
// workspace partials (returns false: run_combine must follow).
template <class T, int kHeadDim>
bool run_decode(const KVCacheParams& params, cudaStream_t stream, DecodeKernelChoice choice);

// The split-KV kernel over an FP8 (e4m3) cache (kernel_mma_fp8.cuh; T = q's dtype), any
// sm_80+ GPU; returns like run_decode. Instantiations: instantiations/decode_fp8_*.cu.
template <class T, int kHeadDim>
bool run_decode_fp8(const KVCacheParams& params, cudaStream_t stream);
// Its geometry for the split heuristic (MmaFp8DecodeConfig): 16 packed rows, 64-key
// tiles, two CTAs per SM up to d128.
inline constexpr int kFp8RowsPerCta = 16;
inline constexpr int kFp8TileKeys = 64;
constexpr int fp8_ctas_per_sm(int kernel_head_dim) { return kernel_head_dim <= 128 ? 2 : 1; }

// Writes k_new/v_new (k rotated) into the cache at positions cache_seqlen(b) + j; an FP8
// cache receives them quantised (float8::quantize_e4m3 with the descales), or copied
// when they are e4m3 already.
void run_append(const KVCacheParams& params, cudaStream_t stream);

// Merges the num_splits partial rows of the workspace into out/LSE.
void run_combine(const KVCacheParams& params, cudaStream_t stream);

}  // namespace flashattn::cuda::decode
