// flashattn/block_mask.hpp — the block-sparse model of the mask contract
// (flashattn/mask.hpp): FlexAttention's BlockMask as a plain view (pointers and
// int64 strides, host/device), plus the element rule applied inside partial blocks.
//
// The (seqlen_q x seqlen_k) score matrix of one (batch, head) is cut into blocks of
// block_m query rows x block_n key columns; query block m is rows
// [m·block_m, min((m+1)·block_m, seqlen_q)). For each (b, h, m) the model lists
//   partial key blocks  kv_num_blocks[b,h,m] entries of kv_indices[b,h,m,:]            element rule applied
//   full key blocks     full_kv_num_blocks[b,h,m] entries of full_kv_indices[b,h,m,:]  no element rule
// and, transposed for the backward pass (K/V outer), for each (b, h, n)
//   partial query blocks q_num_blocks / q_indices, full ones full_q_num_blocks / full_q_indices.
// Blocks in neither list are empty and never visited (the IO saving of seed 003:
// the cost is proportional to the listed blocks). These are the names and shapes of
// torch.nn.attention.flex_attention.BlockMask, so its tensors can be passed as they are:
//   kv_num_blocks int32 [B|1, H|1, q_blocks]   kv_indices int32 [B|1, H|1, q_blocks, kv_capacity]
//   q_num_blocks  int32 [B|1, H|1, kv_blocks]  q_indices  int32 [B|1, H|1, kv_blocks, q_capacity]
// A size-1 batch or head dimension is broadcast (its stride is read as 0). A block
// listed in both lists of a row, or twice in one, is invalid input (validation
// rejects it on the CPU).
//
// Safety: a list never yields an index outside [0, blocks) nor more entries than its
// capacity, whatever the memory holds (BlockList clamps the count and maps a bad
// index to -1, which a kernel skips), so a kernel cannot read out of range even if
// an index slipped past validation (device memory is not validated on the host).
//
// The element rule of partial blocks (ElementRule) is a conjunction of
//   band       diagonal_offset + row - window_left <= col <= row + diagonal_offset + window_right
//              (-1 = unbounded side; causal = window_right 0). diagonal_offset 0 is the
//              top-left alignment of PyTorch and FlexAttention (q_idx >= kv_idx);
//              seqlen_k - seqlen_q is flash_attn's bottom-right one.
//   prefix-LM  with prefix lengths: col < prefix_length[b] is allowed whatever the band says
//   documents  q_document_ids[b, row] == k_document_ids[b, col] (packed sequences)
//   bits       a bit mask stored for the partial blocks only: partial block id p (from
//              partial_ids, shaped like kv_indices, or q_partial_ids like q_indices) owns
//              block_m rows of words_per_row = ceil(block_n / 32) 32-bit words; bit
//              (r, c) of the block is (bits[(p·block_m + r)·words_per_row + c/32] >> c%32) & 1.
//              Made once from a mask function or a dense boolean mask (python/flashattn/block_mask.py).
#pragma once

#include <cstdint>

#include "flashattn/config.hpp"
#include "flashattn/mask.hpp"

namespace flashattn {

// Block sizes a block mask may use: powers of two in [kMinMaskBlock, kMaxMaskBlock],
// so that a kernel tile and a mask block always divide one another.
inline constexpr std::int64_t kMinMaskBlock = 16;
inline constexpr std::int64_t kMaxMaskBlock = 1024;
FLASHATTN_HOST_DEVICE bool is_valid_mask_block_size(std::int64_t size) {
  return size >= kMinMaskBlock && size <= kMaxMaskBlock && (size & (size - 1)) == 0;
}
// log2 of a valid (power-of-two) block size: x / size = x >> shift and x % size =
// x & (size - 1) for x >= 0, never a 64-bit division (a subroutine call on the GPU,
// whose stack frame made the kernels that inline the element rule spill).
FLASHATTN_HOST_DEVICE int mask_block_shift(std::int64_t size) {
#ifdef __CUDA_ARCH__
  return __ffsll(size) - 1;
#else
  return __builtin_ctzll(static_cast<unsigned long long>(size));
#endif
}

// One row of a block list: `count` block indices, bounds-safe.
struct BlockList {
  const std::int32_t* indices = nullptr;
  const std::int32_t* maybe_ids = nullptr;  // the partial-block ids of the same entries (bits), or null
  std::int64_t stride = 1;
  std::int32_t count = 0;
  std::int32_t bound = 0;  // valid indices are [0, bound)

  // The i-th block (0 <= i < count), or -1 when the stored index is out of range.
  FLASHATTN_HOST_DEVICE std::int32_t at(std::int32_t i) const {
    const std::int32_t index = indices[i * stride];
    return index >= 0 && index < bound ? index : -1;
  }
  FLASHATTN_HOST_DEVICE std::int32_t id_at(std::int32_t i) const { return maybe_ids ? maybe_ids[i * stride] : -1; }
};

// An int32 [B|1, H|1, rows] count tensor and its [B|1, H|1, rows, capacity] index
// tensor (strides in elements, 0 on broadcast dimensions), optionally with the
// partial-block ids laid out like the indices (same strides).
struct BlockListTensor {
  const std::int32_t* num_blocks = nullptr;  // null = the list is absent (no blocks)
  const std::int32_t* indices = nullptr;
  const std::int32_t* maybe_ids = nullptr;
  std::int64_t num_strides[3] = {0, 0, 1};
  std::int64_t index_strides[4] = {0, 0, 0, 1};
  std::int64_t capacity = 0;  // size of the last index dimension

