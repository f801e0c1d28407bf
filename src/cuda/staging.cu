// src/cuda/staging.cu — the copy kernels of staging.hpp: zero-padding/cropping the
// head dim and gathering paged K/V into packed rows. Plain element copies, one thread
// per destination element (memory-bound, run once per call; not tuned).
#include "src/cuda/staging.hpp"

#include <cuda_runtime.h>

#include <cstdint>

#include "flashattn/error.hpp"
#include "src/cuda/common/check.cuh"

namespace flashattn::cuda::staging {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 65535 * 16;  // grid-stride beyond this

unsigned blocks_for(std::int64_t elements) {
  const std::int64_t blocks = (elements + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// The attention tensors on the GPU are float16/bfloat16: moved as raw 16-bit words
// (0x0000 is +0 in both).
__global__ void copy_columns_kernel(const std::uint16_t* src, RowsView src_view, std::int64_t src_columns,
                                    std::uint16_t* dst, RowsView dst_view, std::int64_t dst_columns,
                                    std::int64_t batch, std::int64_t rows, std::int64_t heads,
                                    const std::int32_t* maybe_row_end) {
  const std::int64_t elements = batch * rows * heads * dst_columns;
  const std::int64_t row_end = maybe_row_end ? *maybe_row_end : rows;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < elements;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t c = i % dst_columns;
    const std::int64_t h = (i / dst_columns) % heads;
    const std::int64_t r = (i / (dst_columns * heads)) % rows;
    const std::int64_t b = i / (dst_columns * heads * rows);
    if (r >= row_end) continue;
    const std::uint16_t value =
        c < src_columns ? src[b * src_view.batch_stride + r * src_view.row_stride + h * src_view.head_stride + c] : 0;
    dst[b * dst_view.batch_stride + r * dst_view.row_stride + h * dst_view.head_stride + c] = value;
  }
}

// One thread per (sequence b, key j < max_seqlen_k, head, column) of the destination.
__global__ void gather_paged_kernel(const __grid_constant__ AttentionParams params, std::uint16_t* dst_k,
                                    std::uint16_t* dst_v, std::int64_t dst_rows, std::int64_t dst_columns) {
  const std::int64_t heads = params.heads_kv;
  const std::int64_t elements = params.batch * params.seqlen_k * heads * dst_columns;
  const auto* k = static_cast<const std::uint16_t*>(params.k);
  const auto* v = static_cast<const std::uint16_t*>(params.v);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < elements;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t c = i % dst_columns;
    const std::int64_t h = (i / dst_columns) % heads;
    const std::int64_t j = (i / (dst_columns * heads)) % params.seqlen_k;
    const std::int64_t b = i / (dst_columns * heads * params.seqlen_k);
    if (j >= params.seqlen_k_of(b)) continue;
    const std::int64_t row = params.k_start(b) + j;
    if (row < 0 || row >= dst_rows) continue;  // lengths beyond max_seqlen_k: the caller's contract, never a stray write
    const std::int64_t block = params.page_block(b, j / params.page_size);
    const std::int64_t in_page = j % params.page_size;
    const std::int64_t dst = (row * heads + h) * dst_columns + c;
    const bool is_data = c < params.head_dim;
    dst_k[dst] = is_data ? k[block * params.k_batch_stride + in_page * params.k_row_stride + h * params.k_head_stride + c] : 0;
    dst_v[dst] = is_data ? v[block * params.v_batch_stride + in_page * params.v_row_stride + h * params.v_head_stride + c] : 0;
  }
}

}  // namespace

void copy_columns(const RowsView& src, std::int64_t src_columns, const RowsView& dst, std::int64_t dst_columns,
                  std::int64_t batch, std::int64_t rows, std::int64_t heads, const std::int32_t* maybe_row_end,
                  cudaStream_t stream) {
  const std::int64_t elements = batch * rows * heads * dst_columns;
  if (elements == 0) return;
  copy_columns_kernel<<<blocks_for(elements), kThreads, 0, stream>>>(
      static_cast<const std::uint16_t*>(src.data), src, src_columns, static_cast<std::uint16_t*>(dst.data), dst,
      dst_columns, batch, rows, heads, maybe_row_end);
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

void gather_paged_kv(const AttentionParams& params, void* dst_k, void* dst_v, std::int64_t dst_rows,
                     std::int64_t dst_columns, cudaStream_t stream) {
  const auto bytes = static_cast<std::size_t>(dst_rows * params.heads_kv * dst_columns) * sizeof(std::uint16_t);
  if (bytes == 0) return;
  FLASHATTN_CUDA_CHECK(cudaMemsetAsync(dst_k, 0, bytes, stream));
  FLASHATTN_CUDA_CHECK(cudaMemsetAsync(dst_v, 0, bytes, stream));
  const std::int64_t elements = params.batch * params.seqlen_k * params.heads_kv * dst_columns;
  if (elements == 0) return;
  gather_paged_kernel<<<blocks_for(elements), kThreads, 0, stream>>>(params, static_cast<std::uint16_t*>(dst_k),
                                                                     static_cast<std::uint16_t*>(dst_v), dst_rows,
                                                                     dst_columns);
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

StreamScratch::StreamScratch(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes == 0) return;
  void* pointer = nullptr;
  FLASHATTN_CUDA_CHECK(cudaMallocAsync(&pointer, bytes, stream));
  data_ = static_cast<unsigned char*>(pointer);
}

StreamScratch::~StreamScratch() {
  if (data_ != nullptr) (void)cudaFreeAsync(data_, stream_);
}

}  // namespace flashattn::cuda::staging
