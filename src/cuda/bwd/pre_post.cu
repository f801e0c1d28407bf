// src/cuda/bwd/pre_post.cu — the small kernels around the main backward kernel:
// D = rowsum(dO ∘ O) and LSE in log2 units before it, dQ conversion after it. One
// warp per (query row, head); CTAs flattened over (row block, head, sequence) like
// the main kernels. And the device limits the main kernels' configs are picked from.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <string>
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

// The row (b, h, i) of a group of lanes_per_row lanes: CTAs over (row blocks of
// kThreads / lanes_per_row rows, head, sequence); the per-warp kernels below take 32.
struct RowOfGroup {
  std::int64_t b, h, i;
  int lane;  // in the row's group
  bool is_valid;
};

__device__ RowOfGroup row_of_group(const BackwardParams& params, int row_blocks, int lanes_per_row) {
  const int rows_per_cta = kThreads / lanes_per_row;
  const std::int64_t row_block = blockIdx.x % row_blocks;
  const std::int64_t h = (blockIdx.x / row_blocks) % params.heads_q;
  const std::int64_t b = blockIdx.x / row_blocks / params.heads_q;
  const std::int64_t i = row_block * rows_per_cta + threadIdx.x / lanes_per_row;
  return {b, h, i, static_cast<int>(threadIdx.x) % lanes_per_row, i < params.seqlen_q_of(b)};
}

__host__ __device__ inline std::int64_t padded_stats_rows(std::int64_t seqlen_q) {
  return (seqlen_q + kMaxBlockM - 1) / kMaxBlockM * kMaxBlockM;
}

// A row's statistics, by one lane of its group: LSE in log2 units (-inf -> +inf, so
// exp2(s - LSE) = 0 for a fully masked row) and D = rowsum(dO ∘ O) into the padded
// statistics rows; the padding rows of the sequence's last kMaxBlockM tile get
// LSE = +inf, D = 0.
__device__ void store_row_statistics(const BackwardParams& params, const Workspace& workspace, const RowOfGroup& row,
                                     float dsum) {
  const std::int64_t stats_row = row.h * workspace.stats_head_stride + Workspace::stats_start(params, row.b) + row.i;
  if (!row.is_valid) {
    if (row.i < padded_stats_rows(params.seqlen_q_of(row.b))) {
      workspace.lse_log2[stats_row] = INFINITY;
      workspace.dsum[stats_row] = 0.0f;
    }
    return;
  }
  const float lse = params.lse[params.lse_offset(row.b, row.h) + row.i * params.lse_row_stride];
  workspace.lse_log2[stats_row] = lse == -INFINITY ? INFINITY : lse * static_cast<float>(online_softmax::kLog2e);
  workspace.dsum[stats_row] = dsum;
}

