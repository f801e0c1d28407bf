// src/cuda/decode/launch_decode.cuh — the host side of run_decode<T, kHeadDim>,
// included by the instantiation files only.
#pragma once

#include "flashattn/error.hpp"
#include "src/cuda/common/check.cuh"
#if defined(FLASHATTN_CUDA_DECODE_FMA)
#include "src/cuda/decode/kernel_fma.cuh"
#else
#include "src/cuda/decode/kernel_mma.cuh"
#endif
#include "src/cuda/decode/grid_dependency.cuh"
#include "src/cuda/decode/launch.hpp"

namespace flashattn::cuda::decode {

template <class T, class Config, class Kernel>
void launch_decode_config(Kernel* kernel, const KVCacheParams& params, cudaStream_t stream) {
  const AttentionParams& a = params.attention;
  const std::int64_t query_blocks = (a.seqlen_q * a.group_size + Config::kRows - 1) / Config::kRows;
  const std::int64_t grid_x = query_blocks * params.num_splits;
  if (grid_x > 0x7fffffff || a.heads_kv > 65535 || a.batch > 65535)
    throw NotSupported("flashattn: q: too many query blocks, kv heads (> 65535) or sequences (> 65535) for one decode launch");
  FLASHATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSharedBytes));
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(a.heads_kv), static_cast<unsigned>(a.batch));
  FLASHATTN_CUDA_CHECK(launch_with_pdl(kernel, grid, dim3(Config::kThreads), Config::kSharedBytes, stream, params));
}

template <class T, int kHeadDim>
void run_decode(const KVCacheParams& params, cudaStream_t stream) {
#if defined(FLASHATTN_CUDA_DECODE_FMA)
  if (rows_per_cta(params.attention.seqlen_q * params.attention.group_size) == 4) {
    launch_decode_config<T, DecodeConfig<kHeadDim, 4>>(&decode_kernel<T, DecodeConfig<kHeadDim, 4>>, params, stream);
  } else {
    launch_decode_config<T, DecodeConfig<kHeadDim, 8>>(&decode_kernel<T, DecodeConfig<kHeadDim, 8>>, params, stream);
  }
#else
  using Config = MmaDecodeConfig<kHeadDim>;
  launch_decode_config<T, Config>(&mma_decode_kernel<T, Config>, params, stream);
#endif
}

}  // namespace flashattn::cuda::decode
