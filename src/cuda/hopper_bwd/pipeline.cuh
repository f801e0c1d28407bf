// src/cuda/hopper_bwd/pipeline.cuh — what both Hopper backward kernels (kernel.cuh,
// kernel_wide.cuh) share of their hardware mapping: the producer's TMA loads (LSE/D
// rows; the K/V block and a step's Q/dO tiles through common/tma_panels.cuh), the deterministic
// mode's ordered dQ addition, and the launch (one CTA per key block x kv head x
// sequence, with the shared-memory opt-in).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cuda/ptx>
#include <string>

#include "flashattn/error.hpp"
#include "flashattn/mask.hpp"
#include "src/cuda/bwd/workspace.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/common/tma_panels.cuh"
#include "src/cuda/hopper_bwd/dq_order.hpp"
#include "src/cuda/hopper_bwd/launch.hpp"
#include "src/cuda/hopper_bwd/tile_config.hpp"
#include "src/cuda/ptx/bulk_reduce.cuh"
#include "src/cuda/ptx/semaphore.cuh"
#include "src/cuda/ptx/arch.cuh"  // FLASHATTN_HOPPER_DEVICE_CODE
#include "src/cuda/ptx/mbarrier.cuh"

namespace flashattn::cuda::hopper_bwd {

#if FLASHATTN_HOPPER_DEVICE_CODE
// The K/V block and a step's Q/dO tiles: load_panels (common/tma_panels.cuh).

// Whole padded rows of LSE and D (bwd/workspace.hpp: 16-byte aligned, +inf / 0 past the
// sequence) from statistics row `stats_row`, `bytes` each, completing on `barrier`.
__device__ __forceinline__ void load_statistics(float* lse, float* dsum, const bwd::Workspace& workspace,
                                                std::int64_t stats_row, int bytes, std::uint64_t* barrier) {
  ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, lse, workspace.lse_log2 + stats_row,
                             bytes, barrier);
  ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, dsum, workspace.dsum + stats_row,
                             bytes, barrier);
}

// Deterministic mode (the order and why it cannot deadlock: the top of kernel.cuh): one
// thread adds the staged dQ tile of query rows [m0, m0 + kBlockM) of head_q to dq_accum
// in its key block's turn: it waits (acquire) until the tile's semaphore equals the turn
// (the last visiting key block - n_block, dq_order.hpp), adds, waits until the addition
// is performed in global memory (not only read from shared memory) and publishes the
// next turn (release).
template <int kBlockM, int kBlockN>
__device__ __forceinline__ void ordered_reduce_add(const BackwardParams& attention, const bwd::Workspace& workspace,
                                                   const MaskRule& mask, std::int64_t batch, std::int64_t head_q,
                                                   std::int64_t m0, std::int64_t n_block, std::uint32_t source,
                                                   int bytes) {
  const std::int64_t m_block = m0 / kBlockM;
  const KeyBlockRange visitors = key_blocks_of_query_block(mask, m_block, kBlockM, kBlockN);
  const auto turn = static_cast<std::int32_t>(visitors.first + visitors.count - 1 - n_block);
  std::int32_t* semaphore = workspace.dq_semaphore + workspace.semaphore_index(attention, batch, m_block, kBlockM, head_q);
  ptx::wait_until_equal_acquire_gpu(semaphore, turn);
  ptx::fence_proxy_async_global();  // the earlier turns' additions before ours
  ptx::bulk_reduce_add_f32(workspace.dq_accum + workspace.dq_offset(attention, batch, m0, head_q), source, bytes);
  ptx::bulk_commit_group();
  ptx::bulk_wait_group<0>();
  ptx::fence_proxy_async_global();
  __threadfence();
  ptx::store_release_gpu(semaphore, turn + 1);
}
#endif

// Launches `kernel` (one CTA per key block of block_n keys x kv head x sequence) with
// `shared_bytes` of dynamic shared memory for already checked params. Above 48 KB a
// kernel must opt in, once per device: `opted_in_devices` is the kernel's own record.
// No allocation, no synchronisation.
template <class Kernel>
void launch_per_key_block(Kernel* kernel, std::atomic<std::uint64_t>& opted_in_devices, const HopperBackwardParams& params,
                          int block_n, int threads, int shared_bytes, cudaStream_t stream) {
  const BackwardParams& attention = params.backward;
  const std::int64_t num_n_blocks = (attention.seqlen_k + block_n - 1) / block_n;
  const std::int64_t num_ctas = num_n_blocks * attention.heads_kv * attention.batch;
  if (num_ctas == 0) return;
  if (num_ctas > INT_MAX)
    throw NotSupported("flashattn: cuda backward: too many key blocks x heads x batch for one launch (" +
                       std::to_string(num_ctas) + ")");
  int device = 0;
  FLASHATTN_CUDA_CHECK(cudaGetDevice(&device));
  const std::uint64_t device_bit = device < 64 ? (std::uint64_t{1} << device) : 0;
  if (device_bit == 0 || (opted_in_devices.load(std::memory_order_acquire) & device_bit) == 0) {
    FLASHATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
    opted_in_devices.fetch_or(device_bit, std::memory_order_release);
  }
  kernel<<<static_cast<unsigned>(num_ctas), threads, shared_bytes, stream>>>(params);
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda::hopper_bwd
