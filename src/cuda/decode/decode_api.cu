// src/cuda/decode/decode_api.cu — the CUDA backend of forward_with_kvcache: limits,
// the split heuristic's view of the device, alignment checks, and the launch
// sequence append -> split-KV kernel -> combine (one stream, in order; the combine
// is skipped when the kernel merged its splits in thread-block clusters).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "flashattn/error.hpp"
#include "src/core/kvcache_backend.hpp"
#include "src/cuda/common/call_guards.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/decode/launch.hpp"
#include "src/cuda/decode/tma_config.hpp"
#include "src/cuda/head_dims.hpp"

namespace flashattn::cuda {
namespace {

// The smallest built kernel head dim (DecodeHeadDims, head_dims.hpp) that holds head_dim
// (features past head_dim are zero-filled); 0 if none. The one selection used by limits
// and by the launch.
int kernel_head_dim_for(std::int64_t head_dim) { return DecodeHeadDims::smallest_holding(head_dim); }

template <class T>
bool run_decode_for_head_dim(int kernel_head_dim, const KVCacheParams& params, cudaStream_t stream, decode::DecodeKernelChoice kernel) {
  bool is_launched = false;
  const bool is_built = DecodeHeadDims::visit(kernel_head_dim, [&](auto head_dim) {
    is_launched = decode::run_decode<T, decltype(head_dim)::value>(params, stream, kernel);
  });
  if (!is_built)
    throw NotSupported("flashattn: q: no CUDA decode kernel for head_dim " + std::to_string(params.attention.head_dim) +
                       " in this build (see FLASHATTN_CUDA_HEAD_DIMS)");
  return is_launched;
}

// An FP8 cache's kernel (kernel_mma_fp8.cuh), T = q's dtype.
template <class T>
bool run_decode_fp8_for_head_dim(int kernel_head_dim, const KVCacheParams& params, cudaStream_t stream) {
  bool is_launched = false;
  const bool is_built = DecodeHeadDims::visit(kernel_head_dim, [&](auto head_dim) {
    is_launched = decode::run_decode_fp8<T, decltype(head_dim)::value>(params, stream);
  });
  if (!is_built)
    throw NotSupported("flashattn: q: no CUDA FP8-cache decode kernel for head_dim " +
                       std::to_string(params.attention.head_dim) + " in this build (see FLASHATTN_CUDA_HEAD_DIMS)");
  return is_launched;
}

// Device-resident lengths are unknown on the host: plan for the longest possible range.
std::int64_t longest_key_range(const KVCacheParams& params) {
  return (params.maybe_cache_seqlens || params.maybe_cache_leftpad) ? params.capacity
                                                                    : params.uniform_cache_seqlen + params.seqlen_new;
}

// Whether the TMA kernel can run this call (kernel_choice.hpp): a Hopper device (the
// sm_90a code; a build without it falls back to the cp.async kernel at launch, so the
// split count was then planned for the other kernel — performance only) and caches its
// tensor maps describe.
bool tma_kernel_can_run(const KVCacheParams& params) {
#if defined(FLASHATTN_CUDA_DECODE_FMA)
  (void)params;
  return false;
#else
  // The compute capability per device, read once (this runs twice per call).
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached_major[kMaxDevices] = {};  // 0: not read yet
  const int device = params.attention.device.index;
  int major = device >= 0 && device < kMaxDevices ? cached_major[device].load(std::memory_order_relaxed) : 0;
  if (major == 0) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
    if (device >= 0 && device < kMaxDevices) cached_major[device].store(major, std::memory_order_relaxed);
  }
  return major == 9 && decode::tma_maps_can_describe(params);
#endif
}

// The rule of kernel_choice.hpp, unless FLASHATTN_DECODE_KERNEL forces a kernel
// (cp_async, or tma with its default pre-wait prefetch; read at every call, so a
// captured graph keeps the kernel of its capture): the tests force each kernel on
// every shape, decode_bench compares them.
decode::DecodeKernelChoice decode_kernel_for(const KVCacheParams& params) {
  const char* forced = std::getenv("FLASHATTN_DECODE_KERNEL");
  if (forced == nullptr || *forced == 0) return decode::choose_decode_kernel(tma_kernel_can_run(params));
  const std::string name(forced);
  if (name == "cp_async") return {decode::DecodeKernel::cp_async, 0};
  if (name == "tma") return {decode::DecodeKernel::tma, -1};
  throw Error("flashattn: FLASHATTN_DECODE_KERNEL: expected cp_async or tma, got " + name);
}

}  // namespace

