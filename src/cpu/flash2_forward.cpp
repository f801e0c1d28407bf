// src/cpu/flash2_forward.cpp — FlashAttention-2 forward on the CPU (seed 004 §0x4).
//
// Work item = (sequence b, query head h, block of block_m query rows); items run in
// parallel (OpenMP), each with O(block) scratch. Q blocks outer, K/V blocks inner:
//   Q^T = transpose(Q_block) · scale·log2(e)                 once per item
//   for each key block the mask lets through (MaskRule::columns_of_rows):
//     S^T = K_block Q^T                                        (kBlockN, block_m)
//     element mask only where !MaskRule::tile_fully_allowed
//     m_new = max(m, rowmax S);  O^T *= 2^(m - m_new);  P^T = 2^(S^T - m_new);  l += rowsum P
//     O^T += V_block^T P^T                                     (head_dim, block_m)
//   O = transpose(O^T) / l   (one division per row, at the end);  LSE = (m + log2 l)·ln 2
// The scores are kept transposed (keys x queries) so that both matmuls, the row max,
// the exp2 and the rescale all run with the queries in the vector lanes: no
// horizontal reductions and no transpose of K or V. The vector work is the TileKernels table (kernels.hpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "flashattn/online_softmax.hpp"
#include "src/cpu/flash.hpp"
#include "src/cpu/tile_io.hpp"

