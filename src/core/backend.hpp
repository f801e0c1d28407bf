// src/core/backend.hpp — what the core (validation, dispatch) needs from each backend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashattn/attention.hpp"
#include "src/core/params.hpp"

namespace flashattn {

// What a backend accepts; validation reads it, so "supported" and "run" agree.
struct BackendLimits {
  const char* name = "";
  std::int64_t max_head_dim = 0;
  std::int64_t head_dim_multiple = 1;  // head_dim must be a multiple of this
  bool supports_float32 = false;
  bool supports_half = false;  // float16 and bfloat16
  bool supports_algorithm[kAlgorithmCount] = {true};  // indexed by Algorithm; automatic always
  // attn_mask, block masks and dBias (AttentionOptions::maybe_attn_mask/maybe_block_mask,
  // BackwardArgs::maybe_dbias). Off = refused with NotSupported naming the argument.
  bool supports_masks = false;
  // q/k/v in float8_e4m3 (forward only; out bfloat16/float16). The CUDA backend says
  // yes where the Hopper FP8 kernel is built; the device and problem are checked per
  // call by its dispatch (NotSupported naming the argument it cannot take).
  bool supports_fp8 = false;
};

// Plain description of a merge_attention_states call, shared by CPU and CUDA.
struct MergeParams {
  DType dtype = DType::float32;
  std::int64_t batch = 0, seqlen = 0, heads = 0, head_dim = 0;
  const void* out_a = nullptr;
  const void* out_b = nullptr;
  void* out = nullptr;
  const float* lse_a = nullptr;
  const float* lse_b = nullptr;
  float* lse = nullptr;
  std::int64_t out_strides[3][3] = {};  // [a|b|out][batch,row,head]
  std::int64_t lse_strides[3][3] = {};  // [a|b|out][batch,head,row]
};

namespace cpu {
BackendLimits limits() noexcept;
void forward(const AttentionParams& params, Algorithm algorithm, int num_threads);
void backward(const BackwardParams& params, Algorithm algorithm, int num_threads);
void merge_attention_states(const MergeParams& params);
}  // namespace cpu

namespace cuda {
// In a build without CUDA these report "unavailable" and throw NotSupported.
bool available() noexcept;
BackendLimits limits() noexcept;
void forward(const AttentionParams& params, Algorithm algorithm, void* stream);
void backward(const BackwardParams& params, void* stream);
std::size_t backward_workspace_bytes(const BackwardParams& params);
void merge_attention_states(const MergeParams& params, void* stream);
}  // namespace cuda

}  // namespace flashattn
