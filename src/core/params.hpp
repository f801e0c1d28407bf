// src/core/params.hpp — the one plain parameter struct every backend reads.
//
// Built once by validation (src/core/validate.cpp) from the public arguments:
// raw pointers, int64 strides in elements, derived scalars computed on the host.
// No framework types; usable from host and device code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashattn/block_mask.hpp"
#include "flashattn/config.hpp"
#include "flashattn/dropout.hpp"
#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "flashattn/score.hpp"
#include "flashattn/tensor.hpp"
#include "src/core/mask_tables.hpp"

namespace flashattn {

// A device-resident index clamped into [0, count) (0 for an empty pool): a hostile index
// gives wrong values, never an access outside its tensor.
FLASHATTN_HOST_DEVICE std::int64_t clamp_index(std::int64_t index, std::int64_t count) {
  return index < 0 ? 0 : (index >= count ? (count > 0 ? count - 1 : 0) : index);
}

struct AttentionParams {
  DType dtype = DType::float16;  // of q, k, v, out (and dout/dq/dk/dv in the backward pass)
  // float8_e4m3 for FP8 q/k/v (dtype is then out's: bfloat16 or float16), else = dtype.
  DType input_dtype = DType::float16;
  Device device{};

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* maybe_lse = nullptr;

  // Sizes. With varlen, batch is the number of sequences and seqlen_* the maxima.
  std::int64_t batch = 0;
  std::int64_t seqlen_q = 0;
  std::int64_t seqlen_k = 0;
  std::int64_t heads_q = 0;
  std::int64_t heads_kv = 0;
  std::int64_t head_dim = 0;
  std::int64_t group_size = 1;  // heads_q / heads_kv (GQA); query head h reads kv head h / group_size

  // Strides in elements. Varlen tensors have no batch dimension: batch strides are 0
  // and sequence b starts at row cu_seqlens[b].
  std::int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  std::int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  std::int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  std::int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  // LSE: dense float32, [batch, heads, seqlen_q] or varlen [heads, total_q].
  std::int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 1;

  const std::int32_t* maybe_cu_seqlens_q = nullptr;
  const std::int32_t* maybe_cu_seqlens_k = nullptr;
  std::int64_t total_q = 0;  // rows of the packed q (varlen) or batch * seqlen_q
  std::int64_t total_k = 0;  // paged: rows of the keys once gathered (CPU: cu_seqlens_k[batch]; CUDA: batch * max_seqlen_k)

  // Paged K/V (varlen forward only; VarlenArgs::maybe_block_table): k/v are pools
  // [num_blocks, page_size, heads_kv, head_dim] (k_batch_stride = the page stride) and
  // key j of sequence b is row j % page_size of page
  // maybe_block_table[b * block_table_batch_stride + j / page_size]; cu_seqlens_k gives
  // the lengths only. No kernel reads this layout: each backend first gathers the keys
  // into packed varlen k/v (cpu/backend.cpp, cuda/staging.cu) and runs on those.
  const std::int32_t* maybe_block_table = nullptr;
  std::int64_t block_table_batch_stride = 0;
  std::int64_t max_blocks_per_seq = 0;
  std::int64_t page_size = 0;
  std::int64_t num_blocks = 0;

  float softmax_scale = 1.0f;
  float softmax_scale_log2 = 1.0f;  // softmax_scale * log2(e): scores go straight into exp2
  float softcap = 0.0f;             // 0 = off; else s -> softcap * tanh(s / softcap)
  std::int64_t window_left = -1;    // normalised: -1 = unbounded; causal sets window_right = 0
  std::int64_t window_right = -1;
  bool is_causal = false;

  // ALiBi: slope of (b, h) at maybe_alibi_slopes[b * alibi_batch_stride + h] (stride 0
  // for one slope per head); null = no bias.
  const float* maybe_alibi_slopes = nullptr;
  std::int64_t alibi_batch_stride = 0;