KVCacheLimits kvcache_limits() noexcept { return KVCacheLimits{"cuda", false, DecodeHeadDims::largest(), 8}; }

SplitProblem kvcache_split_problem(const KVCacheParams& params) {
  const AttentionParams& a = params.attention;
  SplitProblem p;
  const std::int64_t packed_rows = a.seqlen_q * a.group_size;
  const int rows = decode::rows_per_cta(packed_rows);
  p.batch = a.batch;
  p.heads_kv = a.heads_kv;
  const int kernel_head_dim = kernel_head_dim_for(a.head_dim);
  int sm_count = 1;
  if (cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, a.device.index) != cudaSuccess) sm_count = 1;
  p.sm_count = sm_count;
  p.max_splits = 64;
  p.seqlen_k = longest_key_range(params);
  if (params.is_fp8_cache()) {  // one kernel (kernel_mma_fp8.cuh), whatever the GPU
    p.query_blocks = (packed_rows + decode::kFp8RowsPerCta - 1) / decode::kFp8RowsPerCta;
    p.block_n = decode::kFp8TileKeys;
    p.ctas_per_sm = kernel_head_dim ? decode::fp8_ctas_per_sm(kernel_head_dim) : 1;
    return p;
  }
  p.query_blocks = (packed_rows + rows - 1) / rows;
  p.block_n = kernel_head_dim ? decode::tile_keys(kernel_head_dim) : 64;
  // The wave-efficiency rule needs the CTAs per SM of the kernel that will run (performance-only).
#if defined(FLASHATTN_CUDA_DECODE_FMA)
  p.ctas_per_sm = kernel_head_dim ? decode::ctas_per_sm(kernel_head_dim) : 1;
#else
  const decode::DecodeKernel kernel = decode_kernel_for(params).kernel;
  p.ctas_per_sm = kernel_head_dim ? decode::planned_ctas_per_sm(kernel, kernel_head_dim) : 1;
  if (kernel == decode::DecodeKernel::tma && kernel_head_dim)
    p.streaming_ctas = decode::tma_streaming_ctas(sm_count, decode::tma_box_rows(params.is_paged() ? params.page_size : 0), kernel_head_dim);
#endif
  return p;
}

namespace {

// Eager calls with a paged cache and device-resident cache_seqlens: the capacity and
// the block ids each sequence touches are checked on the host (two small stream-ordered
// device-to-host reads) before anything is written, with the CPU path's messages. Inside
// CUDA-graph capture nothing can be read back: the device guard (KVCacheParams::
// page_block / page_is_valid) keeps every access inside the cache instead.
void check_paged_cache_on_host(const KVCacheParams& params, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return;
  }
  const std::int64_t batch = params.attention.batch, width = params.block_table_stride;
  if (batch == 0) return;
  const std::int64_t pages = params.capacity / params.page_size;  // table entries per sequence
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(batch)), table(static_cast<std::size_t>((batch - 1) * width + pages));
  FLASHATTN_CUDA_CHECK(cudaMemcpyAsync(lengths.data(), params.maybe_cache_seqlens, lengths.size() * sizeof(std::int32_t),
                                       cudaMemcpyDeviceToHost, stream));
  FLASHATTN_CUDA_CHECK(cudaMemcpyAsync(table.data(), params.maybe_block_table, table.size() * sizeof(std::int32_t),
                                       cudaMemcpyDeviceToHost, stream));
  FLASHATTN_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t length = lengths[static_cast<std::size_t>(b)];
    if (length < 0) throw Error("flashattn: cache_seqlens: entry " + std::to_string(b) + " must be >= 0, got " + std::to_string(length));
    if (length + params.seqlen_new > params.capacity)
      throw Error("flashattn: block_table: entry " + std::to_string(b) + ": " + std::to_string(length) + " cached + " +
                  std::to_string(params.seqlen_new) + " new keys exceed the cache capacity " + std::to_string(params.capacity) +
                  " (max_blocks_per_seq * page_size)");
    if (params.maybe_cache_leftpad) continue;  // pages before the left padding may hold anything
    const std::int64_t end = length + params.seqlen_new;
    for (std::int64_t page = 0; page < pages && page * params.page_size < end; ++page) {
      const std::int64_t block = table[static_cast<std::size_t>(b * width + page)];
      if (block < 0 || block >= params.num_blocks)
        throw Error("flashattn: block_table: entry [" + std::to_string(b) + ", " + std::to_string(page) + "] expected a block id in [0, " +
                    std::to_string(params.num_blocks) + ") (num_blocks of k_cache), got " + std::to_string(block));
    }
  }
}

}  // namespace