  FLASHATTN_HOST_DEVICE bool present() const { return num_blocks != nullptr; }
  FLASHATTN_HOST_DEVICE BlockList row(std::int64_t b, std::int64_t h, std::int64_t m, std::int32_t bound) const {
    BlockList list;
    if (!present()) return list;
    std::int32_t count = num_blocks[b * num_strides[0] + h * num_strides[1] + m * num_strides[2]];
    count = count < 0 ? 0 : (count > capacity ? static_cast<std::int32_t>(capacity) : count);
    const std::int64_t offset = b * index_strides[0] + h * index_strides[1] + m * index_strides[2];
    list.indices = indices + offset;
    list.maybe_ids = maybe_ids ? maybe_ids + offset : nullptr;
    list.stride = index_strides[3];
    list.count = count;
    list.bound = bound;
    return list;
  }
};

// The element rule of partial blocks (see the header): a conjunction of the enabled terms.
struct ElementRule {
  bool has_band = false;
  std::int64_t diagonal_offset = 0;  // 0 = top-left (PyTorch, FlexAttention)
  std::int64_t window_left = -1;     // -1 = unbounded
  std::int64_t window_right = -1;    // -1 = unbounded; 0 = causal
  const std::int32_t* maybe_prefix_lengths = nullptr;  // [B|1]: with the band, cols < prefix are allowed
  std::int64_t prefix_batch_stride = 0;
  const std::int32_t* maybe_q_document_ids = nullptr;  // [B|1, seqlen_q]
  const std::int32_t* maybe_k_document_ids = nullptr;  // [B|1, seqlen_k]
  std::int64_t q_document_batch_stride = 0, k_document_batch_stride = 0;
  const std::uint32_t* maybe_partial_bits = nullptr;  // [partial blocks, block_m, words_per_row]
  std::int64_t partial_block_count = 0;
  std::int64_t block_m = 0, block_n = 0, words_per_row = 0;

  FLASHATTN_HOST_DEVICE bool has_bits() const { return maybe_partial_bits != nullptr; }
  // Batch b's prefix-LM length (0 without a prefix).
  FLASHATTN_HOST_DEVICE std::int64_t prefix_length(std::int64_t b) const {
    return maybe_prefix_lengths != nullptr ? maybe_prefix_lengths[b * prefix_batch_stride] : 0;
  }
  FLASHATTN_HOST_DEVICE bool in_band(std::int64_t row, std::int64_t col) const {
    const std::int64_t diagonal = row + diagonal_offset;
    return (window_left < 0 || col >= diagonal - window_left) && (window_right < 0 || col <= diagonal + window_right);
  }
  // Whether (row, col) of batch b is allowed; `partial_id` is the id of the partial
  // block holding it (only read with bits; a bad id denies the element).
  FLASHATTN_HOST_DEVICE bool allowed(std::int64_t b, std::int64_t row, std::int64_t col, std::int32_t partial_id) const {
    if (has_band && !in_band(row, col)) {
      if (maybe_prefix_lengths == nullptr || col >= maybe_prefix_lengths[b * prefix_batch_stride]) return false;
    }
    if (maybe_q_document_ids != nullptr &&
        maybe_q_document_ids[b * q_document_batch_stride + row] != maybe_k_document_ids[b * k_document_batch_stride + col])
      return false;
    if (has_bits()) {
      if (partial_id < 0 || partial_id >= partial_block_count) return false;
      const std::int64_t r = row & (block_m - 1), c = col & (block_n - 1);  // powers of two
      const std::uint32_t word = maybe_partial_bits[(partial_id * block_m + r) * words_per_row + c / 32];
      if (((word >> (c % 32)) & 1u) == 0) return false;
    }
    return true;
  }
};

// The block-sparse model (see the header). Valid when block_m > 0.
struct BlockMaskView {
  std::int64_t block_m = 0, block_n = 0;        // BLOCK_SIZE (query, key)
  std::int64_t q_blocks = 0, kv_blocks = 0;     // ceil(seqlen_q / block_m), ceil(seqlen_k / block_n)
  BlockListTensor partial_kv, full_kv;          // per query block (forward, dQ)
  BlockListTensor partial_q, full_q;            // per key block (backward dK/dV), when given
  ElementRule rule;

  FLASHATTN_HOST_DEVICE bool present() const { return block_m > 0; }
  // K0: the key blocks of query block m of (b, h).
  FLASHATTN_HOST_DEVICE BlockList partial_key_blocks(std::int64_t b, std::int64_t h, std::int64_t m) const {
    return partial_kv.row(b, h, m, static_cast<std::int32_t>(kv_blocks));
  }
  FLASHATTN_HOST_DEVICE BlockList full_key_blocks(std::int64_t b, std::int64_t h, std::int64_t m) const {
    return full_kv.row(b, h, m, static_cast<std::int32_t>(kv_blocks));
  }
  // K0': the query blocks of key block n of (b, h) (backward pass).
  FLASHATTN_HOST_DEVICE BlockList partial_query_blocks(std::int64_t b, std::int64_t h, std::int64_t n) const {
    return partial_q.row(b, h, n, static_cast<std::int32_t>(q_blocks));
  }
  FLASHATTN_HOST_DEVICE BlockList full_query_blocks(std::int64_t b, std::int64_t h, std::int64_t n) const {
    return full_q.row(b, h, n, static_cast<std::int32_t>(q_blocks));
  }
};

}  // namespace flashattn
