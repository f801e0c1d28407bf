// src/core/dense_mask_blocks.hpp — a dense boolean attn_mask in the block-sparse form
// of flashattn/block_mask.hpp, so that it costs what its blocks cost (seed 003): empty
// blocks are never visited, full blocks skip the element test, and partial blocks read
// a compact bit mask instead of the mask's bytes.
//
// The mask [B|1, H|1, seqlen_q|1, seqlen_k|1] (strides 0 on broadcast dimensions) is cut
// into blocks of block_m rows x block_n columns per (b|1, h|1): a broadcast batch or head
// stays broadcast (one set of blocks for all). Every block gets
//   a code     DeviceMask::kEmptyBlock (no allowed element inside the sequences),
//              DeviceMask::kFullBlock  (every element inside the sequences allowed), or its
//              partial id = its position in the grid, dense_index(b, h, m, n)
//   bits       block_m rows x words_per_row words (block_mask.hpp's layout), for every
//              block, partial or not: elements outside the sequences are 0.
// Sizing the bits for the worst case (all blocks partial) makes every id and offset a
// function of the mask's shape alone, so the device conversion (src/cuda/masks) needs
// no host read of the mask (no synchronisation; capturable in a CUDA graph); the cost is
// 1 bit per element, 1/8 of the boolean mask. The same layout as the torch conversion
// (python/flashattn/_torch_block_mask.py).
//
// Both conversions — the CUDA kernel and build_dense_block_mask below (host memory, the
// CPU backend and the oracle of the kernel) — give identical codes and bits, and a
// flash path then sees a block mask with bits and no attn_mask: the element test of a
// partial block is ElementRule::allowed (bits), which equals the dense mask there.
//
// The CPU flash paths and the CUDA kernels convert by default (timed on the H200,
// 2026-11-27: causal/window/document forward 2.0-4.1x the per-element reads);
// FLASHATTN_DENSE_MASK=elements (read once per process) keeps the per-element reads of the
// dense mask. The reference algorithm always reads it densely.
#pragma once

#include <cstdint>
#include <vector>

#include "flashattn/block_mask.hpp"
#include "flashattn/config.hpp"
#include "src/core/mask_tables.hpp"
#include "src/core/params.hpp"

namespace flashattn {

// The block grid of a dense boolean mask (see the header). Host/device.
struct DenseMaskGrid {
  std::int64_t batches = 1, heads = 1;  // 1 on a broadcast dimension
  std::int64_t seqlen_q = 0, seqlen_k = 0;
  std::int64_t block_m = 0, block_n = 0;  // valid mask block sizes (powers of two)
  std::int64_t q_blocks = 0, kv_blocks = 0;
  std::int64_t words_per_row = 0;  // ceil(block_n / 32)

