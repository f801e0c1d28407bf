// src/core/kvcache_params.hpp — the plain parameter struct of forward_with_kvcache.
//
// Built once by validate_kvcache (src/core/validate_kvcache.cpp). `attention`
// carries what plain attention needs (q/out/LSE pointers and strides, heads,
// head_dim, scale, mask, softcap); its k/v pointers and strides describe the
// cache: batch stride = stride between cache sequences (contiguous) or between
// pages (paged). attention.seqlen_k is the per-sequence capacity; the per-sequence
// key count is seqlen_k_of(b). Host+device usable.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashattn/config.hpp"
#include "flashattn/mask.hpp"
#include "src/core/params.hpp"

namespace flashattn {

struct KVCacheParams {
  AttentionParams attention;

  void* k_cache = nullptr;  // written when appending; attention.k/v alias these
  // FP8 cache: float8_e4m3 (attention.dtype stays q's); the descales are
  // attention.maybe_k_descale / maybe_v_descale. Else = attention.dtype.
  DType cache_dtype = DType::float16;
  void* v_cache = nullptr;
  std::int64_t capacity = 0;  // cache positions per sequence

  // Per-sequence lengths: maybe_cache_seqlens[b] if given, else uniform_cache_seqlen.
  const std::int32_t* maybe_cache_seqlens = nullptr;
  std::int64_t uniform_cache_seqlen = 0;
  const std::int32_t* maybe_cache_batch_idx = nullptr;  // contiguous cache: cache row of sequence b
  const std::int32_t* maybe_cache_leftpad = nullptr;
  std::int64_t cache_batch = 0;  // rows (dimension 0) of k_cache: sequences (contiguous) or pages (paged)

  // Paged cache: page p of sequence b is block maybe_block_table[b * block_table_stride + p].
  const std::int32_t* maybe_block_table = nullptr;
  std::int64_t block_table_stride = 0;
  std::int64_t page_size = 0;
  std::int64_t num_blocks = 0;

  // New keys/values appended at positions cache_seqlen(b)... before attending.
  const void* maybe_k_new = nullptr;
  const void* maybe_v_new = nullptr;
  std::int64_t seqlen_new = 0;
  // Of k_new/v_new: attention.dtype, quantised into an FP8 cache with the descales
  // (float8::quantize_e4m3), or float8_e4m3 (FP8 cache only), copied as they are.
  DType new_dtype = DType::float16;
  std::int64_t k_new_batch_stride = 0, k_new_row_stride = 0, k_new_head_stride = 0;
  std::int64_t v_new_batch_stride = 0, v_new_row_stride = 0, v_new_head_stride = 0;

  // Rotary embedding: cos/sin [seqlen_ro, rotary_dim / 2] in the dtype of q.
  const void* maybe_rotary_cos = nullptr;
  const void* maybe_rotary_sin = nullptr;
  std::int64_t rotary_dim = 0;
  std::int64_t rotary_cos_row_stride = 0, rotary_sin_row_stride = 0;
  bool is_rotary_interleaved = true;

  int num_splits = 1;  // resolved (>= 1)
  // Split workspace (num_splits > 1): float32 partial outputs
  // [num_splits, batch, heads_q, seqlen_q, head_dim] then LSEs [num_splits, batch, heads_q, seqlen_q].
  void* maybe_workspace = nullptr;
  std::size_t workspace_bytes = 0;

  FLASHATTN_HOST_DEVICE bool is_paged() const { return maybe_block_table != nullptr; }
  FLASHATTN_HOST_DEVICE bool has_append() const { return maybe_k_new != nullptr; }
  FLASHATTN_HOST_DEVICE bool has_rotary() const { return maybe_rotary_cos != nullptr; }
  FLASHATTN_HOST_DEVICE bool is_fp8_cache() const { return cache_dtype == DType::float8_e4m3; }
  // The descales of (sequence b, kv head h); 1 where none was given.
  FLASHATTN_HOST_DEVICE float k_descale(std::int64_t b, std::int64_t h) const {
    const AttentionParams& a = attention;
    return a.maybe_k_descale ? a.maybe_k_descale[b * a.k_descale_strides[0] + h * a.k_descale_strides[1]] : 1.0f;
  }
  FLASHATTN_HOST_DEVICE float v_descale(std::int64_t b, std::int64_t h) const {
    const AttentionParams& a = attention;
    return a.maybe_v_descale ? a.maybe_v_descale[b * a.v_descale_strides[0] + h * a.v_descale_strides[1]] : 1.0f;
  }

