// src/cuda/decode/launch_decode.cuh — the host side of run_decode<T, kHeadDim>,
// included by the instantiation files only.
#pragma once

#include <cstdlib>

#include "flashattn/error.hpp"
#include "src/cuda/common/alibi_path.hpp"
#include "src/cuda/common/check.cuh"
#if defined(FLASHATTN_CUDA_DECODE_FMA)
#include "src/cuda/decode/kernel_fma.cuh"
#else
#include "src/cuda/decode/kernel_mma.cuh"
#include "src/cuda/decode/kernel_tma.cuh"
#include "src/cuda/hopper/launch.hpp"
#endif
#include "src/cuda/decode/launch_kernel.cuh"
#include "src/cuda/decode/launch.hpp"

namespace flashattn::cuda::decode {

// Launches the split-KV kernel; true if its splits were merged inside it (clusters).
template <class T, class Config, class Kernel, class... Extra>
bool launch_decode_config(Kernel* kernel, const KVCacheParams& params, cudaStream_t stream, bool can_merge_in_cluster,
                          const Extra&... extra) {
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
                                           static_cast<unsigned>(params.num_splits), params, extra...);
    if (code == cudaSuccess) return true;
    // No room for the cluster (a device partition too small, say): clear the launch
    // error and take the combine path, whose plain launch reports any real problem.
    (void)cudaGetLastError();
  }
  FLASHATTN_CUDA_CHECK(launch_kernel(kernel, grid, dim3(Config::kThreads), Config::kSharedBytes, stream, 1, params, extra...));
  return false;
}

#if !defined(FLASHATTN_CUDA_DECODE_FMA)
// The TMA kernel's tensor maps (kernel_tma.cuh): 4-D (head_dim, rows, kv heads, groups)
// with the Hopper forward's encoder (64-column boxes, 128-byte swizzle). Contiguous:
// rows = capacity, groups = sequences (cache_batch_idx is not supported: the cache's row
// count is not known here), boxes of 64 keys; paged: rows = page_size, groups = pages,
// boxes of gcd(page_size, 64) keys (page_size is a multiple of 16). The tiles prefetched
// before the PDL wait: `prefetch_tiles` (kernel_choice.hpp; -1 = the ring's stages), or
// FLASHATTN_DECODE_TMA_PREFETCH_TILES (a tuning knob for decode_bench; read at every call).
inline DecodeTensorMaps make_decode_tensor_maps(const KVCacheParams& params, int prefetch_tiles) {
  const AttentionParams& a = params.attention;
  DecodeTensorMaps maps{};
  maps.prefetch_tiles = prefetch_tiles;
  if (const char* tiles = std::getenv("FLASHATTN_DECODE_TMA_PREFETCH_TILES"); tiles && *tiles) maps.prefetch_tiles = std::atoi(tiles) < 0 ? 0 : std::atoi(tiles);
  const bool is_paged = params.is_paged();
  maps.box_rows = tma_box_rows(is_paged ? params.page_size : 0);
  const std::int64_t rows = is_paged ? params.page_size : params.capacity;
  const std::int64_t groups = is_paged ? params.num_blocks : a.batch;
  maps.k = hopper::make_panel_tensor_map("k_cache", a.k, a.dtype, a.head_dim, rows, a.heads_kv, groups, a.k_row_stride, a.k_head_stride,
                                         a.k_batch_stride, maps.box_rows);
  maps.v = hopper::make_panel_tensor_map("v_cache", a.v, a.dtype, a.head_dim, rows, a.heads_kv, groups, a.v_row_stride, a.v_head_stride,
                                         a.v_batch_stride, maps.box_rows);
  return maps;
}

// Whether the TMA kernel can run this call: sm_90 code in this binary, and caches the
// tensor maps describe (launch.hpp).
template <class Kernel>
bool can_run_tma_kernel(Kernel* kernel, const KVCacheParams& params) {
  return tma_maps_can_describe(params) && kernel_is_sm90(kernel);
}
#endif

template <class T, int kHeadDim>
bool run_decode(const KVCacheParams& params, cudaStream_t stream, DecodeKernelChoice choice) {
#if defined(FLASHATTN_CUDA_DECODE_FMA)
  (void)choice;
  if (rows_per_cta(params.attention.seqlen_q * params.attention.group_size) == 4) {
    return launch_decode_config<T, DecodeConfig<kHeadDim, 4>>(&decode_kernel<T, DecodeConfig<kHeadDim, 4>>, params, stream, false);
  }
  return launch_decode_config<T, DecodeConfig<kHeadDim, 8>>(&decode_kernel<T, DecodeConfig<kHeadDim, 8>>, params, stream, false);
#else
  // The TMA kernel where it was asked for and can run the call (a compute_80 PTX
  // build JIT-compiled on an H100 has an empty body there); else the cp.async kernel.
  using TmaConfig = TmaDecodeConfig<kHeadDim>;
  if (choice.kernel == DecodeKernel::tma && can_run_tma_kernel(&tma_decode_kernel<T, TmaConfig>, params))
    return launch_decode_config<T, TmaConfig>(&tma_decode_kernel<T, TmaConfig>, params, stream, true,
                                              make_decode_tensor_maps(params, choice.tma_prefetch_tiles),
                                              is_affine_alibi_enabled());
  using Config = MmaDecodeConfig<kHeadDim>;
  return launch_decode_config<T, Config>(&mma_decode_kernel<T, Config>, params, stream, true, is_affine_alibi_enabled());
#endif
}

}  // namespace flashattn::cuda::decode
