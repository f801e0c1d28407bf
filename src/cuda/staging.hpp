// src/cuda/staging.hpp — the copies that let the attention kernels run problems they
// have no layout for: a head_dim that is not a multiple of 8 (the kernels move rows in
// 16-byte chunks) and a paged K/V (the forward kernels read packed rows).
//
//   head_dim padding: q/k/v (and out/dout in the backward) are copied into zero-padded
//     scratch of padded_head_dim = round_up(head_dim, 8) columns, the kernels run the
//     padded problem, and out (dq/dk/dv) are copied back to the caller's head_dim.
//     Exact: the zero columns add 0 to every q.k and to rowsum(dO ∘ O), and the
//     padded output/gradient columns are discarded. The softmax scale stays the
//     caller's (1/sqrt(head_dim) by default, set by validation before padding).
//   paged K/V: the keys/values of sequence b are gathered out of the page pools into
//     packed varlen rows cu_seqlens_k[b] + j, with the page id clamped into the pool.
//
// Scratch: the forward allocates it stream-ordered (cudaMallocAsync / cudaFreeAsync on
// the call's stream, from the device's default memory pool; capturable in a CUDA
// graph); the backward carves it from the caller's workspace (backward_workspace_bytes
// counts it). Nothing is staged when head_dim is a multiple of 8 and K/V are not paged.
// Host code; the copy kernels live in staging.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "src/core/params.hpp"

namespace flashattn::cuda::staging {

inline constexpr std::int64_t kHeadDimMultiple = 8;  // what the kernels' 16-byte row chunks need

inline std::int64_t padded_head_dim(std::int64_t head_dim) {
  return (head_dim + kHeadDimMultiple - 1) / kHeadDimMultiple * kHeadDimMultiple;
}
inline bool needs_head_dim_padding(const AttentionParams& params) { return params.head_dim % kHeadDimMultiple != 0; }

// A [batch, rows, heads, columns] view of 16-bit elements (varlen: batch 1, batch stride 0).
struct RowsView {
  void* data = nullptr;
  std::int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
};

// The dense [rows, heads, padded_head_dim] layout of staged tensors, as a RowsView of
// `batch` batches of `rows` rows (batch 1 for varlen).
inline RowsView dense_view(void* data, std::int64_t rows_per_batch, std::int64_t heads, std::int64_t columns) {
  return RowsView{data, rows_per_batch * heads * columns, heads * columns, columns};
}

// dst[b, r, h, c] = c < src_columns ? src[b, r, h, c] : 0 for c < dst_columns: pads
// (dst_columns > src_columns) or crops (dst_columns < src_columns). Rows r >= *maybe_row_end
// (device int32, e.g. cu_seqlens_q + batch: rows no sequence owns) are left untouched.
void copy_columns(const RowsView& src, std::int64_t src_columns, const RowsView& dst, std::int64_t dst_columns,
                  std::int64_t batch, std::int64_t rows, std::int64_t heads, const std::int32_t* maybe_row_end,
                  cudaStream_t stream);

// Paged K/V (params.is_paged()): key j of sequence b, zero-padded to dst_columns, into
// row cu_seqlens_k[b] + j of dst_k/dst_v (dense [dst_rows, heads_kv, dst_columns]);
// rows past dst_rows are skipped, page ids clamped into the pool (params.page_block).
// dst rows no sequence owns are zeroed first: the kernels may load them (masked), and
// 0 * garbage could be NaN.
void gather_paged_kv(const AttentionParams& params, void* dst_k, void* dst_v, std::int64_t dst_rows,
                     std::int64_t dst_columns, cudaStream_t stream);

// Stream-ordered device scratch, freed on the same stream when it goes out of scope.
class StreamScratch {
 public:
  StreamScratch(std::size_t bytes, cudaStream_t stream);
  ~StreamScratch();
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  unsigned char* data() const { return data_; }

 private:
  unsigned char* data_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace flashattn::cuda::staging
