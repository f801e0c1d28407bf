// src/core/dense_mask_blocks.cpp — the host side of dense_mask_blocks.hpp.
#include "src/core/dense_mask_blocks.hpp"

#include <omp.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include "flashattn/error.hpp"

namespace flashattn {

std::int64_t dense_mask_block_for_tile(std::int64_t tile) {
  if (tile <= 0) return kMinMaskBlock;
  const std::int64_t lowest_bit = tile & -tile;  // the largest power of two dividing tile
  return lowest_bit < kMinMaskBlock ? kMinMaskBlock : (lowest_bit > kMaxMaskBlock ? kMaxMaskBlock : lowest_bit);
}

bool is_dense_mask_convertible(const AttentionParams& params) {
  // A mask broadcast along rows or columns (a key-padding mask [B, 1, 1, Sk]) is small in
  // memory, but its block form would store bits for every (row, column): left per element.
  const bool rows_broadcast = params.attn_mask_strides[2] == 0 && params.seqlen_q > 1;
  const bool columns_broadcast = params.attn_mask_strides[3] == 0 && params.seqlen_k > 1;
  return params.has_attn_mask() && !params.attn_mask_is_bias && !params.has_block_mask() && !params.is_varlen() &&
         !rows_broadcast && !columns_broadcast;
}

namespace {
// -1: follow FLASHATTN_DENSE_MASK (read once; converts unless "elements"); 0 / 1: the override of the tests.
std::atomic<int> dense_mask_conversion_override{-1};
}  // namespace

bool is_dense_mask_conversion_requested() {
  const int forced = dense_mask_conversion_override.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1;
  static const bool requested = [] {
    const char* value = std::getenv("FLASHATTN_DENSE_MASK");
    return value == nullptr || std::strcmp(value, "elements") != 0;
  }();
  return requested;
}

void set_dense_mask_conversion_override(int mode) { dense_mask_conversion_override.store(mode, std::memory_order_relaxed); }

DenseMaskGrid dense_mask_grid(const AttentionParams& params, std::int64_t block_m, std::int64_t block_n) {
  if (!is_valid_mask_block_size(block_m) || !is_valid_mask_block_size(block_n))
    throw Error("flashattn: attn_mask: internal error: dense mask blocks of " + std::to_string(block_m) + " x " +
                std::to_string(block_n) + " (not powers of two in [16, 1024])");
  DenseMaskGrid grid;
  // A zero stride is a broadcast dimension (validation gives size-1 dimensions stride 0).
  grid.batches = params.attn_mask_strides[0] != 0 ? params.batch : 1;
  grid.heads = params.attn_mask_strides[1] != 0 ? params.heads_q : 1;
  grid.seqlen_q = params.seqlen_q, grid.seqlen_k = params.seqlen_k;
  grid.block_m = block_m, grid.block_n = block_n;
  grid.q_blocks = (params.seqlen_q + block_m - 1) / block_m;
  grid.kv_blocks = (params.seqlen_k + block_n - 1) / block_n;
  grid.words_per_row = (block_n + 31) / 32;
  if (grid.block_count() > INT32_MAX)
    throw NotSupported("flashattn: attn_mask: too many mask blocks for int32 block ids (" +
                       std::to_string(grid.block_count()) + ")");
  return grid;
}

BlockMaskView DenseBlockMask::view() const {
  BlockMaskView v = grid.view(bits.data());
  const std::int64_t heads = grid.heads, q_blocks = grid.q_blocks, kv_blocks = grid.kv_blocks;
  // [batches, heads, rows] counts and [batches, heads, rows, columns] indices, broadcast
  // dimensions read with stride 0.
  const auto lists = [&](const std::vector<std::int32_t>& num, const std::vector<std::int32_t>& indices,
                         const std::vector<std::int32_t>* maybe_ids, std::int64_t rows, std::int64_t columns) {
    BlockListTensor t;
    t.num_blocks = num.data();
    t.indices = indices.data();
    t.maybe_ids = maybe_ids != nullptr ? maybe_ids->data() : nullptr;
    t.num_strides[0] = grid.batches > 1 ? heads * rows : 0;
    t.num_strides[1] = heads > 1 ? rows : 0;
    t.num_strides[2] = 1;
    t.index_strides[0] = grid.batches > 1 ? heads * rows * columns : 0;
    t.index_strides[1] = heads > 1 ? rows * columns : 0;
    t.index_strides[2] = columns;
    t.index_strides[3] = 1;
    t.capacity = columns;
    return t;
  };
  v.partial_kv = lists(kv_num, kv_indices, &partial_ids, q_blocks, kv_blocks);
  v.full_kv = lists(full_kv_num, full_kv_indices, nullptr, q_blocks, kv_blocks);
  v.partial_q = lists(q_num, q_indices, &q_partial_ids, kv_blocks, q_blocks);
  v.full_q = lists(full_q_num, full_q_indices, nullptr, kv_blocks, q_blocks);
  return v;
}

void build_dense_block_mask(const AttentionParams& params, std::int64_t block_m, std::int64_t block_n, DenseBlockMask& out,
                            int num_threads) {
  const DenseMaskGrid grid = dense_mask_grid(params, block_m, block_n);
  out.grid = grid;
  const auto blocks = static_cast<std::size_t>(grid.block_count());
  out.codes.assign(blocks, DeviceMask::kEmptyBlock);
  out.bits.assign(blocks * static_cast<std::size_t>(grid.words_per_block()), 0u);
  const auto* mask = static_cast<const std::uint8_t*>(params.maybe_attn_mask);
  // One pass over the mask; block rows write disjoint codes and bits.
  const std::int64_t block_rows = grid.batches * grid.heads * grid.q_blocks;
#pragma omp parallel for schedule(static) num_threads(num_threads > 0 ? num_threads : omp_get_max_threads())
  for (std::int64_t block_row = 0; block_row < block_rows; ++block_row) {
    const std::int64_t m = block_row % grid.q_blocks;
    const std::int64_t h = (block_row / grid.q_blocks) % grid.heads, b = block_row / (grid.q_blocks * grid.heads);
    for (std::int64_t n = 0; n < grid.kv_blocks; ++n) {
      const std::int64_t index = grid.dense_index(b, h, m, n);
      std::uint32_t* words = out.bits.data() + index * grid.words_per_block();  // (block_m, words_per_row)
      std::int64_t allowed = 0;
      for (std::int64_t r = 0; r < block_m && m * block_m + r < grid.seqlen_q; ++r)
        for (std::int64_t c = 0; c < block_n && n * block_n + c < grid.seqlen_k; ++c)
          if (mask[params.attn_mask_offset(b, h, m * block_m + r, n * block_n + c)] != 0) {
            words[r * grid.words_per_row + c / 32] |= 1u << (c % 32);
            ++allowed;
          }
      out.codes[static_cast<std::size_t>(index)] = DenseMaskGrid::code_of(allowed, grid.inside_count(m, n), index);
    }
  }

  // The lists of both directions from the codes, ascending, zero-filled past the counts.
  const std::int64_t sets = grid.batches * grid.heads;
  const auto fill_lists = [&](bool by_query, std::vector<std::int32_t>& num, std::vector<std::int32_t>& indices,
                              std::vector<std::int32_t>& ids, std::vector<std::int32_t>& full_num,
                              std::vector<std::int32_t>& full_indices) {
    const std::int64_t rows = by_query ? grid.q_blocks : grid.kv_blocks;
    const std::int64_t columns = by_query ? grid.kv_blocks : grid.q_blocks;
    num.assign(static_cast<std::size_t>(sets * rows), 0);
    full_num.assign(static_cast<std::size_t>(sets * rows), 0);
    indices.assign(static_cast<std::size_t>(sets * rows * columns), 0);
    full_indices.assign(static_cast<std::size_t>(sets * rows * columns), 0);
    ids.assign(static_cast<std::size_t>(sets * rows * columns), -1);
    for (std::int64_t set = 0; set < sets; ++set)
      for (std::int64_t row = 0; row < rows; ++row) {
        const std::int64_t list = set * rows + row;
        for (std::int64_t column = 0; column < columns; ++column) {
          const std::int64_t m = by_query ? row : column, n = by_query ? column : row;
          const std::int64_t index = (set * grid.q_blocks + m) * grid.kv_blocks + n;
          const std::int32_t code = out.codes[static_cast<std::size_t>(index)];
          if (code == DeviceMask::kEmptyBlock) continue;
          const bool is_full = code == DeviceMask::kFullBlock;
          std::int32_t& count = (is_full ? full_num : num)[static_cast<std::size_t>(list)];
          const auto slot = static_cast<std::size_t>(list * columns + count++);
          (is_full ? full_indices : indices)[slot] = static_cast<std::int32_t>(column);
          if (!is_full) ids[slot] = code;
        }
      }
  };
  fill_lists(true, out.kv_num, out.kv_indices, out.partial_ids, out.full_kv_num, out.full_kv_indices);
  fill_lists(false, out.q_num, out.q_indices, out.q_partial_ids, out.full_q_num, out.full_q_indices);
}

}  // namespace flashattn
