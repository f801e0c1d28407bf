// src/cuda/decode/launch.hpp — entry points of the decode kernels. The split-KV
// kernel has one explicit instantiation per (dtype, kernel head dim) in
// instantiations/ (both row counts in each); append and combine live in
// append_combine.cu. Including this header compiles no kernel.
#pragma once

#include <cuda_runtime.h>

#include "src/core/kvcache_params.hpp"
#include "src/cuda/decode/kernel_choice.hpp"

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
// CTAs resident per SM: shared memory (MmaDecodeConfig::kSharedBytes, 100 KiB at d128,
// 136 KiB at d256) allows 2 for head dims <= 128, 1 above.
inline int ctas_per_sm(int kernel_head_dim) { return kernel_head_dim <= 128 ? 2 : 1; }
#endif

// The split-KV kernel (`choice.kernel`, or the cp.async kernel where the TMA one cannot
// run the call): writes out/LSE (one split, or
// splits merged inside the kernel by thread-block clusters: returns true) or the
// workspace partials (returns false: run_combine must follow).
template <class T, int kHeadDim>
bool run_decode(const KVCacheParams& params, cudaStream_t stream, DecodeKernelChoice choice);

// Writes k_new/v_new (k rotated) into the cache at positions cache_seqlen(b) + j.
void run_append(const KVCacheParams& params, cudaStream_t stream);

// Merges the num_splits partial rows of the workspace into out/LSE.
void run_combine(const KVCacheParams& params, cudaStream_t stream);

}  // namespace flashattn::cuda::decode
