// bench/gpu/ladder/naive_attention.cu — see naive_attention.hpp.
#include "bench/gpu/ladder/naive_attention.hpp"

#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "bench/gpu/ladder/cuda_check.hpp"
#include "bench/gpu/ladder/element.cuh"
#include "flashattn/mask.hpp"

namespace ladder {
namespace {

constexpr int kSoftmaxThreads = 256;

// Block-wide reduction of one float per thread; every thread gets the result.
template <class Op>
__device__ float block_reduce(float value, Op op, float* scratch /* (kSoftmaxThreads / 32) */) {
  for (int offset = 16; offset > 0; offset /= 2) value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = scratch[0];
  for (int w = 1; w < kSoftmaxThreads / 32; ++w) value = op(value, scratch[w]);
  return value;
}

// Step 2: one CTA per (query row, head) of batch item `batch_index`. Reads the row of
// S three times (max, sum, write) — the HBM round trip FlashAttention removes.
template <class Element>
__global__ void __launch_bounds__(kSoftmaxThreads)
    naive_softmax_kernel(flashattn::AttentionParams params, std::int64_t batch_index,
                         const float* scores /* (heads, seqlen_q, seqlen_k) */,
                         Element* probs /* (heads, seqlen_q, seqlen_k) */, float* lse /* (batch, heads, seqlen_q) */) {
  __shared__ float scratch[kSoftmaxThreads / 32];
  const std::int64_t row = blockIdx.x;
  const std::int64_t head = blockIdx.y;
  const std::int64_t seqlen_k = params.seqlen_k;
  const std::int64_t row_offset = (head * params.seqlen_q + row) * seqlen_k;
  const float* score_row = scores + row_offset;  // (seqlen_k)
  Element* prob_row = probs + row_offset;        // (seqlen_k)
  const flashattn::MaskRule mask = params.mask_of(batch_index);
  const std::int64_t col_begin = mask.col_begin(row);
  const std::int64_t col_end = mask.col_end(row);

  float row_max = -INFINITY;
  for (std::int64_t col = col_begin + threadIdx.x; col < col_end; col += kSoftmaxThreads)
    row_max = fmaxf(row_max, score_row[col]);
  row_max = block_reduce(row_max, [](float a, float b) { return fmaxf(a, b); }, scratch);

  float row_sum = 0.0f;
  for (std::int64_t col = col_begin + threadIdx.x; col < col_end; col += kSoftmaxThreads)
    row_sum += expf(score_row[col] - row_max);
  row_sum = block_reduce(row_sum, [](float a, float b) { return a + b; }, scratch);

  // A fully masked row has no terms: P = 0 and LSE = -inf (row_max is -inf there).
  const float inverse_sum = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
  for (std::int64_t col = threadIdx.x; col < seqlen_k; col += kSoftmaxThreads) {
    const bool is_allowed = col >= col_begin && col < col_end;
    prob_row[col] = from_float<Element>(is_allowed ? expf(score_row[col] - row_max) * inverse_sum : 0.0f);
  }
  // The LSE buffer is this class's own dense (batch, heads, seqlen_q) array; the
  // params' LSE strides describe the caller's maybe_lse, which the ladder does not pass.
  if (threadIdx.x == 0)
    lse[(batch_index * params.heads_q + head) * params.seqlen_q + row] =
        row_sum > 0.0f ? row_max + logf(row_sum) : -INFINITY;
}

const char* byte_pointer(const void* p, std::int64_t elements, std::size_t element_size) {
  return static_cast<const char*>(p) + elements * static_cast<std::int64_t>(element_size);
}

}  // namespace

NaiveAttention::NaiveAttention(const flashattn::AttentionParams& params, cublasHandle_t handle, cudaStream_t stream)
    : params_(params), handle_(handle), stream_(stream) {
  if (params.group_size != 1 || params.has_softcap() || params.is_varlen())
    throw std::invalid_argument("ladder naive: MHA, no softcap, no varlen only");
  const std::size_t scores = static_cast<std::size_t>(params.heads_q * params.seqlen_q * params.seqlen_k);
  const std::size_t lse_count = static_cast<std::size_t>(params.batch * params.heads_q * params.seqlen_q);
  const std::size_t scores_bytes = scores * sizeof(float);
  const std::size_t probs_bytes = scores * flashattn::dtype_size(params.dtype);
  const std::size_t lse_bytes = lse_count * sizeof(float);
  LADDER_CUDA_CHECK(cudaMalloc(&scores_, scores_bytes));
  LADDER_CUDA_CHECK(cudaMalloc(&probs_, probs_bytes));
  LADDER_CUDA_CHECK(cudaMalloc(&lse_, lse_bytes));
  extra_bytes_ = scores_bytes + probs_bytes + lse_bytes;
}

NaiveAttention::~NaiveAttention() {
  cudaFree(scores_);
  cudaFree(probs_);
  cudaFree(lse_);
}

void NaiveAttention::run() {
  const flashattn::AttentionParams& p = params_;
  const std::size_t element_size = flashattn::dtype_size(p.dtype);
  const cudaDataType_t element_type = cublas_type(p.dtype);
  const int seqlen_q = static_cast<int>(p.seqlen_q);
  const int seqlen_k = static_cast<int>(p.seqlen_k);
  const int head_dim = static_cast<int>(p.head_dim);
  const int heads = static_cast<int>(p.heads_q);
  const float scale = p.softmax_scale;
  const float one = 1.0f;
  const float zero = 0.0f;
  LADDER_CUBLAS_CHECK(cublasSetStream(handle_, stream_));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    // cuBLAS is column-major: a row-major (rows, cols) matrix with row stride ld is
    // its column-major transpose. Row-major S (Nq, Nk) is column-major S^T = K Q^T,
    // where K's buffer read column-major is K^T (d, Nk) -> op T, Q's is Q^T (d, Nq) -> op N.
    LADDER_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        handle_, CUBLAS_OP_T, CUBLAS_OP_N, seqlen_k, seqlen_q, head_dim, &scale,
        byte_pointer(p.k, p.k_offset(b, 0), element_size), element_type, static_cast<int>(p.k_row_stride),
        p.k_head_stride, byte_pointer(p.q, p.q_offset(b, 0), element_size), element_type,
        static_cast<int>(p.q_row_stride), p.q_head_stride, &zero, scores_, CUDA_R_32F, seqlen_k,
        static_cast<long long>(seqlen_q) * seqlen_k, heads, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));

    dispatch_element(p.dtype, [&](auto element) {
      using Element = decltype(element);
      naive_softmax_kernel<Element><<<dim3(seqlen_q, heads), kSoftmaxThreads, 0, stream_>>>(
          p, b, scores_, static_cast<Element*>(probs_), lse_);
      LADDER_CHECK_LAUNCH("naive_softmax_kernel");
    });

    // Row-major O (Nq, d) is column-major O^T = V^T P^T: V's buffer read column-major
    // is V^T (d, Nk) -> op N, P's is P^T (Nk, Nq) -> op N.
    LADDER_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        handle_, CUBLAS_OP_N, CUBLAS_OP_N, head_dim, seqlen_q, seqlen_k, &one,
        byte_pointer(p.v, p.v_offset(b, 0), element_size), element_type, static_cast<int>(p.v_row_stride),
        p.v_head_stride, probs_, element_type, seqlen_k, static_cast<long long>(seqlen_q) * seqlen_k, &zero,
        const_cast<char*>(byte_pointer(p.out, p.out_offset(b, 0), element_size)), element_type,
        static_cast<int>(p.out_row_stride), p.out_head_stride, heads, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace ladder