namespace flashattn::cpu {
namespace {

// Tile sizes: performance only (they change the summation order, not what is
// computed). kBlockN is a multiple of kTileRowsMultiple; every block_m choice of
// kTileWidthMultiple (the queries are the vector lanes).
constexpr std::int64_t kBlockN = 128;     // key rows per inner step
constexpr std::int64_t kMaxBlockM = 256;  // query rows per item, at most

// Query rows per item: large blocks re-read (and re-convert) each K/V block fewer
// times — the K/V rows of one head are a page apart, so every pass costs TLB misses —
// but there must be enough items to keep every thread busy under a causal mask.
// Measured on a 2-core Zen 4 (bench/results/cpu_forward_notes.md): 256 ≈ 6% faster
// than 128, 128 ≈ 10% faster than 64 at seqlen 2048.
std::int64_t forward_block_m(std::int64_t seqlen_q, std::int64_t batch_heads, int threads) {
  std::int64_t block_m = kMaxBlockM;
  while (block_m > kTileWidthMultiple && block_m / 2 >= seqlen_q) block_m /= 2;  // short queries: fewer idle lanes
  while (block_m > 64 && batch_heads * ((seqlen_q + block_m - 1) / block_m) < 4 * static_cast<std::int64_t>(threads)) block_m /= 2;
  return block_m;
}

constexpr float kInfinity = std::numeric_limits<float>::infinity();

}  // namespace

void flash2_forward(const AttentionParams& params, int num_threads) {
  const std::int64_t head_dim = params.head_dim;
  const std::int64_t head_dim_padded = round_up(head_dim, kTileWidthMultiple);
  const std::int64_t head_dim_rows = round_up(head_dim, kTileRowsMultiple);  // rows of O^T the matmul fills
  const int threads = thread_count(num_threads);
  const std::int64_t block_m = forward_block_m(params.seqlen_q, params.batch * params.heads_q, threads);
  const std::int64_t q_blocks = (params.seqlen_q + block_m - 1) / block_m;
  const std::int64_t items = params.batch * params.heads_q * q_blocks;
  if (items == 0) return;
  const TileKernels& kernels = tile_kernels();
  const bool has_softcap = params.has_softcap();
  // Without softcap, scale·log2(e) is folded into Q so each score is ready for exp2;
  // softcap must see scale·q·k itself, so then log2(e) comes after the tanh.
  const float q_scale = has_softcap ? params.softmax_scale : params.softmax_scale_log2;
  const float softcap = params.softcap;
  const float softcap_log2 = params.softcap * static_cast<float>(online_softmax::kLog2e);

#pragma omp parallel num_threads(threads)
  {
    AlignedBuffer q_t(head_dim * block_m);            // (head_dim, block_m)
    AlignedBuffer k_tile(kBlockN * head_dim_padded);  // (kBlockN, head_dim_padded)
    AlignedBuffer v_tile(kBlockN * head_dim_padded);  // (kBlockN, head_dim_padded)
    AlignedBuffer s_t(kBlockN * block_m);             // (kBlockN, block_m): S^T, then P^T
    AlignedBuffer o_t(head_dim_rows * block_m);       // (head_dim_rows, block_m)
    AlignedBuffer row_max(block_m), row_factor(block_m), row_base(block_m), row_sum(block_m);
    std::vector<float> row_buffer(static_cast<std::size_t>(head_dim));
    std::vector<online_softmax::State<float>> states(block_m);

#pragma omp for schedule(dynamic, 1)
    for (std::int64_t item = 0; item < items; ++item) {
      // Highest query blocks first: under a causal mask they see the most keys, so the
      // dynamic schedule starts the long items early and ends on short ones.
      const std::int64_t m_block = q_blocks - 1 - item % q_blocks;
      const std::int64_t h = (item / q_blocks) % params.heads_q;
      const std::int64_t b = item / (q_blocks * params.heads_q);
      const MaskRule mask = params.mask_of(b);
      const std::int64_t row_begin = m_block * block_m;
      if (row_begin >= mask.seqlen_q) continue;  // varlen: this sequence is shorter
      const std::int64_t rows = std::min(block_m, mask.seqlen_q - row_begin);
      const std::int64_t h_kv = h / params.group_size;

      load_tile_transposed(params.q, params.dtype, params.q_offset(b, h) + row_begin * params.q_row_stride,
                           params.q_row_stride, rows, block_m, head_dim, q_scale, q_t.data(), row_buffer.data());
      std::fill(o_t.data(), o_t.data() + head_dim_rows * block_m, 0.0f);
      std::fill(states.begin(), states.end(), online_softmax::State<float>{});

      const auto cols = mask.columns_of_rows(row_begin, row_begin + rows);
      const std::int64_t first_col = cols.begin < cols.end ? cols.begin / kBlockN * kBlockN : cols.end;
      for (std::int64_t col_begin = first_col; col_begin < cols.end; col_begin += kBlockN) {
        const std::int64_t n = std::min(kBlockN, mask.seqlen_k - col_begin);
        const std::int64_t k_row0 = params.k_offset(b, h_kv) + col_begin * params.k_row_stride;
        const std::int64_t v_row0 = params.v_offset(b, h_kv) + col_begin * params.v_row_stride;
        if (col_begin + kBlockN < cols.end) {
          prefetch_rows(params.k, params.dtype, k_row0 + kBlockN * params.k_row_stride, params.k_row_stride,
                        std::min(kBlockN, mask.seqlen_k - col_begin - kBlockN), head_dim);
          prefetch_rows(params.v, params.dtype, v_row0 + kBlockN * params.v_row_stride, params.v_row_stride,
                        std::min(kBlockN, mask.seqlen_k - col_begin - kBlockN), head_dim);
        }
        // Copied even when float32: rows of K/V are heads·head_dim floats apart in the
        // [batch, seqlen, heads, head_dim] layout (4 KiB for 16 heads of 64), so a block
        // read in place maps all its rows to the same few L1 sets.
        load_tile(params.k, params.dtype, k_row0, params.k_row_stride, n, kBlockN, head_dim, head_dim_padded, 1.0f, k_tile.data());
        load_tile(params.v, params.dtype, v_row0, params.v_row_stride, n, kBlockN, head_dim, head_dim_padded, 1.0f, v_tile.data());
        const float* k = k_tile.data();  // (kBlockN, head_dim_padded)
        const float* v = v_tile.data();  // (kBlockN, head_dim_padded)
        const std::int64_t k_stride = head_dim_padded, v_stride = head_dim_padded;

        // S^T (kBlockN, block_m) = K Q^T
        float* s = s_t.data();
        kernels.matmul(k, k_stride, 1, q_t.data(), block_m, head_dim, s, block_m, kBlockN, block_m, false);
        if (has_softcap)
          for (std::int64_t e = 0; e < kBlockN * block_m; ++e) s[e] = softcap_log2 * std::tanh(s[e] / softcap);
        // Only boundary tiles pay for the element mask (this also hides the zero
        // padding of a tail key block: col_end never passes seqlen_k).
        if (!mask.tile_fully_allowed(row_begin, row_begin + rows, col_begin, col_begin + kBlockN)) {
          for (std::int64_t i = 0; i < rows; ++i) {
            const std::int64_t allowed_begin = mask.col_begin(row_begin + i) - col_begin;
            const std::int64_t allowed_end = mask.col_end(row_begin + i) - col_begin;
            for (std::int64_t j = 0; j < kBlockN; ++j)
              if (j < allowed_begin || j >= allowed_end) s[j * block_m + i] = -kInfinity;
          }
        }

        // Online softmax: the rescale rule is online_softmax::State's, per query row.
        kernels.column_max(s, block_m, kBlockN, block_m, row_max.data());
        for (std::int64_t i = 0; i < block_m; ++i) {
          auto& state = states[static_cast<std::size_t>(i)];
          row_factor.data()[i] = state.raise_max(row_max.data()[i]);
          row_base.data()[i] = state.base();
        }
        kernels.exp2_columns(s, block_m, kBlockN, block_m, row_base.data(), row_sum.data());  // P^T
        for (std::int64_t i = 0; i < block_m; ++i) states[static_cast<std::size_t>(i)].add(row_sum.data()[i]);
        kernels.scale_columns(o_t.data(), block_m, head_dim_rows, block_m, row_factor.data());

        // O^T (head_dim_rows, block_m) += V^T P^T
        kernels.matmul(v, 1, v_stride, s, block_m, kBlockN, o_t.data(), block_m, head_dim_rows, block_m, true);
      }

      // O = O^T / l (the one division per row), LSE.
      for (std::int64_t i = 0; i < rows; ++i) {
        const auto& state = states[static_cast<std::size_t>(i)];
        for (std::int64_t d = 0; d < head_dim; ++d) row_buffer[static_cast<std::size_t>(d)] = o_t.data()[d * block_m + i];
        store_row(row_buffer.data(), head_dim, state.inverse_sum(), params.out, params.dtype,
                  params.out_offset(b, h) + (row_begin + i) * params.out_row_stride);
        if (params.maybe_lse) params.maybe_lse[params.lse_offset(b, h) + (row_begin + i) * params.lse_row_stride] = state.lse();
      }
    }
  }
}

}  // namespace flashattn::cpu