  // Device-resident cache_seqlens, cache_leftpad, cache_batch_idx and block_table are not
  // checked on the host (CUDA graphs; host-visible ones are validated, so the clamps below
  // are no-ops for them). Every kernel reads them through these helpers, which keep every
  // access inside k_cache/v_cache (and the rotary tables):
  //  * cache_seqlens clamped into [0, capacity]; appends past the capacity are skipped;
  //  * cache_leftpad clamped into [0, capacity] (a negative leftpad is 0), and the key
  //    count into [0, capacity - leftpad];
  //  * cache_batch_idx: reads clamp it into [0, cache_batch) (attention over another
  //    sequence's cache row: garbage-but-in-range output), appends skip the sequence
  //    (nothing written);
  //  * block_table: page_block / page_is_valid below.
  // A hostile index thus gives a wrong (finite for finite caches) output, never a fault
  // or a write outside out/LSE/the cache.
  FLASHATTN_HOST_DEVICE std::int64_t cache_seqlen(std::int64_t b) const {
    const std::int64_t n = maybe_cache_seqlens ? maybe_cache_seqlens[b] : uniform_cache_seqlen;
    return n < 0 ? 0 : (n > capacity ? capacity : n);
  }
  FLASHATTN_HOST_DEVICE std::int64_t leftpad(std::int64_t b) const {
    const std::int64_t n = maybe_cache_leftpad ? maybe_cache_leftpad[b] : 0;
    return n < 0 ? 0 : (n > capacity ? capacity : n);
  }
  // Keys attended by sequence b: cache positions [leftpad(b), cache_seqlen(b) + seqlen_new),
  // at most up to the capacity.
  FLASHATTN_HOST_DEVICE std::int64_t seqlen_k_of(std::int64_t b) const {
    const std::int64_t first = leftpad(b);
    const std::int64_t n = cache_seqlen(b) + seqlen_new - first;
    return n < 0 ? 0 : (n > capacity - first ? capacity - first : n);
  }
  // The cache row of sequence b (contiguous cache): cache_batch_idx[b] clamped into
  // [0, cache_batch), or b.
  FLASHATTN_HOST_DEVICE std::int64_t cache_row(std::int64_t b) const {
    if (!maybe_cache_batch_idx) return b;
    return clamp_index(maybe_cache_batch_idx[b], cache_batch);
  }
  FLASHATTN_HOST_DEVICE bool cache_row_is_valid(std::int64_t b) const {
    if (!maybe_cache_batch_idx) return true;
    const std::int64_t row = maybe_cache_batch_idx[b];
    return row >= 0 && row < cache_batch;
  }
  FLASHATTN_HOST_DEVICE MaskRule mask_of(std::int64_t b) const {
    return MaskRule{attention.seqlen_q, seqlen_k_of(b), attention.window_left, attention.window_right};
  }
  // Element offset of (sequence b, cache position, kv head h) in k_cache / v_cache.
  FLASHATTN_HOST_DEVICE std::int64_t k_cache_offset(std::int64_t b, std::int64_t position, std::int64_t h) const {
    return row_base(b, position, attention.k_batch_stride, attention.k_row_stride) + h * attention.k_head_stride;
  }
  FLASHATTN_HOST_DEVICE std::int64_t v_cache_offset(std::int64_t b, std::int64_t position, std::int64_t h) const {
    return row_base(b, position, attention.v_batch_stride, attention.v_row_stride) + h * attention.v_head_stride;
  }
  // The block that entry `page` of a sequence's table row names, clamped into the page
  // pool: a device-resident table is not checked on the host (CUDA graphs), so a hostile
  // entry (page 7 of a 4-page cache) gives wrong values but never an access outside
  // k_cache/v_cache. Writes skip such pages instead (page_is_valid).
  FLASHATTN_HOST_DEVICE std::int64_t page_block(const std::int32_t* table_row, std::int64_t page) const {
    return clamp_index(page < block_table_stride ? table_row[page] : 0, num_blocks);
  }
  FLASHATTN_HOST_DEVICE bool page_is_valid(std::int64_t b, std::int64_t position) const {
    if (position < 0 || position >= capacity) return false;
    if (!maybe_block_table) return cache_row_is_valid(b);
    const std::int64_t block = maybe_block_table[b * block_table_stride + position / page_size];
    return block >= 0 && block < num_blocks;
  }
  FLASHATTN_HOST_DEVICE std::int64_t row_base(std::int64_t b, std::int64_t position, std::int64_t batch_stride,
                                              std::int64_t row_stride) const {
    if (maybe_block_table) {
      const std::int64_t block = page_block(maybe_block_table + b * block_table_stride, position / page_size);
      return block * batch_stride + (position % page_size) * row_stride;
    }
    return cache_row(b) * batch_stride + position * row_stride;
  }
  // Rotary position of query row i of sequence b (flash_attn's convention).
  FLASHATTN_HOST_DEVICE std::int64_t q_rotary_position(std::int64_t b, std::int64_t i) const {
    const bool per_row = attention.is_causal || attention.window_left >= 0 || attention.window_right >= 0;
    return cache_seqlen(b) + (per_row ? i : 0);
  }

  // Workspace layout (num_splits > 1).
  FLASHATTN_HOST_DEVICE std::int64_t partial_rows() const {
    return attention.batch * attention.heads_q * attention.seqlen_q;
  }
  // Index of (split, b, h, i) among partial rows; the output row holds head_dim floats.
  FLASHATTN_HOST_DEVICE std::int64_t partial_row(int split, std::int64_t b, std::int64_t h, std::int64_t i) const {
    return ((split * attention.batch + b) * attention.heads_q + h) * attention.seqlen_q + i;
  }
};

// Bytes of the split workspace for a problem of this size (0 for one split).
inline std::size_t kvcache_split_workspace_bytes(int num_splits, std::int64_t batch, std::int64_t heads_q,
                                                 std::int64_t seqlen_q, std::int64_t head_dim) {
  if (num_splits <= 1) return 0;
  const auto rows = static_cast<std::size_t>(num_splits) * static_cast<std::size_t>(batch * heads_q * seqlen_q);
  return rows * (static_cast<std::size_t>(head_dim) + 1) * sizeof(float);
}

}  // namespace flashattn