void forward_with_kvcache(const KVCacheParams& params, void* stream) {
  const AttentionParams& a = params.attention;
  const int kernel_head_dim = kernel_head_dim_for(a.head_dim);
  if (kernel_head_dim == 0)
    throw NotSupported("flashattn: q: head_dim " + std::to_string(a.head_dim) + " is larger than every CUDA decode kernel built (largest: " +
                       std::to_string(DecodeHeadDims::largest()) + ")");
  if (a.dtype != DType::float16 && a.dtype != DType::bfloat16)
    throw NotSupported(std::string("flashattn: q: the CUDA decode kernel runs float16 and bfloat16, got ") + dtype_name(a.dtype));
  if (params.is_fp8_cache()) {
    // 16-byte copies of e4m3 rows: 16 features per chunk, strides in bytes.
    if (a.head_dim % 16 != 0)
      throw NotSupported("flashattn: k_cache: an FP8 cache on CUDA needs head_dim a multiple of 16, got " + std::to_string(a.head_dim));
    const auto require_fp8_rows = [](const char* name, const void* data, std::int64_t batch_stride, std::int64_t row_stride, std::int64_t head_stride) {
      if (reinterpret_cast<std::uintptr_t>(data) % 16 != 0 || batch_stride % 16 != 0 || row_stride % 16 != 0 || head_stride % 16 != 0)
        throw NotSupported(std::string("flashattn: ") + name +
                           ": an FP8 cache on CUDA needs 16-byte aligned rows (data pointer aligned to 16 bytes and batch/row/head "
                           "strides multiples of 16 elements), got strides " +
                           std::to_string(batch_stride) + "/" + std::to_string(row_stride) + "/" + std::to_string(head_stride));
    };
    require_fp8_rows("k_cache", params.k_cache, a.k_batch_stride, a.k_row_stride, a.k_head_stride);
    require_fp8_rows("v_cache", params.v_cache, a.v_batch_stride, a.v_row_stride, a.v_head_stride);
  } else {
    require_16_byte_rows("k_cache", params.k_cache, a.k_batch_stride, a.k_row_stride, a.k_head_stride);
    require_16_byte_rows("v_cache", params.v_cache, a.v_batch_stride, a.v_row_stride, a.v_head_stride);
  }
  if (params.num_splits > 1 && reinterpret_cast<std::uintptr_t>(params.maybe_workspace) % 16 != 0)
    throw NotSupported("flashattn: workspace: must be 16-byte aligned");
  const DeviceGuard device_guard(a.device.index);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (params.is_paged() && params.maybe_cache_seqlens != nullptr) check_paged_cache_on_host(params, cuda_stream);
  if (params.has_append()) decode::run_append(params, cuda_stream);  // the new keys are part of the cache read next
  if (a.batch == 0 || a.seqlen_q == 0) return;
  if (params.is_fp8_cache()) {
    const bool is_merged = a.dtype == DType::bfloat16 ? run_decode_fp8_for_head_dim<__nv_bfloat16>(kernel_head_dim, params, cuda_stream)
                                                       : run_decode_fp8_for_head_dim<__half>(kernel_head_dim, params, cuda_stream);
    if (params.num_splits > 1 && !is_merged) decode::run_combine(params, cuda_stream);
    return;
  }
  const decode::DecodeKernelChoice kernel = decode_kernel_for(params);
  const bool is_merged = a.dtype == DType::bfloat16 ? run_decode_for_head_dim<__nv_bfloat16>(kernel_head_dim, params, cuda_stream, kernel)
                                                     : run_decode_for_head_dim<__half>(kernel_head_dim, params, cuda_stream, kernel);
  if (params.num_splits > 1 && !is_merged) decode::run_combine(params, cuda_stream);
}

}  // namespace flashattn::cuda
