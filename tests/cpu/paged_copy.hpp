// tests/cpu/paged_copy.hpp — the keys/values of a packed varlen AttentionProblem laid
// out as a paged KV cache (VarlenArgs::maybe_block_table): shuffled pages of a pool,
// spare pages holding other values, -1 in the table slots no sequence touches.
// Shared by the CPU and CUDA paged-prefill tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "flashattn/attention.hpp"
#include "tests/cpu/attention_problem.hpp"

namespace flashattn::testing {

// The keys/values of a packed varlen problem scattered into shuffled pages of a pool
// [num_blocks, page_size, heads_kv, head_dim], with spare pages and -1 in unused slots.
struct PagedCopy {
  HostTensor k_pool, v_pool, block_table;
  std::int64_t max_blocks = 0;

  PagedCopy(const AttentionProblem& problem, std::int64_t page_size, std::uint64_t seed) {
    const ProblemShape& s = problem.shape();
    const std::int64_t row_bytes = s.heads_kv * s.head_dim * static_cast<std::int64_t>(dtype_size(s.dtype));
    std::int64_t pages_needed = 0;
    for (std::int32_t length : s.varlen_k) {
      const std::int64_t pages = (length + page_size - 1) / page_size;
      max_blocks = std::max(max_blocks, pages);
      pages_needed += pages;
    }
    max_blocks += 1;  // a spare slot per sequence, never touched
    const std::int64_t num_blocks = pages_needed + 3;
    k_pool = HostTensor(s.dtype, {num_blocks, page_size, s.heads_kv, s.head_dim});
    v_pool = HostTensor(s.dtype, k_pool.shape());
    k_pool.fill_random(seed + 100);  // rows outside every sequence hold other values
    v_pool.fill_random(seed + 101);
    block_table = HostTensor(DType::int32, {static_cast<std::int64_t>(s.varlen_k.size()), max_blocks});
    auto* table = static_cast<std::int32_t*>(block_table.data());
    std::fill(table, table + block_table.numel(), -1);
    std::vector<std::int32_t> free_blocks(static_cast<std::size_t>(num_blocks));
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), std::mt19937_64(seed));
    std::size_t next = 0;
    std::int64_t packed_row = 0;
    for (std::size_t b = 0; b < s.varlen_k.size(); ++b) {
      for (std::int64_t j = 0; j < s.varlen_k[b]; ++j) {
        const std::int64_t page = j / page_size;
        std::int32_t& block = table[static_cast<std::int64_t>(b) * max_blocks + page];
        if (block < 0) block = free_blocks[next++];
        const std::int64_t dst = (block * page_size + j % page_size) * row_bytes;
        std::memcpy(static_cast<char*>(k_pool.data()) + dst, static_cast<const char*>(problem.k.data()) + (packed_row + j) * row_bytes,
                    static_cast<std::size_t>(row_bytes));
        std::memcpy(static_cast<char*>(v_pool.data()) + dst, static_cast<const char*>(problem.v.data()) + (packed_row + j) * row_bytes,
                    static_cast<std::size_t>(row_bytes));
      }
      packed_row += s.varlen_k[b];
    }
  }

  // The problem's forward arguments with k/v replaced by the pools, into out/lse.
  ForwardArgs args(AttentionProblem& problem, HostTensor& out, HostTensor& lse, Algorithm algorithm) {
    ForwardArgs args = problem.forward_args(algorithm);
    args.k = k_pool.view();
    args.v = v_pool.view();
    args.out = out.view();
    args.maybe_lse = lse.view();
    args.maybe_varlen->maybe_block_table = block_table.view();
    return args;
  }
};

}  // namespace flashattn::testing
