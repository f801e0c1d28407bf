// src/cuda/bwd/pre_post.cu — the small kernels around the main backward kernel:
// D = rowsum(dO ∘ O) and LSE in log2 units before it, dQ conversion after it. One
// warp per (query row, head); CTAs flattened over (row block, head, sequence) like
// the main kernels. And the device limits the main kernels' configs are picked from.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <vector>

#include "flashattn/error.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/cuda/bwd/common.cuh"
#include "src/cuda/bwd/launch.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/common/numeric.cuh"

namespace flashattn::cuda::bwd {
namespace {

constexpr int kRowsPerCta = 8;  // one warp per row
constexpr int kThreads = kRowsPerCta * 32;

struct RowOfWarp {
  std::int64_t b, h, i;
  bool is_valid;
};

__device__ RowOfWarp row_of_warp(const BackwardParams& params, int row_blocks) {
  const std::int64_t row_block = blockIdx.x % row_blocks;
  const std::int64_t h = (blockIdx.x / row_blocks) % params.heads_q;
  const std::int64_t b = blockIdx.x / row_blocks / params.heads_q;
  const std::int64_t i = row_block * kRowsPerCta + threadIdx.x / 32;
  return {b, h, i, i < params.seqlen_q_of(b)};
}

// D = rowsum(dO ∘ O) and LSE in log2 units (-inf -> +inf, so exp2(s - LSE) = 0 for a
// fully masked row) into the padded statistics rows; the padding rows of the
// sequence's last kMaxBlockM tile get LSE = +inf, D = 0.
template <class Element>
__global__ void __launch_bounds__(kThreads) dsum_kernel(const __grid_constant__ BackwardParams params,
                                                        const Workspace workspace, int row_blocks) {
  const RowOfWarp row = row_of_warp(params, row_blocks);
  const std::int64_t stats_row = row.h * workspace.stats_head_stride + Workspace::stats_start(params, row.b) + row.i;
  const int lane = threadIdx.x % 32;
  if (!row.is_valid) {
    const std::int64_t padded_rows = (params.seqlen_q_of(row.b) + kMaxBlockM - 1) / kMaxBlockM * kMaxBlockM;
    if (lane == 0 && row.i < padded_rows) {
      workspace.lse_log2[stats_row] = INFINITY;
      workspace.dsum[stats_row] = 0.0f;
    }
    return;
  }
  const Element* dout = static_cast<const Element*>(params.dout) + params.dout_offset(row.b, row.h) +
                        row.i * params.dout_row_stride;
  const Element* out = static_cast<const Element*>(params.out) + params.out_offset(row.b, row.h) +
                       row.i * params.out_row_stride;
  float sum = 0.0f;
  for (std::int64_t d = lane; d < params.head_dim; d += 32)
    sum += Numeric<Element>::to_float(dout[d]) * Numeric<Element>::to_float(out[d]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) {
    const float lse = params.lse[params.lse_offset(row.b, row.h) + row.i * params.lse_row_stride];
    workspace.lse_log2[stats_row] = lse == -INFINITY ? INFINITY : lse * static_cast<float>(online_softmax::kLog2e);
    workspace.dsum[stats_row] = sum;
  }
}

template <class Element>
__global__ void __launch_bounds__(kThreads) convert_dq_kernel(const __grid_constant__ BackwardParams params,
                                                              const Workspace workspace, int row_blocks) {
  const RowOfWarp row = row_of_warp(params, row_blocks);
  if (!row.is_valid) return;
  const float* accum = workspace.dq_accum + workspace.dq_offset(params, row.b, row.i, row.h);
  Element* dq = static_cast<Element*>(params.dq) + params.dq_offset(row.b, row.h) + row.i * params.dq_row_stride;
  for (std::int64_t d = threadIdx.x % 32; d < params.head_dim; d += 32)
    dq[d] = Numeric<Element>::from_float(accum[d] * params.softmax_scale);
}

using RowKernel = void (*)(BackwardParams, Workspace, int);

// rows_per_sequence: the rows each sequence's CTAs cover (>= seqlen_q).
void launch_per_row(RowKernel half_kernel, RowKernel bfloat16_kernel, const BackwardParams& params,
                    const Workspace& workspace, std::int64_t rows_per_sequence, cudaStream_t stream) {
  const std::int64_t row_blocks = (rows_per_sequence + kRowsPerCta - 1) / kRowsPerCta;
  const std::int64_t grid = row_blocks * params.heads_q * params.batch;
  if (grid == 0) return;
  if (grid > std::numeric_limits<int>::max())
    throw NotSupported("flashattn: cuda backward: too many query rows for one launch");
  const RowKernel kernel = params.dtype == DType::float16 ? half_kernel : bfloat16_kernel;
  kernel<<<static_cast<unsigned int>(grid), kThreads, 0, stream>>>(params, workspace, static_cast<int>(row_blocks));
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

// Compiled like every kernel of the library: its PTX version is the __CUDA_ARCH__ of
// the code a device runs (sm_90a SASS on an H100; the compute_80 PTX, JIT-compiled,
// on a GPU newer than the SASS targets).
__global__ void compiled_arch_probe() {}

std::atomic<int> shared_memory_limit_for_testing{0};

DeviceLimits query_device_limits(int device) {
  DeviceLimits limits;
  FLASHATTN_CUDA_CHECK(
      cudaDeviceGetAttribute(&limits.shared_memory_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attributes{};
  FLASHATTN_CUDA_CHECK(cudaFuncGetAttributes(&attributes, compiled_arch_probe));
  // ptxVersion: the compute_XX the loaded code came from (binaryVersion, its SASS target, if unset).
  limits.has_bulk_reduce = (attributes.ptxVersion != 0 ? attributes.ptxVersion : attributes.binaryVersion) >= 90;
  return limits;
}

}  // namespace

DeviceLimits current_device_limits() {
  int device = 0;
  FLASHATTN_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::vector<DeviceLimits> cache;  // by device ordinal; shared_memory_per_block 0 = not yet queried
  DeviceLimits limits;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (static_cast<std::size_t>(device) >= cache.size()) cache.resize(static_cast<std::size_t>(device) + 1);
    DeviceLimits& cached = cache[static_cast<std::size_t>(device)];
    if (cached.shared_memory_per_block == 0) cached = query_device_limits(device);
    limits = cached;
  }
  const int cap = shared_memory_limit_for_testing.load();
  if (cap > 0) limits.shared_memory_per_block = std::min(limits.shared_memory_per_block, cap);
  return limits;
}

void set_shared_memory_limit_for_testing(int bytes) { shared_memory_limit_for_testing.store(bytes); }

void launch_preprocess(const BackwardParams& params, const Workspace& workspace, cudaStream_t stream) {
  // The sections the main kernel adds into (absent where it does not: backward_api.cu).
  if (workspace.dq_accum != nullptr && params.total_q > 0) {
    const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(workspace.dq_head_stride * params.heads_q * params.head_dim);
    FLASHATTN_CUDA_CHECK(cudaMemsetAsync(workspace.dq_accum, 0, bytes, stream));
  }
  if (workspace.dq_semaphore != nullptr && params.total_q > 0) {
    const std::size_t bytes =
        sizeof(std::int32_t) * static_cast<std::size_t>(Workspace::semaphores_per_head(params) * params.heads_q);
    FLASHATTN_CUDA_CHECK(cudaMemsetAsync(workspace.dq_semaphore, 0, bytes, stream));
  }
  const std::int64_t padded_rows = (params.seqlen_q + kMaxBlockM - 1) / kMaxBlockM * kMaxBlockM;
  launch_per_row(dsum_kernel<__half>, dsum_kernel<__nv_bfloat16>, params, workspace, padded_rows, stream);
}

void launch_convert_dq(const BackwardParams& params, const Workspace& workspace, cudaStream_t stream) {
  launch_per_row(convert_dq_kernel<__half>, convert_dq_kernel<__nv_bfloat16>, params, workspace, params.seqlen_q,
                 stream);
}

}  // namespace flashattn::cuda::bwd