  // Dropout: keep_threshold < DropoutRule::kKeepAll when on. Seed and offset are the
  // host values below, or read from maybe_dropout_seed_offset (int64 {seed, offset} in
  // the tensors' memory) when it is set.
  std::uint32_t dropout_keep_threshold = DropoutRule::kKeepAll;
  float dropout_inverse_keep = 1.0f;
  std::uint64_t dropout_seed = 0;
  std::uint64_t dropout_offset = 0;
  const std::int64_t* maybe_dropout_seed_offset = nullptr;

  // FP8 descales (AttentionOptions::maybe_{q,k,v}_descale), float32 of (b, kv head h)
  // at ptr[b * strides[0] + h * strides[1]]; null = 1.
  const float* maybe_q_descale = nullptr;
  const float* maybe_k_descale = nullptr;
  const float* maybe_v_descale = nullptr;
  std::int64_t q_descale_strides[2] = {0, 0};
  std::int64_t k_descale_strides[2] = {0, 0};
  std::int64_t v_descale_strides[2] = {0, 0};
  FLASHATTN_HOST_DEVICE bool is_fp8() const { return input_dtype == DType::float8_e4m3; }

  // Dense attn_mask (AttentionOptions::maybe_attn_mask): element (b, h, row, col) at
  // b * s[0] + h * s[1] + row * s[2] + col * s[3], strides 0 on broadcast dimensions.
  // Boolean (attn_mask_is_bias false: nonzero byte = allowed) or an additive bias in
  // attn_mask_dtype (natural-log units). Null = none.
  const void* maybe_attn_mask = nullptr;
  DType attn_mask_dtype = DType::boolean;
  bool attn_mask_is_bias = false;
  std::int64_t attn_mask_strides[4] = {0, 0, 0, 0};
  // Block-sparse mask (flashattn/block_mask.hpp); block_mask.present() when given.
  BlockMaskView block_mask;
  // The CUDA backend's device tables of the two masks above (src/core/mask_tables.hpp),
  // filled by src/cuda/masks/ just before a kernel runs; absent on the CPU.
  DeviceMask device_mask;

  FLASHATTN_HOST_DEVICE bool is_varlen() const { return maybe_cu_seqlens_q != nullptr; }
  FLASHATTN_HOST_DEVICE bool is_paged() const { return maybe_block_table != nullptr; }
  // Page pool id of page `page` of sequence b, clamped into [0, num_blocks): a hostile
  // device-resident table gives wrong values, never an access outside k/v (as the
  // decode kernels' KVCacheParams::page_block).
  FLASHATTN_HOST_DEVICE std::int64_t page_block(std::int64_t b, std::int64_t page) const {
    return clamp_index(page < max_blocks_per_seq ? maybe_block_table[b * block_table_batch_stride + page] : 0, num_blocks);
  }
  FLASHATTN_HOST_DEVICE bool has_softcap() const { return softcap > 0.0f; }
  FLASHATTN_HOST_DEVICE bool has_alibi() const { return maybe_alibi_slopes != nullptr; }
  FLASHATTN_HOST_DEVICE bool has_dropout() const { return dropout_keep_threshold < DropoutRule::kKeepAll; }
  // Whether every head's score rule is a plain positive scale (the kernels' fast path).
  FLASHATTN_HOST_DEVICE bool score_is_positive_scale() const { return !has_softcap() && !has_alibi(); }
  FLASHATTN_HOST_DEVICE bool has_attn_mask() const { return maybe_attn_mask != nullptr; }
  FLASHATTN_HOST_DEVICE bool has_block_mask() const { return block_mask.present(); }
  FLASHATTN_HOST_DEVICE std::int64_t attn_mask_offset(std::int64_t b, std::int64_t h, std::int64_t row, std::int64_t col) const {
    return b * attn_mask_strides[0] + h * attn_mask_strides[1] + row * attn_mask_strides[2] + col * attn_mask_strides[3];
  }
  FLASHATTN_HOST_DEVICE bool is_local() const { return window_left >= 0 || (window_right >= 0 && !is_causal); }

