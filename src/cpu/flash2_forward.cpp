// src/cpu/flash2_forward.cpp — FlashAttention-2 forward on the CPU (seed 004 §0x4).
//
// Work item = (sequence b, query head h, a run of query rows); items run in parallel
// (OpenMP) with O(block) scratch per thread. Q blocks outer, K/V blocks inner:
//   Q^T = transpose(Q rows) · scale·log2(e)                    once per item
//   for each key block the mask lets through (MaskRule::columns_of_rows):
//     pack K_j, V_j into float32 tiles (unless dense float32)   once per item
//     for each query tile t of the item whose rows see block j, trimmed to the
//     lanes (queries) and keys that the mask lets through:
//       S^T = K_j Q_t^T                                          (kBlockN, tile_m)
//       element mask only where !MaskRule::tile_fully_allowed
//       attn_mask / block mask (attention_mask.hpp): blocks the block mask leaves
//       empty are never loaded; partial ones get its element rule, every visited
//       tile the dense bias (log2 units) or boolean mask
//       m_new = max(m, rowmax S);  P^T = 2^(S^T - m_new);  l += rowsum P
//       O_t^T = O_t^T · 2^(m - m_new) + V_j^T P^T                 (head_dim, tile_m)
//   O = transpose(O^T) / l   (one division per row, at the end);  LSE = (m + log2 l)·ln 2
//   a row that came out NaN or Inf is redone by the float64 oracle (flash.hpp, exact_row)
// The scores are kept transposed (keys x queries) so that both matmuls, the row max,
// the exp2 and the rescale all run with the queries in the vector lanes: no
// horizontal reductions and no transpose of K or V. The vector work is the
// TileKernels table (kernels.hpp).
//
// An item holds several query tiles so that each packed K/V block serves more
// queries: in the [batch, seqlen, heads, head_dim] layout the rows of one head are a
// page apart, and packing a block costs one TLB miss and one cache miss per row.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "flashattn/online_softmax.hpp"
#include "src/cpu/attention_mask.hpp"
#include "src/cpu/dropout_mask.hpp"
#include "src/cpu/flash.hpp"
#include "src/cpu/tile_io.hpp"

namespace flashattn::cpu {
namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();

// Tiling: performance only (each query row's arithmetic is the same whatever the
// tiling; only the skipped fully-masked blocks differ, and they add exactly 0).
constexpr std::int64_t kBlockN = 128;    // key rows per packed K/V block (multiple of kTileRowsMultiple)
constexpr std::int64_t kMaxTileM = 256;  // query rows per tile (multiple of kTileWidthMultiple)
constexpr std::int64_t kMaxTilesPerItem = 4;
constexpr std::int64_t kMaxItemFloats = 256 * 1024;  // per item buffer (Q^T, O^T): 1024 rows of head_dim 256

struct ForwardTiling {
  std::int64_t tile_m;          // query rows per tile: the vector lanes of S^T and O^T
  std::int64_t tiles_per_item;  // tiles that share each packed K/V block
  std::int64_t item_m() const { return tile_m * tiles_per_item; }
};

// Largest tiles first, then as many tiles per item as still leave >= 4 items per
// thread (so a causal mask's uneven items balance under the dynamic schedule).
// On a 2-core Zen 4 at seqlen 2048: tile 256 ≈ 6% faster than 128, 128 ≈ 10% faster
// than 64; 4 tiles per item saved the ≈15% that packing K/V cost with one.
ForwardTiling forward_tiling(std::int64_t seqlen_q, std::int64_t batch_heads, std::int64_t head_dim, int threads) {
  const auto enough_items = [&](std::int64_t rows_per_item) {
    return batch_heads * ((seqlen_q + rows_per_item - 1) / rows_per_item) >= 4 * static_cast<std::int64_t>(threads);
  };
  ForwardTiling tiling{kMaxTileM, 1};
  while (tiling.tile_m > kTileWidthMultiple && tiling.tile_m / 2 >= seqlen_q) tiling.tile_m /= 2;  // fewer idle lanes
  while (tiling.tile_m > 64 && !enough_items(tiling.tile_m)) tiling.tile_m /= 2;
  // Q^T and O^T of an item stay within 256 Ki floats (1 MiB) each.
  while (tiling.tiles_per_item < kMaxTilesPerItem && tiling.item_m() < seqlen_q && enough_items(2 * tiling.item_m()) &&
         2 * tiling.item_m() * head_dim <= kMaxItemFloats)
    tiling.tiles_per_item *= 2;
  return tiling;
}

}  // namespace

