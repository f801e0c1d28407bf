// src/cuda/decode/launch_decode.cuh — the host side of run_decode<T, kHeadDim>,
// included by the instantiation files only.
#pragma once

#include "flashattn/error.hpp"
#include "src/cuda/common/check.cuh"
#if defined(FLASHATTN_CUDA_DECODE_FMA)
#include "src/cuda/decode/kernel_fma.cuh"
#else
#include "src/cuda/decode/kernel_bulk.cuh"
#include "src/cuda/decode/kernel_mma.cuh"
#endif
#include "src/cuda/decode/launch_kernel.cuh"
#include "src/cuda/decode/launch.hpp"

namespace flashattn::cuda::decode {

// Launches the split-KV kernel; true if its splits were merged inside it (clusters).
template <class T, class Config, class Kernel>
bool launch_decode_config(Kernel* kernel, const KVCacheParams& params, cudaStream_t stream, bool can_merge_in_cluster) {
  const AttentionParams& a = params.attention;
  const std::int64_t query_blocks = (a.seqlen_q * a.group_size + Config::kRows - 1) / Config::kRows;
  const std::int64_t grid_x = query_blocks * params.num_splits;
  if (grid_x > 0x7fffffff || a.heads_kv > 65535 || a.batch > 65535)
    throw NotSupported("flashattn: q: too many query blocks, kv heads (> 65535) or sequences (> 65535) for one decode launch");
  FLASHATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSharedBytes));
  // All of the unified L1/shared memory as shared memory, so two CTAs of ~100 KiB fit on
  // an SM whatever carveout the driver would pick (the K/V copies bypass L1 anyway).
  FLASHATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(a.heads_kv), static_cast<unsigned>(a.batch));
  const bool is_cluster_merge = can_merge_in_cluster && params.num_splits > 1 && params.num_splits <= kMaxClusterSplits && kernel_is_sm90(kernel);
  if (is_cluster_merge) {
    // The cluster's CTAs on different SMs: a memory-bound CTA wants an SM's load bandwidth.
    FLASHATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeClusterSchedulingPolicyPreference, cudaClusterSchedulingPolicySpread));
    const cudaError_t code = launch_kernel(kernel, grid, dim3(Config::kThreads), Config::kSharedBytes, stream,
                                           static_cast<unsigned>(params.num_splits), params);
    if (code == cudaSuccess) return true;
    // No room for the cluster (a device partition too small, say): clear the launch
    // error and take the combine path, whose plain launch reports any real problem.
    (void)cudaGetLastError();
  }
  FLASHATTN_CUDA_CHECK(launch_kernel(kernel, grid, dim3(Config::kThreads), Config::kSharedBytes, stream, 1, params));
  return false;
}

template <class T, int kHeadDim>
bool run_decode(const KVCacheParams& params, cudaStream_t stream, DecodeKernel kernel) {
#if defined(FLASHATTN_CUDA_DECODE_FMA)
  (void)kernel;
  if (rows_per_cta(params.attention.seqlen_q * params.attention.group_size) == 4) {
    return launch_decode_config<T, DecodeConfig<kHeadDim, 4>>(&decode_kernel<T, DecodeConfig<kHeadDim, 4>>, params, stream, false);
  }
  return launch_decode_config<T, DecodeConfig<kHeadDim, 8>>(&decode_kernel<T, DecodeConfig<kHeadDim, 8>>, params, stream, false);
#else
  // The bulk-copy kernel where the rule picked it and this binary has sm_90 code for it
  // (a compute_80 PTX build JIT-compiled on an H100 has an empty body there).
  using BulkConfig = BulkDecodeConfig<kHeadDim>;
  if (kernel == DecodeKernel::bulk_copy && kernel_is_sm90(&bulk_decode_kernel<T, BulkConfig>))
    return launch_decode_config<T, BulkConfig>(&bulk_decode_kernel<T, BulkConfig>, params, stream, true);
  using Config = MmaDecodeConfig<kHeadDim>;
  return launch_decode_config<T, Config>(&mma_decode_kernel<T, Config>, params, stream, true);
#endif
}

}  // namespace flashattn::cuda::decode