  // Per-sequence geometry (varlen-aware). cu_seqlens may be device-resident and is then
  // not checked on the host (CUDA graphs; host-visible ones are validated, so this is a
  // no-op for them): sequence b's rows are cu_seqlens[b], cu_seqlens[b + 1] clamped into
  // [0, total] with the end >= the start, and at most max_seqlen (seqlen_q/seqlen_k)
  // long. A hostile cu_seqlens therefore never makes a kernel read or write outside
  // q/k/v/out/LSE/dq/dk/dv or their workspaces: sequence b covers other (in-range) rows,
  // its output is garbage-but-in-range, and rows no sequence covers are left unwritten.
  // Two loads and a few compares per call; the kernels call these once per CTA.
  FLASHATTN_HOST_DEVICE std::int64_t q_start(std::int64_t b) const {
    return maybe_cu_seqlens_q ? MaskRule::clamp(maybe_cu_seqlens_q[b], 0, total_q) : 0;
  }
  FLASHATTN_HOST_DEVICE std::int64_t k_start(std::int64_t b) const {
    return maybe_cu_seqlens_k ? MaskRule::clamp(maybe_cu_seqlens_k[b], 0, total_k) : 0;
  }
  FLASHATTN_HOST_DEVICE std::int64_t seqlen_q_of(std::int64_t b) const {
    if (!maybe_cu_seqlens_q) return seqlen_q;
    const std::int64_t start = q_start(b);
    const std::int64_t end = MaskRule::clamp(maybe_cu_seqlens_q[b + 1], start, total_q);
    return end - start < seqlen_q ? end - start : seqlen_q;
  }
  FLASHATTN_HOST_DEVICE std::int64_t seqlen_k_of(std::int64_t b) const {
    if (!maybe_cu_seqlens_k) return seqlen_k;
    const std::int64_t start = k_start(b);
    const std::int64_t end = MaskRule::clamp(maybe_cu_seqlens_k[b + 1], start, total_k);
    return end - start < seqlen_k ? end - start : seqlen_k;
  }
  FLASHATTN_HOST_DEVICE MaskRule mask_of(std::int64_t b) const {
    return MaskRule{seqlen_q_of(b), seqlen_k_of(b), window_left, window_right};
  }
  // The score rule of (sequence b, query head h) under b's mask (flashattn/score.hpp).
  FLASHATTN_HOST_DEVICE ScoreRule score_of(std::int64_t b, std::int64_t h, const MaskRule& mask) const {
    return score_of_slope(alibi_slope_log2_of(b, h), mask);
  }
  // score_of in two parts, for kernels that keep only the slope (the one memory read)
  // across their loops and rebuild the rule where they use it.
  FLASHATTN_HOST_DEVICE float alibi_slope_log2_of(std::int64_t b, std::int64_t h) const {
    return maybe_alibi_slopes != nullptr
               ? maybe_alibi_slopes[b * alibi_batch_stride + h] * static_cast<float>(online_softmax::kLog2e)
               : 0.0f;
  }
  FLASHATTN_HOST_DEVICE ScoreRule score_of_slope(float alibi_slope_log2, const MaskRule& mask) const {
    ScoreRule rule;
    rule.scale_log2 = softmax_scale_log2;
    if (has_softcap()) {
      rule.softcap_input_scale = softmax_scale / softcap;
      rule.softcap_log2 = softcap * static_cast<float>(online_softmax::kLog2e);
    }
    rule.alibi_slope_log2 = alibi_slope_log2;
    rule.diagonal = mask.seqlen_k - mask.seqlen_q;
    return rule;
  }
  // The dropout rule of this call (flashattn/dropout.hpp); seed and offset read from
  // memory when given there (device memory on the GPU: call it in the kernel).
  FLASHATTN_HOST_DEVICE DropoutRule dropout() const {
    DropoutRule rule;
    rule.keep_threshold = dropout_keep_threshold;
    rule.inverse_keep = dropout_inverse_keep;
    rule.seed = dropout_seed;
    rule.offset = dropout_offset;
    if (maybe_dropout_seed_offset != nullptr) {
      rule.seed = static_cast<std::uint64_t>(maybe_dropout_seed_offset[0]);
      rule.offset = static_cast<std::uint64_t>(maybe_dropout_seed_offset[1]);
    }
    return rule;
  }
  // The dropout generator's head index of (sequence b, query head h).
  FLASHATTN_HOST_DEVICE std::uint32_t dropout_head(std::int64_t b, std::int64_t h) const {
    return static_cast<std::uint32_t>(b * heads_q + h);
  }
  // Element offsets of (sequence b, row 0, head h) in each tensor.
  FLASHATTN_HOST_DEVICE std::int64_t q_offset(std::int64_t b, std::int64_t h) const {
    return b * q_batch_stride + q_start(b) * q_row_stride + h * q_head_stride;
  }
  FLASHATTN_HOST_DEVICE std::int64_t k_offset(std::int64_t b, std::int64_t h_kv) const {
    return b * k_batch_stride + k_start(b) * k_row_stride + h_kv * k_head_stride;
  }
  FLASHATTN_HOST_DEVICE std::int64_t v_offset(std::int64_t b, std::int64_t h_kv) const {
    return b * v_batch_stride + k_start(b) * v_row_stride + h_kv * v_head_stride;
  }
  FLASHATTN_HOST_DEVICE std::int64_t out_offset(std::int64_t b, std::int64_t h) const {
    return b * out_batch_stride + q_start(b) * out_row_stride + h * out_head_stride;
  }
  FLASHATTN_HOST_DEVICE std::int64_t lse_offset(std::int64_t b, std::int64_t h) const {
    return b * lse_batch_stride + q_start(b) * lse_row_stride + h * lse_head_stride;
  }
};

// The backward pass reads the forward's tensors (out, LSE required) plus dout and
// writes dq/dk/dv with their own strides.
struct BackwardParams : AttentionParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  const float* lse = nullptr;  // required (the same layout as maybe_lse)