void flash2_forward(const AttentionParams& params, int num_threads) {
  const std::int64_t head_dim = params.head_dim;
  const std::int64_t head_dim_padded = round_up(head_dim, kTileWidthMultiple);
  const std::int64_t head_dim_rows = round_up(head_dim, kTileRowsMultiple);  // rows of O^T the matmul fills
  const int threads = thread_count(num_threads);
  const ForwardTiling tiling = forward_tiling(params.seqlen_q, params.batch * params.heads_q, head_dim, threads);
  const std::int64_t tile_m = tiling.tile_m, item_m = tiling.item_m();
  const std::int64_t q_items = (params.seqlen_q + item_m - 1) / item_m;
  const std::int64_t items = params.batch * params.heads_q * q_items;
  if (items == 0) return;
  const TileKernels& kernels = tile_kernels();
  // A plain positive scale (ScoreRule::is_positive_scale) is folded into Q, so each
  // score is ready for exp2; any other rule (softcap, ALiBi) sees the raw q·k.
  const bool is_positive_scale = params.score_is_positive_scale();
  const float q_scale = is_positive_scale ? params.softmax_scale_log2 : 1.0f;
  const DropoutRule dropout = params.dropout();  // inverse_keep is 1 without dropout
  const bool is_float32 = params.dtype == DType::float32;

#pragma omp parallel num_threads(threads)
  {
    AlignedBuffer q_t(head_dim * item_m);             // tile t: (head_dim, tile_m) at t * head_dim * tile_m
    AlignedBuffer o_t(head_dim_rows * item_m);        // tile t: (head_dim_rows, tile_m) at t * head_dim_rows * tile_m
    AlignedBuffer k_tile(kBlockN * head_dim_padded);  // (kBlockN, head_dim_padded)
    AlignedBuffer v_tile(kBlockN * head_dim_padded);  // (kBlockN, head_dim_padded)
    AlignedBuffer s_t(kBlockN * tile_m);              // (kBlockN, tile_m): S^T, then P^T
    AlignedBuffer row_max(tile_m), row_factor(tile_m), row_base(tile_m), row_sum(tile_m);
    std::vector<float> row_buffer(static_cast<std::size_t>(head_dim));
    std::vector<online_softmax::State<float>> states(static_cast<std::size_t>(item_m));
    HeadMask extra;  // attn_mask / block mask of the item's (b, h)

#pragma omp for schedule(dynamic, 1)
    for (std::int64_t item = 0; item < items; ++item) {
      // Highest query rows first: under a causal mask they see the most keys, so the
      // dynamic schedule starts the long items early and ends on short ones.
      const std::int64_t m_item = q_items - 1 - item % q_items;
      const std::int64_t h = (item / q_items) % params.heads_q;
      const std::int64_t b = item / (q_items * params.heads_q);
      const MaskRule mask = params.mask_of(b);
      const ScoreRule score = params.score_of(b, h, mask);
      const std::int64_t item_begin = m_item * item_m;
      if (item_begin >= mask.seqlen_q) continue;  // varlen: this sequence is shorter
      const std::int64_t item_rows = std::min(item_m, mask.seqlen_q - item_begin);
      const std::int64_t tiles = (item_rows + tile_m - 1) / tile_m;
      const std::int64_t h_kv = h / params.group_size;
      extra.reset(params, b, h);

      for (std::int64_t t = 0; t < tiles; ++t) {
        const std::int64_t row_begin = item_begin + t * tile_m;
        load_tile_transposed(params.q, params.dtype, params.q_offset(b, h) + row_begin * params.q_row_stride, params.q_row_stride,
                             std::min(tile_m, mask.seqlen_q - row_begin), tile_m, head_dim, q_scale,
                             q_t.data() + t * head_dim * tile_m, row_buffer.data());
      }
      std::fill(o_t.data(), o_t.data() + head_dim_rows * item_m, 0.0f);
      std::fill(states.begin(), states.end(), online_softmax::State<float>{});

      const auto cols = mask.columns_of_rows(item_begin, item_begin + item_rows);
      const std::int64_t first_col = cols.begin < cols.end ? cols.begin / kBlockN * kBlockN : cols.end;
      for (std::int64_t col_begin = first_col; col_begin < cols.end; col_begin += kBlockN) {
        const std::int64_t n = std::min(kBlockN, mask.seqlen_k - col_begin);
        // K0 of the block mask: a key block none of the item's rows visit is not loaded.
        if (extra.is_active() && extra.tile_kind(item_begin, item_begin + item_rows, col_begin, col_begin + n) == TileKind::empty) continue;
        const std::int64_t k_row0 = params.k_offset(b, h_kv) + col_begin * params.k_row_stride;
        const std::int64_t v_row0 = params.v_offset(b, h_kv) + col_begin * params.v_row_stride;
        if (col_begin + kBlockN < cols.end) {
          const std::int64_t next_rows = std::min(kBlockN, mask.seqlen_k - col_begin - kBlockN);
          prefetch_rows(params.k, params.dtype, k_row0 + kBlockN * params.k_row_stride, params.k_row_stride, next_rows, head_dim);
          prefetch_rows(params.v, params.dtype, v_row0 + kBlockN * params.v_row_stride, params.v_row_stride, next_rows, head_dim);
        }
        // A full float32 block whose rows are already dense (e.g. [batch, heads, seqlen,
        // head_dim] storage) is used in place. Anything else is packed (and converted):
        // in the [batch, seqlen, heads, head_dim] layout the rows of a block sit a page
        // apart and, read in place, map to the same few L1 sets.
        const float* k = k_tile.data();  // (kBlockN, head_dim_padded)
        const float* v = v_tile.data();  // (kBlockN, head_dim_padded)
        if (is_float32 && n == kBlockN && params.k_row_stride == head_dim_padded)
          k = static_cast<const float*>(params.k) + k_row0;
        else
          load_tile(params.k, params.dtype, k_row0, params.k_row_stride, n, kBlockN, head_dim, head_dim_padded, 1.0f, k_tile.data());
        if (is_float32 && n == kBlockN && params.v_row_stride == head_dim_padded)
          v = static_cast<const float*>(params.v) + v_row0;
        else
          load_tile(params.v, params.dtype, v_row0, params.v_row_stride, n, kBlockN, head_dim, head_dim_padded, 1.0f, v_tile.data());

        // Queries that see some key of this block: a contiguous run of rows.
        const auto rows_seeing = mask.rows_of_columns(col_begin, col_begin + n);
        for (std::int64_t t = 0; t < tiles; ++t) {
          const std::int64_t row_begin = item_begin + t * tile_m;
          const std::int64_t rows = std::min(tile_m, mask.seqlen_q - row_begin);
          // Trim the tile to the lanes (queries) that see this block and the keys that
          // those lanes see, on vector/micro-tile boundaries: a causal diagonal block
          // then costs about half. Trimmed entries are masked ones, which would add
          // exactly 0, so results do not depend on the trimming.
          const std::int64_t lane_begin = std::clamp(rows_seeing.begin - row_begin, std::int64_t{0}, rows) / kTileWidthMultiple * kTileWidthMultiple;
          const std::int64_t lane_end = std::min(tile_m, round_up(std::clamp(rows_seeing.end - row_begin, std::int64_t{0}, rows), kTileWidthMultiple));
          if (lane_begin >= lane_end) continue;
          const auto keys_seen = mask.columns_of_rows(row_begin + lane_begin, row_begin + std::min(lane_end, rows));
          const std::int64_t key_begin = std::clamp(keys_seen.begin - col_begin, std::int64_t{0}, n) / kTileRowsMultiple * kTileRowsMultiple;
          const std::int64_t key_end = std::min(kBlockN, round_up(std::clamp(keys_seen.end - col_begin, std::int64_t{0}, n), kTileRowsMultiple));
          if (key_begin >= key_end) continue;
          // K2 of the block mask (full when there is none): empty tiles are skipped.
          const TileKind extra_kind = extra.is_active() ? extra.tile_kind(row_begin + lane_begin, row_begin + std::min(lane_end, rows),
                                                                          col_begin + key_begin, col_begin + key_end)
                                                        : TileKind::full;
          if (extra_kind == TileKind::empty) continue;
          const std::int64_t lanes = lane_end - lane_begin, keys = key_end - key_begin;
          const float* q_lanes_t = q_t.data() + t * head_dim * tile_m + lane_begin;  // (head_dim, lanes), row stride tile_m
          float* o_lanes_t = o_t.data() + t * head_dim_rows * tile_m + lane_begin;   // (head_dim_rows, lanes), row stride tile_m
          float* s = s_t.data() + key_begin * tile_m + lane_begin;                   // (keys, lanes), row stride tile_m
          online_softmax::State<float>* lane_states = states.data() + t * tile_m + lane_begin;

          // S^T (keys, lanes) = K Q^T
          kernels.matmul(k + key_begin * head_dim_padded, head_dim_padded, 1, q_lanes_t, tile_m, head_dim, s, tile_m, keys, lanes, false);
          // K1, the score hook: S = ScoreRule::log2_score (the positive scale is already in Q).
          if (!is_positive_scale)
            for (std::int64_t j = 0; j < keys; ++j)
              for (std::int64_t i = 0; i < lanes; ++i)
                s[j * tile_m + i] = score.log2_score(s[j * tile_m + i], row_begin + lane_begin + i, col_begin + key_begin + j);
          // The block mask's element rule (partial tiles) and the dense bias/mask (every tile).
          if (extra.has_dense() || extra_kind == TileKind::partial)
            extra.apply(s, tile_m, row_begin + lane_begin, lanes, col_begin + key_begin, keys, extra_kind);
          // Only boundary tiles pay for the element mask (it also hides the zero
          // padding of a tail key block: col_end never passes seqlen_k).
          const std::int64_t lane_rows_end = std::min(lane_end, rows);
          if (!mask.tile_fully_allowed(row_begin + lane_begin, row_begin + lane_rows_end, col_begin + key_begin, col_begin + key_end)) {
            for (std::int64_t i = 0; i < lane_rows_end - lane_begin; ++i) {
              const std::int64_t allowed_begin = mask.col_begin(row_begin + lane_begin + i) - col_begin - key_begin;
              const std::int64_t allowed_end = mask.col_end(row_begin + lane_begin + i) - col_begin - key_begin;
              for (std::int64_t j = 0; j < keys; ++j)
                if (j < allowed_begin || j >= allowed_end) s[j * tile_m + i] = -kInfinity;
            }
          }

          // Online softmax: the rescale rule is online_softmax::State's, per query row.
          kernels.column_max(s, tile_m, keys, lanes, row_max.data());
          for (std::int64_t i = 0; i < lanes; ++i) {
            row_factor.data()[i] = lane_states[i].raise_max(row_max.data()[i]);
            row_base.data()[i] = lane_states[i].base();
          }
          kernels.exp2_columns(s, tile_m, keys, lanes, row_base.data(), row_sum.data());  // P^T
          for (std::int64_t i = 0; i < lanes; ++i) lane_states[i].add(row_sum.data()[i]);
          // K4, the probability hook (after the row sum, before P V): dropout's Z.
          if (dropout.enabled())
            for_each_dropout_decision(dropout, params.dropout_head(b, h), row_begin + lane_begin, row_begin + lane_end,
                                      col_begin + key_begin, col_begin + key_end, [&](std::int64_t row, std::int64_t col, bool kept) {
                                        if (!kept) s[(col - col_begin - key_begin) * tile_m + (row - row_begin - lane_begin)] = 0.0f;
                                      });

          // O^T (head_dim_rows, lanes) = O^T ∘ factor + V^T P^T  (the rescale fused in)
          kernels.matmul_rescaled(v + key_begin * head_dim_padded, 1, head_dim_padded, s, tile_m, keys, o_lanes_t, tile_m, head_dim_rows,
                                  lanes, row_factor.data());
        }
      }

      // O = O^T / l (the one division per row), LSE.
      for (std::int64_t r = 0; r < item_rows; ++r) {
        const std::int64_t t = r / tile_m, i = r % tile_m;
        const float* o_tile_t = o_t.data() + t * head_dim_rows * tile_m;
        const auto& state = states[static_cast<std::size_t>(r)];
        for (std::int64_t d = 0; d < head_dim; ++d) row_buffer[static_cast<std::size_t>(d)] = o_tile_t[d * tile_m + i];
        float scale = state.inverse_sum() * dropout.inverse_keep, lse = state.lse();
        if (!row_is_finite(row_buffer.data(), head_dim, scale, lse))  // overflow or NaN: see exact_row
          lse = exact_row(params, b, h, item_begin + r, row_buffer.data()), scale = 1.0f;
        store_row(row_buffer.data(), head_dim, scale, params.out, params.dtype,
                  params.out_offset(b, h) + (item_begin + r) * params.out_row_stride);
        if (params.maybe_lse) params.maybe_lse[params.lse_offset(b, h) + (item_begin + r) * params.lse_row_stride] = lse;
      }
    }
  }
}

}  // namespace flashattn::cpu