// D and the log2 LSE, one warp per row (the separate passes).
template <class Element>
__global__ void __launch_bounds__(kThreads) dsum_kernel(const __grid_constant__ BackwardParams params,
                                                        const Workspace workspace, int row_blocks) {
  const RowOfGroup row = row_of_group(params, row_blocks, 32);
  if (!row.is_valid) {
    if (row.lane == 0) store_row_statistics(params, workspace, row, 0.0f);
    return;
  }
  const Element* dout = static_cast<const Element*>(params.dout) + params.dout_offset(row.b, row.h) +
                        row.i * params.dout_row_stride;
  const Element* out = static_cast<const Element*>(params.out) + params.out_offset(row.b, row.h) +
                       row.i * params.out_row_stride;
  float sum = 0.0f;
  for (std::int64_t d = row.lane; d < params.head_dim; d += 32)
    sum += Numeric<Element>::to_float(dout[d]) * Numeric<Element>::to_float(out[d]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (row.lane == 0) store_row_statistics(params, workspace, row, sum);
}

template <class Element>
__global__ void __launch_bounds__(kThreads) convert_dq_kernel(const __grid_constant__ BackwardParams params,
                                                              const Workspace workspace, int row_blocks) {
  const RowOfGroup row = row_of_group(params, row_blocks, 32);
  if (!row.is_valid) return;
  const float* accum = workspace.dq_accum + workspace.dq_offset(params, row.b, row.i, row.h);
  Element* dq = static_cast<Element*>(params.dq) + params.dq_offset(row.b, row.h) + row.i * params.dq_row_stride;
  for (std::int64_t d = row.lane; d < params.head_dim; d += 32)
    dq[d] = Numeric<Element>::from_float(accum[d] * params.softmax_scale);
}

// The fused passes (the default; FLASHATTN_CUDA_HOPPER_BWD_PASSES=separate runs the kernels
// above): 16-byte accesses, a group of lanes_per_row lanes per row (8 elements a lane per
// access; d64: 8 lanes, d128: 16, d256: 32), and the workspace zeroing folded into the
// preprocess (one launch instead of a memset per section and the D kernel; the bytes
// written are the memsets'). Needs head_dim % 8 == 0 and 16-byte aligned out/dout/dq
// pointers and strides.
constexpr int kElementsPerAccess = 8;

// What the memsets zeroed (the whole dq_accum and dq_semaphore sections), as a
// grid-stride loop over the preprocess grid.
struct ZeroedSections {
  float4* maybe_dq_accum = nullptr;
  std::int64_t dq_accum_vectors = 0;  // float4s
  std::int32_t* maybe_semaphores = nullptr;
  std::int64_t semaphores = 0;
  std::int32_t* maybe_tile_counter = nullptr;  // one int32
};

template <class Element>
__global__ void __launch_bounds__(kThreads)
    fused_preprocess_kernel(const __grid_constant__ BackwardParams params, const Workspace workspace,
                            const ZeroedSections zeroed, int row_blocks, int lanes_per_row) {
  const std::int64_t thread = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const std::int64_t threads = static_cast<std::int64_t>(gridDim.x) * kThreads;
  for (std::int64_t v = thread; v < zeroed.dq_accum_vectors; v += threads)
    zeroed.maybe_dq_accum[v] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (std::int64_t s = thread; s < zeroed.semaphores; s += threads) zeroed.maybe_semaphores[s] = 0;
  if (thread == 0 && zeroed.maybe_tile_counter != nullptr) *zeroed.maybe_tile_counter = 0;

  const RowOfGroup row = row_of_group(params, row_blocks, lanes_per_row);
  float sum = 0.0f;
  if (row.is_valid) {
    const Element* dout = static_cast<const Element*>(params.dout) + params.dout_offset(row.b, row.h) +
                          row.i * params.dout_row_stride;
    const Element* out = static_cast<const Element*>(params.out) + params.out_offset(row.b, row.h) +
                         row.i * params.out_row_stride;
    for (std::int64_t d = row.lane * kElementsPerAccess; d < params.head_dim; d += lanes_per_row * kElementsPerAccess) {
      const uint4 dout_chunk = *reinterpret_cast<const uint4*>(dout + d);
      const uint4 out_chunk = *reinterpret_cast<const uint4*>(out + d);
      const std::uint32_t dout_pairs[4] = {dout_chunk.x, dout_chunk.y, dout_chunk.z, dout_chunk.w};
      const std::uint32_t out_pairs[4] = {out_chunk.x, out_chunk.y, out_chunk.z, out_chunk.w};
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        float dout_low, dout_high, out_low, out_high;
        unpack_pair<Element>(dout_pairs[p], dout_low, dout_high);
        unpack_pair<Element>(out_pairs[p], out_low, out_high);
        sum += dout_low * out_low + dout_high * out_high;
      }
    }
  }
  // Every lane of the warp shuffles (groups of one warp may differ in validity); xor
  // offsets below lanes_per_row stay inside the group.
  for (int offset = lanes_per_row / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (row.lane == 0) store_row_statistics(params, workspace, row, sum);
}

template <class Element>
__global__ void __launch_bounds__(kThreads) fused_convert_dq_kernel(const __grid_constant__ BackwardParams params,
                                                                    const Workspace workspace, int row_blocks,
                                                                    int lanes_per_row) {
  const RowOfGroup row = row_of_group(params, row_blocks, lanes_per_row);
  if (!row.is_valid) return;
  const float* accum = workspace.dq_accum + workspace.dq_offset(params, row.b, row.i, row.h);
  Element* dq = static_cast<Element*>(params.dq) + params.dq_offset(row.b, row.h) + row.i * params.dq_row_stride;
  const float scale = params.softmax_scale;
  for (std::int64_t d = row.lane * kElementsPerAccess; d < params.head_dim; d += lanes_per_row * kElementsPerAccess) {
    const float4 low = *reinterpret_cast<const float4*>(accum + d);
    const float4 high = *reinterpret_cast<const float4*>(accum + d + 4);
    uint4 chunk;
    chunk.x = pack_pair<Element>(low.x * scale, low.y * scale);
    chunk.y = pack_pair<Element>(low.z * scale, low.w * scale);
    chunk.z = pack_pair<Element>(high.x * scale, high.y * scale);
    chunk.w = pack_pair<Element>(high.z * scale, high.w * scale);
    *reinterpret_cast<uint4*>(dq + d) = chunk;
  }
}

// The largest power of two <= 32 lanes with a chunk each: no lane idle on a full row.
int lanes_per_row_for(std::int64_t head_dim) {
  const std::int64_t chunks = head_dim / kElementsPerAccess;
  int lanes = 1;
  while (lanes < 32 && 2 * lanes <= chunks) lanes *= 2;
  return lanes;
}

bool is_16_byte_aligned(const void* pointer, std::initializer_list<std::int64_t> element_strides) {
  if (reinterpret_cast<std::uintptr_t>(pointer) % 16 != 0) return false;
  for (const std::int64_t stride : element_strides)
    if (stride % kElementsPerAccess != 0) return false;
  return true;
}

// Whether the fused passes run this call: selected, and every row they touch is whole
// 16-byte chunks.
bool runs_fused_passes(const BackwardParams& params) {
  if (!are_fused_passes_selected() || params.head_dim % kElementsPerAccess != 0) return false;
  return is_16_byte_aligned(params.out, {params.out_batch_stride, params.out_row_stride, params.out_head_stride}) &&
         is_16_byte_aligned(params.dout, {params.dout_batch_stride, params.dout_row_stride, params.dout_head_stride}) &&
         is_16_byte_aligned(params.dq, {params.dq_batch_stride, params.dq_row_stride, params.dq_head_stride});
}

// The fused passes' grid: (row blocks of kThreads / lanes_per_row rows, head, sequence).
struct GroupedGrid {
  std::int64_t row_blocks = 0, ctas = 0;
  int lanes_per_row = 0;
};

GroupedGrid grouped_grid(const BackwardParams& params, std::int64_t rows_per_sequence) {
  GroupedGrid grid;
  grid.lanes_per_row = lanes_per_row_for(params.head_dim);
  const std::int64_t rows_per_cta = kThreads / grid.lanes_per_row;
  grid.row_blocks = (rows_per_sequence + rows_per_cta - 1) / rows_per_cta;
  grid.ctas = grid.row_blocks * params.heads_q * params.batch;
  if (grid.ctas > std::numeric_limits<int>::max())
    throw NotSupported("flashattn: cuda backward: too many query rows for one launch");
  return grid;
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

bool are_fused_passes_selected() {
  static const bool selected = [] {
    const char* value = std::getenv("FLASHATTN_CUDA_HOPPER_BWD_PASSES");
    return value == nullptr || std::string(value) != "separate";
  }();
  return selected;
}

void launch_preprocess(const BackwardParams& params, const Workspace& workspace, cudaStream_t stream) {
  const std::int64_t padded_rows = padded_stats_rows(params.seqlen_q);
  if (runs_fused_passes(params)) {
    const GroupedGrid grid = grouped_grid(params, padded_rows);
    ZeroedSections zeroed;
    if (workspace.dq_accum != nullptr && params.total_q > 0) {
      zeroed.maybe_dq_accum = reinterpret_cast<float4*>(workspace.dq_accum);
      // head_dim % 8 == 0: whole float4s (the section starts 256-byte aligned).
      zeroed.dq_accum_vectors = workspace.dq_head_stride * params.heads_q * params.head_dim / 4;
    }
    if (workspace.dq_semaphore != nullptr && params.total_q > 0) {
      zeroed.maybe_semaphores = workspace.dq_semaphore;
      zeroed.semaphores = Workspace::semaphores_per_head(params) * params.heads_q;
    }
    zeroed.maybe_tile_counter = workspace.maybe_tile_counter;
    if (grid.ctas == 0) {
      // No rows to walk (batch or heads empty are returned earlier; seqlen_q 0): the memsets' job only.
      if (zeroed.dq_accum_vectors > 0)
        FLASHATTN_CUDA_CHECK(cudaMemsetAsync(zeroed.maybe_dq_accum, 0, 16 * zeroed.dq_accum_vectors, stream));
      if (zeroed.semaphores > 0)
        FLASHATTN_CUDA_CHECK(cudaMemsetAsync(zeroed.maybe_semaphores, 0, 4 * zeroed.semaphores, stream));
      if (zeroed.maybe_tile_counter != nullptr)
        FLASHATTN_CUDA_CHECK(cudaMemsetAsync(zeroed.maybe_tile_counter, 0, sizeof(std::int32_t), stream));
      return;
    }
    const auto kernel =
        params.dtype == DType::float16 ? fused_preprocess_kernel<__half> : fused_preprocess_kernel<__nv_bfloat16>;
    kernel<<<static_cast<unsigned int>(grid.ctas), kThreads, 0, stream>>>(
        params, workspace, zeroed, static_cast<int>(grid.row_blocks), grid.lanes_per_row);
    FLASHATTN_CUDA_CHECK_LAUNCH();
    return;
  }
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
  if (workspace.maybe_tile_counter != nullptr)
    FLASHATTN_CUDA_CHECK(cudaMemsetAsync(workspace.maybe_tile_counter, 0, sizeof(std::int32_t), stream));
  launch_per_row(dsum_kernel<__half>, dsum_kernel<__nv_bfloat16>, params, workspace, padded_rows, stream);
}

void launch_convert_dq(const BackwardParams& params, const Workspace& workspace, cudaStream_t stream) {
  if (runs_fused_passes(params)) {
    const GroupedGrid grid = grouped_grid(params, params.seqlen_q);
    if (grid.ctas == 0) return;
    const auto kernel =
        params.dtype == DType::float16 ? fused_convert_dq_kernel<__half> : fused_convert_dq_kernel<__nv_bfloat16>;
    kernel<<<static_cast<unsigned int>(grid.ctas), kThreads, 0, stream>>>(params, workspace,
                                                                          static_cast<int>(grid.row_blocks),
                                                                          grid.lanes_per_row);
    FLASHATTN_CUDA_CHECK_LAUNCH();
    return;
  }
  launch_per_row(convert_dq_kernel<__half>, convert_dq_kernel<__nv_bfloat16>, params, workspace, params.seqlen_q,
                 stream);
}

}  // namespace flashattn::cuda::bwd
