// bench/gpu/ladder/fa1_attention.hpp — rung 2 of the ladder: FlashAttention-1
// (Algorithm 1 of the paper, the flash-attention-minimal kernel of seed 000) in
// float32: K/V blocks in the outer loop, Q blocks in the inner loop, and the running
// O, l, m of every query row kept in HBM and rescaled at every step. One CTA per
// (head, batch item), as in the minimal kernel. Extra memory is O(N): the float32
// O accumulator plus l and m (and the LSE it returns).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "src/core/params.hpp"

namespace ladder {

// Block sizes. Deliberately Br != Bc: seed 000 notes that the minimal kernel is
// wrong when they differ; this one is right for any pair (see fa1_attention.cu).
inline constexpr int kFa1BlockM = 64;  // Br: query rows per Q block = threads per CTA
inline constexpr int kFa1BlockN = 32;  // Bc: key rows per K/V block

class Fa1Attention {
 public:
  // Allocates O (float32), l, m and the LSE. MHA, no softcap, no varlen; head_dim 64 or 128.
  Fa1Attention(const flashattn::AttentionParams& params, cudaStream_t stream);
  ~Fa1Attention();
  Fa1Attention(const Fa1Attention&) = delete;
  Fa1Attention& operator=(const Fa1Attention&) = delete;

  // Writes params.out ([batch, seqlen_q, heads, head_dim], input dtype) and lse().
  void run();
  const float* lse() const { return lse_; }  // [batch, heads, seqlen_q], natural log
  std::size_t extra_bytes() const { return extra_bytes_; }

 private:
  flashattn::AttentionParams params_;
  cudaStream_t stream_;
  float* out_accumulator_ = nullptr;  // (batch, heads, seqlen_q, head_dim) float32
  float* row_max_ = nullptr;          // (batch, heads, seqlen_q) m, log2 units
  float* row_sum_ = nullptr;          // (batch, heads, seqlen_q) l
  float* lse_ = nullptr;              // (batch, heads, seqlen_q)
  std::size_t extra_bytes_ = 0;
};

}  // namespace ladder