  FLASHATTN_HOST_DEVICE std::int64_t block_count() const { return batches * heads * q_blocks * kv_blocks; }
  FLASHATTN_HOST_DEVICE std::int64_t words_per_block() const { return block_m * words_per_row; }
  // The partial id of block (b, h, m, n) (b < batches, h < heads): its row-major position.
  FLASHATTN_HOST_DEVICE std::int64_t dense_index(std::int64_t b, std::int64_t h, std::int64_t m, std::int64_t n) const {
    return ((b * heads + h) * q_blocks + m) * kv_blocks + n;
  }
  // Elements of block (m, n) inside the sequences.
  FLASHATTN_HOST_DEVICE std::int64_t inside_count(std::int64_t m, std::int64_t n) const {
    const std::int64_t rows = seqlen_q - m * block_m < block_m ? seqlen_q - m * block_m : block_m;
    const std::int64_t cols = seqlen_k - n * block_n < block_n ? seqlen_k - n * block_n : block_n;
    return rows * cols;
  }
  // The code of a block with `allowed` of its `inside` elements allowed.
  FLASHATTN_HOST_DEVICE static std::int32_t code_of(std::int64_t allowed, std::int64_t inside, std::int64_t index) {
    if (allowed == 0) return DeviceMask::kEmptyBlock;
    return allowed == inside ? DeviceMask::kFullBlock : static_cast<std::int32_t>(index);
  }
  // The block mask that reads these bits: block sizes, no lists (a consumer takes the
  // kinds from the codes), the bits of every block as the element rule.
  BlockMaskView view(const std::uint32_t* bits) const {
    BlockMaskView v;
    v.block_m = block_m, v.block_n = block_n;
    v.q_blocks = q_blocks, v.kv_blocks = kv_blocks;
    v.rule.block_m = block_m, v.rule.block_n = block_n;
    v.rule.words_per_row = words_per_row;
    v.rule.maybe_partial_bits = bits;
    v.rule.partial_block_count = block_count();
    return v;
  }
};

// The mask block size for a kernel tile of `tile` rows or columns: the largest power of
// two that divides it, within [kMinMaskBlock, kMaxMaskBlock]. A power-of-two tile is
// then exactly one block (its partial tiles take the kernels' fast element pass, which
// reads one block's bits) and any other tile a whole number of blocks (80 = 5 x 16), so
// the block kinds classify kernel tiles exactly.
std::int64_t dense_mask_block_for_tile(std::int64_t tile);

// Whether params' masks are a dense boolean attn_mask alone (no block mask, no varlen,
// not broadcast along rows or columns): the case the conversion handles. A block mask with it keeps the per-element reads
// (two element rules would have to be combined), as does a float attn_mask (a bias).
bool is_dense_mask_convertible(const AttentionParams& params);

// Whether the conversion runs: unless FLASHATTN_DENSE_MASK=elements (read once per
// process), or a test overrides it.
bool is_dense_mask_conversion_requested();
// Tests: 1 converts, 0 does not, -1 follows the environment again.
void set_dense_mask_conversion_override(int mode);

// The grid of params' dense mask at these block sizes (is_dense_mask_convertible; valid
// block sizes); Error when its block count does not fit the int32 partial ids.
DenseMaskGrid dense_mask_grid(const AttentionParams& params, std::int64_t block_m, std::int64_t block_n);

// The block form in host memory, as FlexAttention lists plus the codes and bits of the
// header: for each (b|1, h|1, m) the partial and full key blocks in ascending order (the
// partial ones with their ids), the transposed lists, zero-filled past the counts.
struct DenseBlockMask {
  DenseMaskGrid grid;
  std::vector<std::int32_t> codes;  // [batches, heads, q_blocks, kv_blocks]
  std::vector<std::uint32_t> bits;  // [block_count, block_m, words_per_row]
  std::vector<std::int32_t> kv_num, full_kv_num;                // [batches, heads, q_blocks]
  std::vector<std::int32_t> kv_indices, full_kv_indices, partial_ids;  // [batches, heads, q_blocks, kv_blocks]
  std::vector<std::int32_t> q_num, full_q_num;                  // [batches, heads, kv_blocks]
  std::vector<std::int32_t> q_indices, full_q_indices, q_partial_ids;  // [batches, heads, kv_blocks, q_blocks]

  DenseBlockMask() = default;
  // The vectors are referenced by view(): no copies.
  DenseBlockMask(const DenseBlockMask&) = delete;
  DenseBlockMask& operator=(const DenseBlockMask&) = delete;

  // The block mask with lists and bits, pointing into this object.
  BlockMaskView view() const;
};

// Converts params' dense boolean mask (host memory) at these block sizes.
// num_threads: OpenMP threads of the conversion (0: OpenMP's default), as the CPU calls take.
void build_dense_block_mask(const AttentionParams& params, std::int64_t block_m, std::int64_t block_n, DenseBlockMask& out,
                            int num_threads = 0);

// The mask blocks of the CPU flash paths: 64 x 64, a few of them per key block of 128
// (performance only: any valid size gives the same results).
inline constexpr std::int64_t kCpuDenseMaskBlock = 64;

}  // namespace flashattn
