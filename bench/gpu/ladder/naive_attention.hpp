// bench/gpu/ladder/naive_attention.hpp — rung 1 of the ladder: the standard
// three-kernel attention of seed 000 ("传统的cuda实现"):
//   1. S = Q K^T * scale         cuBLAS, S in HBM as float32 (heads x Nq x Nk)
//   2. P = softmax(S)            one kernel, reads S, writes P in the input precision
//   3. O = P V                   cuBLAS, float32 accumulation
// Extra memory is O(N^2): S (4 bytes) + P (2 bytes) per score, for one batch item
// at a time (the batch items run one after another), plus the LSE.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "src/core/params.hpp"

namespace ladder {

class NaiveAttention {
 public:
  // Allocates S, P and the LSE for `params` (MHA, no softcap, no varlen; inputs on
  // the device). The cuBLAS handle is the caller's so its workspace is not counted.
  NaiveAttention(const flashattn::AttentionParams& params, cublasHandle_t handle, cudaStream_t stream);
  ~NaiveAttention();
  NaiveAttention(const NaiveAttention&) = delete;
  NaiveAttention& operator=(const NaiveAttention&) = delete;

  // Writes params.out ([batch, seqlen_q, heads, head_dim]) and lse().
  void run();
  const float* lse() const { return lse_; }  // [batch, heads, seqlen_q], natural log
  std::size_t extra_bytes() const { return extra_bytes_; }

 private:
  flashattn::AttentionParams params_;
  cublasHandle_t handle_;
  cudaStream_t stream_;
  float* scores_ = nullptr;  // (heads, seqlen_q, seqlen_k) float32
  void* probs_ = nullptr;    // (heads, seqlen_q, seqlen_k) in the input dtype
  float* lse_ = nullptr;     // (batch, heads, seqlen_q)
  std::size_t extra_bytes_ = 0;
};

}  // namespace ladder