  std::int64_t dout_batch_stride = 0, dout_row_stride = 0, dout_head_stride = 0;
  std::int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  std::int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  std::int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  bool deterministic = false;
  void* maybe_workspace = nullptr;
  // dBias (BackwardArgs::maybe_dbias): attn_mask's shape [B|1, H|1, seqlen_q|1,
  // seqlen_k|1] (dbias_shape), dtype attn_mask_dtype, its own strides. Null = none.
  void* maybe_dbias = nullptr;
  std::int64_t dbias_shape[4] = {0, 0, 0, 0};
  std::int64_t dbias_strides[4] = {0, 0, 0, 0};
  std::size_t workspace_bytes = 0;

  FLASHATTN_HOST_DEVICE std::int64_t dout_offset(std::int64_t b, std::int64_t h) const {
    return b * dout_batch_stride + q_start(b) * dout_row_stride + h * dout_head_stride;
  }
  FLASHATTN_HOST_DEVICE std::int64_t dq_offset(std::int64_t b, std::int64_t h) const {
    return b * dq_batch_stride + q_start(b) * dq_row_stride + h * dq_head_stride;
  }
  FLASHATTN_HOST_DEVICE std::int64_t dk_offset(std::int64_t b, std::int64_t h_kv) const {
    return b * dk_batch_stride + k_start(b) * dk_row_stride + h_kv * dk_head_stride;
  }
  FLASHATTN_HOST_DEVICE std::int64_t dv_offset(std::int64_t b, std::int64_t h_kv) const {
    return b * dv_batch_stride + k_start(b) * dv_row_stride + h_kv * dv_head_stride;
  }
};

}  // namespace flashattn
