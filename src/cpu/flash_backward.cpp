// src/cpu/flash_backward.inl — the flash backward on the CPU, by recomputation from
// the forward's LSE (no N x N matrix is ever stored). The vector work is the
// TileKernels table (kernels.hpp).
//
// Per (query block, key block) tile, with the scores transposed like the forward
// (keys x queries, the query axis in the vector lanes):
//   S^T = K Q^T;  P^T = 2^(S^T·log2e - LSE·log2e)            (exact probabilities)
//   dP^T = V dO^T;  dS^T = P^T ∘ (dP^T - D)                   D = rowsum(dO ∘ O)
//   (softcap: dS *= 1 - tanh²(S_raw / softcap), ScoreRule::gradient_factor)
//   (dropout: dP ← Z ∘ dP / (1 - p) before dS, P ← Z ∘ P / (1 - p) for dV; DropoutRule)
//   dV += P^T dO;  dK += dS^T Q · scale;  dQ += dS K · scale
// Two parallel passes keep it race-free and deterministic without atomics:
//   pass 1, items (b, kv head, run of key blocks): dK and dV of those blocks, summed over the
//           group's query heads and the query blocks MaskRule::rows_of_columns allows;
//   pass 2, items (b, query head, run of query blocks): dQ of those blocks over the key blocks
//           MaskRule::columns_of_rows allows.
// attn_mask / block mask (attention_mask.hpp): tiles the block mask leaves empty are
// skipped, partial ones get its element rule, every visited tile the dense bias. dBias
// = dS (before the softcap factor: the bias is added after the softcap), accumulated
// by pass 2; when dBias broadcasts over batch, heads or rows, pass 2's items become
// the dBias elements' owners (the broadcast dimensions run serially inside an item),
// so the sum is race-free and deterministic.
// Pass 2 recomputes S and dP (2 of the 5 matmuls again): the price of no shared dQ
// accumulator. Scratch is O(block) per thread.
// The NaN rule (README.md): an entry a row cannot see — masked by causal/window, the
// block mask or attn_mask, a row that sees no key (LSE -inf), tile padding — contributes
// exactly nothing to dP, dS, dV, dK, dQ or dBias. Tiles with such entries keep a byte
// map of them (TileScratch::hidden): P and dS are set (not multiplied) to 0 there, so
// a NaN or Inf in v, dout, D or the LSE cannot get in through 0·NaN; and when the q/dout
// of the query block or the k of the key block hold a non-finite value, the three
// matmuls that read them against P or dS (dV, dK, dQ) skip the hidden entries instead
// (visible_matmul; finite inputs keep the vector matmuls). Visible NaN and Inf propagate
// as in the forward (0·NaN included).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "flashattn/online_softmax.hpp"
#include "src/cpu/attention_mask.hpp"
#include "src/cpu/dropout_mask.hpp"
#include "src/cpu/flash.hpp"
#include "src/cpu/reference.hpp"  // dense_q_row
#include "src/cpu/tile_io.hpp"

namespace flashattn::cpu {
namespace {

// Tile sizes: performance only. kBlockM a multiple of kTileWidthMultiple (the queries
// are the vector lanes), kBlockN of kTileRowsMultiple.
constexpr std::int64_t kBlockM = 64;
constexpr std::int64_t kBlockN = 128;

constexpr float kInfinity = std::numeric_limits<float>::infinity();

bool all_finite(const float* x, std::int64_t count) {
  bool finite = true;
  for (std::int64_t e = 0; e < count; ++e) finite = finite && std::isfinite(x[e]);
  return finite;
}

// C (rows, width) += A (rows, depth) B (depth, width) over the entries A does not hide:
// hidden (same layout as A: element (r, d) at r * a_row_stride + d * a_depth_stride) != 0
// skips A's element, so a non-finite row of B never meets a hidden 0. The scalar path
// of kernels.matmul's accumulate for tiles with hidden entries and non-finite inputs.
void visible_matmul(const float* a, const char* hidden, std::int64_t a_row_stride, std::int64_t a_depth_stride, const float* b,
                    std::int64_t b_stride, std::int64_t depth, float* c, std::int64_t c_stride, std::int64_t rows, std::int64_t width) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t d = 0; d < depth; ++d) {
      const std::int64_t at = r * a_row_stride + d * a_depth_stride;
      if (hidden[at]) continue;
      const float x = a[at];
      for (std::int64_t w = 0; w < width; ++w) c[r * c_stride + w] += x * b[d * b_stride + w];
    }
}

// One block of query rows with everything the backward needs about it.
struct QueryBlock {
  std::int64_t head_dim, head_dim_padded;
  AlignedBuffer q_t;       // (head_dim, kBlockM), times q_scale (scale·log2e on the positive-scale path, else 1)
  AlignedBuffer q;         // (kBlockM, head_dim_padded), unscaled
  AlignedBuffer dout_t;    // (head_dim, kBlockM)
  AlignedBuffer dout;      // (kBlockM, head_dim_padded)
  AlignedBuffer lse_log2;  // (kBlockM): LSE·log2e; +inf for empty and padding rows so P = 0
  AlignedBuffer delta;     // (kBlockM): D = rowsum(dO ∘ O)
  bool all_finite_q_dout = true;  // q and dout of the block hold no NaN/Inf (see visible_matmul)
  std::vector<float> row_buffer;

  QueryBlock(std::int64_t head_dim_, std::int64_t head_dim_padded_)
      : head_dim(head_dim_), head_dim_padded(head_dim_padded_), q_t(head_dim_ * kBlockM), q(kBlockM * head_dim_padded_),
        dout_t(head_dim_ * kBlockM), dout(kBlockM * head_dim_padded_), lse_log2(kBlockM), delta(kBlockM),
        row_buffer(static_cast<std::size_t>(head_dim_)) {}

  // delta_all: D of every query row, dense (total_q, heads_q) (see flash_backward).
  void load(const BackwardParams& p, std::int64_t b, std::int64_t h, std::int64_t row_begin, std::int64_t rows, float q_scale,
            const std::vector<float>& delta_all) {
    const std::int64_t q0 = p.q_offset(b, h) + row_begin * p.q_row_stride;
    const std::int64_t dout0 = p.dout_offset(b, h) + row_begin * p.dout_row_stride;
    load_tile_transposed(p.q, p.dtype, q0, p.q_row_stride, rows, kBlockM, head_dim, q_scale, q_t.data(), row_buffer.data());
    load_tile(p.q, p.dtype, q0, p.q_row_stride, rows, kBlockM, head_dim, head_dim_padded, 1.0f, q.data());
    load_tile_transposed(p.dout, p.dtype, dout0, p.dout_row_stride, rows, kBlockM, head_dim, 1.0f, dout_t.data(), row_buffer.data());
    load_tile(p.dout, p.dtype, dout0, p.dout_row_stride, rows, kBlockM, head_dim, head_dim_padded, 1.0f, dout.data());
    all_finite_q_dout = all_finite(q.data(), rows * head_dim_padded) && all_finite(dout.data(), rows * head_dim_padded);
    for (std::int64_t i = 0; i < kBlockM; ++i) {
      lse_log2.data()[i] = kInfinity;
      delta.data()[i] = 0.0f;
    }
    for (std::int64_t i = 0; i < rows; ++i) {
      const float lse = p.lse[p.lse_offset(b, h) + (row_begin + i) * p.lse_row_stride];
      if (lse != -kInfinity) lse_log2.data()[i] = lse * static_cast<float>(online_softmax::kLog2e);
      delta.data()[i] = delta_all[static_cast<std::size_t>(dense_q_row(p, b, row_begin + i) * p.heads_q + h)];
    }
  }
};

// Scratch for one (key block x query block) tile.
struct TileScratch {
  AlignedBuffer p_t;        // (kBlockN, kBlockM)
  AlignedBuffer ds_t;       // (kBlockN, kBlockM): dP^T, then dS^T
  AlignedBuffer cap_slope;  // (kBlockN, kBlockM): 1 - tanh², only with softcap
  std::vector<char> keep;   // (kBlockN, kBlockM): dropout's Z, only with dropout
  std::vector<char> hidden;  // (kBlockN, kBlockM): 1 = an entry the row cannot see (the NaN rule), in tiles that have any
  TileScratch()
      : p_t(kBlockN * kBlockM), ds_t(kBlockN * kBlockM), cap_slope(kBlockN * kBlockM), keep(kBlockN * kBlockM), hidden(kBlockN * kBlockM) {}
};

// The part of a (key block x query block) tile that the mask lets through: query
// lanes [lane_begin, lane_end) (multiples of kTileWidthMultiple) and keys
// [key_begin, key_end) (multiples of kTileRowsMultiple). Everything outside is masked,
// would contribute exactly 0, and is neither computed nor read.
struct TileRange {
  std::int64_t lane_begin = 0, lane_end = 0, key_begin = 0, key_end = 0;
  bool empty() const { return lane_begin >= lane_end || key_begin >= key_end; }
  std::int64_t lanes() const { return lane_end - lane_begin; }
  std::int64_t keys() const { return key_end - key_begin; }
};

TileRange tile_range(const MaskRule& mask, std::int64_t row_begin, std::int64_t rows, std::int64_t col_begin, std::int64_t cols) {
  TileRange range;
  const auto rows_seeing = mask.rows_of_columns(col_begin, col_begin + cols);
  range.lane_begin = std::clamp(rows_seeing.begin - row_begin, std::int64_t{0}, rows) / kTileWidthMultiple * kTileWidthMultiple;
  range.lane_end = std::min(kBlockM, round_up(std::clamp(rows_seeing.end - row_begin, std::int64_t{0}, rows), kTileWidthMultiple));
  if (range.lane_begin >= range.lane_end) return range;
  const auto keys_seen = mask.columns_of_rows(row_begin + range.lane_begin, row_begin + std::min(range.lane_end, rows));
  range.key_begin = std::clamp(keys_seen.begin - col_begin, std::int64_t{0}, cols) / kTileRowsMultiple * kTileRowsMultiple;
  range.key_end = std::min(kBlockN, round_up(std::clamp(keys_seen.end - col_begin, std::int64_t{0}, cols), kTileRowsMultiple));
  return range;
}

// P^T and dS^T of the range r of one tile, in place in t.p_t / t.ds_t (element (j, i)
// at j * kBlockM + i); k/v are (kBlockN, .) row-major with strides k_stride/v_stride.
// The score rule and dropout of one (sequence, query head).
struct HeadVariant {
  ScoreRule score;
  DropoutRule dropout;
  std::uint32_t dropout_head = 0;
};

// The masks beyond MaskRule of one (b, h) with the kind of the current tile, and
// where dS goes for dBias (pass 2 only).
struct TileMask {
  const HeadMask* extra = nullptr;
  TileKind kind = TileKind::full;
  double* maybe_dbias = nullptr;  // the accumulator (DbiasIndex layout)
  const DbiasIndex* dbias_index = nullptr;
  std::int64_t b = 0, h = 0, seqlen_k = 0;
};

// Returns whether the range has hidden entries (then t.hidden maps them and P, dS are 0
// there).
bool probabilities_and_score_gradients(const TileKernels& kernels, const MaskRule& mask, const HeadVariant& variant,
                                       const QueryBlock& qb, std::int64_t row_begin, std::int64_t rows, std::int64_t col_begin,
                                       const TileRange& r, const float* k, std::int64_t k_stride, const float* v, std::int64_t v_stride,
                                       TileScratch& t, const TileMask& tile_mask) {
  const std::int64_t head_dim = qb.head_dim;
  const std::int64_t offset = r.key_begin * kBlockM + r.lane_begin;
  float* s = t.p_t.data() + offset;
  float* slope = t.cap_slope.data() + offset;
  // S^T (keys, lanes) = K Q^T
  kernels.matmul(k + r.key_begin * k_stride, k_stride, 1, qb.q_t.data() + r.lane_begin, kBlockM, head_dim, s, kBlockM, r.keys(), r.lanes(), false);
  // K1, the score hook (a positive scale is already in Q^T, see q_scale).
  const ScoreRule& score = variant.score;
  if (!score.is_positive_scale()) {
    for (std::int64_t j = 0; j < r.keys(); ++j)
      for (std::int64_t i = 0; i < r.lanes(); ++i) {
        const float dot = s[j * kBlockM + i];
        if (score.has_softcap()) slope[j * kBlockM + i] = score.gradient_factor(dot);
        s[j * kBlockM + i] = score.log2_score(dot, row_begin + r.lane_begin + i, col_begin + r.key_begin + j);
      }
  }
  // Hidden entries (the NaN rule): masked by MaskRule, the block mask or attn_mask, and
  // the lanes of rows that see nothing (LSE -inf, and the padding lanes: lse_log2 +inf).
  const std::int64_t lane_rows_end = std::min(r.lane_end, rows);
  const bool extra_elements = tile_mask.extra != nullptr && (tile_mask.extra->has_dense() || tile_mask.kind == TileKind::partial);
  const bool mask_partial =
      !mask.tile_fully_allowed(row_begin + r.lane_begin, row_begin + lane_rows_end, col_begin + r.key_begin, col_begin + r.key_end);
  bool empty_lanes = false;
  for (std::int64_t i = r.lane_begin; i < r.lane_end; ++i) empty_lanes = empty_lanes || qb.lse_log2.data()[i] == kInfinity;
  const bool has_hidden = extra_elements || mask_partial || empty_lanes;
  char* hidden = t.hidden.data() + offset;
  if (has_hidden)
    for (std::int64_t j = 0; j < r.keys(); ++j)
      for (std::int64_t i = 0; i < r.lanes(); ++i) hidden[j * kBlockM + i] = qb.lse_log2.data()[r.lane_begin + i] == kInfinity;
  if (extra_elements)
    tile_mask.extra->apply(s, kBlockM, row_begin + r.lane_begin, r.lanes(), col_begin + r.key_begin, r.keys(), tile_mask.kind, hidden);
  if (mask_partial) {
    for (std::int64_t i = 0; i < lane_rows_end - r.lane_begin; ++i) {
      const std::int64_t allowed_begin = mask.col_begin(row_begin + r.lane_begin + i) - col_begin - r.key_begin;
      const std::int64_t allowed_end = mask.col_end(row_begin + r.lane_begin + i) - col_begin - r.key_begin;
      for (std::int64_t j = 0; j < r.keys(); ++j)
        if (j < allowed_begin || j >= allowed_end) s[j * kBlockM + i] = -kInfinity, hidden[j * kBlockM + i] = 1;
    }
  }
  // x = 0 at the hidden entries: set, not multiplied (0·NaN is NaN).
  const auto zero_hidden = [&](float* x) {
    if (!has_hidden) return;
    for (std::int64_t j = 0; j < r.keys(); ++j)
      for (std::int64_t i = 0; i < r.lanes(); ++i)
        if (hidden[j * kBlockM + i]) x[j * kBlockM + i] = 0.0f;
  };
  // P^T = 2^(S^T - LSE·log2e)
  kernels.exp2_columns(s, kBlockM, r.keys(), r.lanes(), qb.lse_log2.data() + r.lane_begin, nullptr);
  // dP^T (keys, lanes) = V dO^T;  dS^T = P^T ∘ (dP^T - D)
  float* ds = t.ds_t.data() + offset;
  kernels.matmul(v + r.key_begin * v_stride, v_stride, 1, qb.dout_t.data() + r.lane_begin, kBlockM, head_dim, ds, kBlockM, r.keys(), r.lanes(), false);
  // K4, the probability hook: dropout's Z regenerated; dP ← Z ∘ dP / (1 - p).
  const DropoutRule& dropout = variant.dropout;
  char* keep = t.keep.data() + offset;
  if (dropout.enabled()) {
    for_each_dropout_decision(dropout, variant.dropout_head, row_begin + r.lane_begin, row_begin + r.lane_end, col_begin + r.key_begin,
                              col_begin + r.key_end, [&](std::int64_t row, std::int64_t col, bool kept) {
                                keep[(col - col_begin - r.key_begin) * kBlockM + (row - row_begin - r.lane_begin)] = kept;
                              });
    for (std::int64_t j = 0; j < r.keys(); ++j)
      for (std::int64_t i = 0; i < r.lanes(); ++i)
        ds[j * kBlockM + i] = keep[j * kBlockM + i] ? ds[j * kBlockM + i] * dropout.inverse_keep : 0.0f;
  }
  if (tile_mask.maybe_dbias == nullptr) {
    kernels.score_gradient(s, ds, kBlockM, r.keys(), r.lanes(), qb.delta.data() + r.lane_begin, score.has_softcap() ? slope : nullptr);
    zero_hidden(ds);
  } else {
    // dBias = dS of the score after the softcap: taken before the softcap factor.
    kernels.score_gradient(s, ds, kBlockM, r.keys(), r.lanes(), qb.delta.data() + r.lane_begin, nullptr);
    zero_hidden(ds);
    const std::int64_t real_lanes = std::min(r.lane_end, rows) - r.lane_begin;
    for (std::int64_t j = 0; j < r.keys() && col_begin + r.key_begin + j < tile_mask.seqlen_k; ++j)
      for (std::int64_t i = 0; i < real_lanes; ++i)
        tile_mask.maybe_dbias[tile_mask.dbias_index->at(tile_mask.b, tile_mask.h, row_begin + r.lane_begin + i, col_begin + r.key_begin + j)] +=
            ds[j * kBlockM + i];
    if (score.has_softcap()) {
      for (std::int64_t j = 0; j < r.keys(); ++j)
        for (std::int64_t i = 0; i < r.lanes(); ++i) ds[j * kBlockM + i] *= slope[j * kBlockM + i];
      zero_hidden(ds);
    }
  }
  // dV's probabilities: P ∘ Z / (1 - p) (dS above used the undropped P).
  if (dropout.enabled())
    for (std::int64_t j = 0; j < r.keys(); ++j)
      for (std::int64_t i = 0; i < r.lanes(); ++i)
        s[j * kBlockM + i] = keep[j * kBlockM + i] ? s[j * kBlockM + i] * dropout.inverse_keep : 0.0f;
  zero_hidden(s);
  return has_hidden;
}

// The TileMask of range r of a tile (kind empty: skip the tile).
TileMask tile_mask_of(const HeadMask& extra, const TileRange& r, std::int64_t row_begin, std::int64_t rows, std::int64_t col_begin,
                      double* maybe_dbias, const DbiasIndex* dbias_index, std::int64_t b, std::int64_t h, std::int64_t seqlen_k) {
  TileMask m;
  if (!extra.is_active()) return m;
  m.extra = &extra;
  m.kind = extra.tile_kind(row_begin + r.lane_begin, row_begin + std::min(r.lane_end, rows), col_begin + r.key_begin, col_begin + r.key_end);
  m.maybe_dbias = maybe_dbias;
  m.dbias_index = dbias_index;
  m.b = b, m.h = h, m.seqlen_k = seqlen_k;
  return m;
}

HeadVariant head_variant(const BackwardParams& p, std::int64_t b, std::int64_t h, const MaskRule& mask) {
  return HeadVariant{p.score_of(b, h, mask), p.dropout(), p.dropout_head(b, h)};
}

// K and V of one key block, packed into float tiles (kBlockN, head_dim_padded) —
// always, even for float32: in place, the rows of a block sit a page apart.
struct KeyBlock {
  AlignedBuffer k_tile, v_tile;
  const float* k = nullptr;
  const float* v = nullptr;
  std::int64_t k_stride = 0, v_stride = 0;
  bool all_finite_k = true;  // k of the block holds no NaN/Inf (see visible_matmul)

  explicit KeyBlock(std::int64_t head_dim_padded) : k_tile(kBlockN * head_dim_padded), v_tile(kBlockN * head_dim_padded) {}

  void load(const BackwardParams& p, std::int64_t b, std::int64_t h_kv, std::int64_t col_begin, std::int64_t n,
            std::int64_t head_dim_padded) {
    const std::int64_t k0 = p.k_offset(b, h_kv) + col_begin * p.k_row_stride;
    const std::int64_t v0 = p.v_offset(b, h_kv) + col_begin * p.v_row_stride;
    load_tile(p.k, p.dtype, k0, p.k_row_stride, n, kBlockN, p.head_dim, head_dim_padded, 1.0f, k_tile.data());
    load_tile(p.v, p.dtype, v0, p.v_row_stride, n, kBlockN, p.head_dim, head_dim_padded, 1.0f, v_tile.data());
    k = k_tile.data(), k_stride = head_dim_padded;
    all_finite_k = all_finite(k_tile.data(), n * head_dim_padded);
    v = v_tile.data(), v_stride = head_dim_padded;
  }
};

std::int64_t block_floor(std::int64_t x, std::int64_t block) { return x / block * block; }

// Blocks per item (key blocks in pass 1, query blocks in pass 2): up to 4, while
// that leaves >= 4 items per thread.
std::int64_t backward_blocks_per_item(std::int64_t batch_heads, std::int64_t block_count, int threads) {
  std::int64_t blocks = 1;
  while (blocks < 4 && 2 * blocks <= block_count &&
         batch_heads * ((block_count + 2 * blocks - 1) / (2 * blocks)) >= 4 * static_cast<std::int64_t>(threads))
    blocks *= 2;
  return blocks;
}

}  // namespace

void flash_backward(const BackwardParams& params, int num_threads) {
  const std::int64_t head_dim = params.head_dim;
  const std::int64_t head_dim_padded = round_up(head_dim, kTileWidthMultiple);
  const std::int64_t q_blocks = (params.seqlen_q + kBlockM - 1) / kBlockM;
  const std::int64_t k_blocks = (params.seqlen_k + kBlockN - 1) / kBlockN;
  // A plain positive scale is folded into Q^T; any other score rule sees the raw q·k.
  const float q_scale = params.score_is_positive_scale() ? params.softmax_scale_log2 : 1.0f;
  const int threads = thread_count(num_threads);
  const TileKernels& kernels = tile_kernels();

  // Pass 0: D = rowsum(dO ∘ O) of every query row, once (not per tile pair): dense
  // (total_q, heads_q) float32, O(seqlen) memory like the LSE.
  std::vector<float> delta(static_cast<std::size_t>(params.total_q * params.heads_q), 0.0f);
  const std::int64_t row_items = params.batch * params.heads_q;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t item = 0; item < row_items; ++item) {
    const std::int64_t b = item / params.heads_q, h = item % params.heads_q;
    std::vector<float> out_row(static_cast<std::size_t>(head_dim)), dout_row(static_cast<std::size_t>(head_dim));
    for (std::int64_t i = 0; i < params.seqlen_q_of(b); ++i) {
      load_row(params.out, params.dtype, params.out_offset(b, h) + i * params.out_row_stride, head_dim, 1.0f, out_row.data());
      load_row(params.dout, params.dtype, params.dout_offset(b, h) + i * params.dout_row_stride, head_dim, 1.0f, dout_row.data());
      float dot = 0.0f;
      for (std::int64_t d = 0; d < head_dim; ++d) dot += out_row[static_cast<std::size_t>(d)] * dout_row[static_cast<std::size_t>(d)];
      delta[static_cast<std::size_t>(dense_q_row(params, b, i) * params.heads_q + h)] = dot;
    }
  }

  // Pass 1: dK, dV per (b, kv head, run of key blocks). Several key blocks per item
  // let each loaded query block (Q, Q^T, dO, dO^T: strided rows, converted) serve
  // several key blocks; each key block still sums its query blocks in ascending order,
  // so the result does not depend on the grouping.
  const std::int64_t blocks_per_item = backward_blocks_per_item(params.batch * params.heads_kv, k_blocks, threads);
  const std::int64_t key_items = (k_blocks + blocks_per_item - 1) / blocks_per_item;
  const std::int64_t kv_items = params.batch * params.heads_kv * key_items;
#pragma omp parallel num_threads(threads)
  {
    QueryBlock qb(head_dim, head_dim_padded);
    std::vector<KeyBlock> key_blocks;
    for (std::int64_t c = 0; c < blocks_per_item; ++c) key_blocks.emplace_back(head_dim_padded);
    TileScratch scratch;
    // Block c: (kBlockN, head_dim_padded) at c * kBlockN * head_dim_padded.
    AlignedBuffer dk(blocks_per_item * kBlockN * head_dim_padded), dv(blocks_per_item * kBlockN * head_dim_padded);
    HeadMask extra;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t item = 0; item < kv_items; ++item) {
      const std::int64_t key_item = item % key_items;
      const std::int64_t h_kv = (item / key_items) % params.heads_kv;
      const std::int64_t b = item / (key_items * params.heads_kv);
      const MaskRule mask = params.mask_of(b);
      const std::int64_t item_col_begin = key_item * blocks_per_item * kBlockN;
      if (item_col_begin >= mask.seqlen_k) continue;
      const std::int64_t blocks = std::min(blocks_per_item, (mask.seqlen_k - item_col_begin + kBlockN - 1) / kBlockN);
      const std::int64_t item_col_end = std::min(mask.seqlen_k, item_col_begin + blocks * kBlockN);
      for (std::int64_t c = 0; c < blocks; ++c) {
        const std::int64_t col_begin = item_col_begin + c * kBlockN;
        key_blocks[static_cast<std::size_t>(c)].load(params, b, h_kv, col_begin, std::min(kBlockN, mask.seqlen_k - col_begin), head_dim_padded);
      }
      std::fill(dk.data(), dk.data() + blocks * kBlockN * head_dim_padded, 0.0f);
      std::fill(dv.data(), dv.data() + blocks * kBlockN * head_dim_padded, 0.0f);
      const auto rows_seen = mask.rows_of_columns(item_col_begin, item_col_end);
      for (std::int64_t h = h_kv * params.group_size; h < (h_kv + 1) * params.group_size; ++h) {
        extra.reset(params, b, h);
        const std::int64_t first_row = rows_seen.begin < rows_seen.end ? block_floor(rows_seen.begin, kBlockM) : rows_seen.end;
        for (std::int64_t row_begin = first_row; row_begin < rows_seen.end; row_begin += kBlockM) {
          const std::int64_t rows = std::min(kBlockM, mask.seqlen_q - row_begin);
          // K0' of the block mask: a query block that visits none of the item's key blocks is not loaded.
          if (extra.is_active() && extra.tile_kind(row_begin, row_begin + rows, item_col_begin, item_col_end) == TileKind::empty) continue;
          qb.load(params, b, h, row_begin, rows, q_scale, delta);
          const HeadVariant variant = head_variant(params, b, h, mask);
          for (std::int64_t c = 0; c < blocks; ++c) {
            const std::int64_t col_begin = item_col_begin + c * kBlockN;
            const TileRange r = tile_range(mask, row_begin, rows, col_begin, std::min(kBlockN, mask.seqlen_k - col_begin));
            if (r.empty()) continue;
            const TileMask tile_mask = tile_mask_of(extra, r, row_begin, rows, col_begin, nullptr, nullptr, b, h, mask.seqlen_k);
            if (tile_mask.kind == TileKind::empty) continue;
            const KeyBlock& kb = key_blocks[static_cast<std::size_t>(c)];
            const bool has_hidden = probabilities_and_score_gradients(kernels, mask, variant, qb, row_begin, rows, col_begin, r, kb.k, kb.k_stride,
                                                                      kb.v, kb.v_stride, scratch, tile_mask);
            // dV (keys, head_dim_padded) += P^T dO;  dK += dS^T Q   (over the range's lanes)
            const std::int64_t offset = r.key_begin * kBlockM + r.lane_begin;
            float* dv_rows = dv.data() + (c * kBlockN + r.key_begin) * head_dim_padded;
            float* dk_rows = dk.data() + (c * kBlockN + r.key_begin) * head_dim_padded;
            if (has_hidden && !qb.all_finite_q_dout) {  // the NaN rule: a hidden 0 never meets a NaN/Inf row of dO or Q
              const char* hidden = scratch.hidden.data() + offset;
              visible_matmul(scratch.p_t.data() + offset, hidden, kBlockM, 1, qb.dout.data() + r.lane_begin * head_dim_padded, head_dim_padded,
                             r.lanes(), dv_rows, head_dim_padded, r.keys(), head_dim_padded);
              visible_matmul(scratch.ds_t.data() + offset, hidden, kBlockM, 1, qb.q.data() + r.lane_begin * head_dim_padded, head_dim_padded,
                             r.lanes(), dk_rows, head_dim_padded, r.keys(), head_dim_padded);
              continue;
            }
            kernels.matmul(scratch.p_t.data() + offset, kBlockM, 1, qb.dout.data() + r.lane_begin * head_dim_padded, head_dim_padded,
                           r.lanes(), dv_rows, head_dim_padded, r.keys(), head_dim_padded, true);
            kernels.matmul(scratch.ds_t.data() + offset, kBlockM, 1, qb.q.data() + r.lane_begin * head_dim_padded, head_dim_padded,
                           r.lanes(), dk_rows, head_dim_padded, r.keys(), head_dim_padded, true);
          }
        }
      }
      for (std::int64_t j = 0; j < item_col_end - item_col_begin; ++j) {
        store_row(dk.data() + j * head_dim_padded, head_dim, params.softmax_scale, params.dk, params.dtype,
                  params.dk_offset(b, h_kv) + (item_col_begin + j) * params.dk_row_stride);
        store_row(dv.data() + j * head_dim_padded, head_dim, 1.0f, params.dv, params.dtype,
                  params.dv_offset(b, h_kv) + (item_col_begin + j) * params.dv_row_stride);
      }
    }
  }

  // Pass 2: dQ per (b, query head, run of query blocks). Like pass 1, several query
  // blocks per item share each packed key block; each query block still sums its key
  // blocks in ascending order, so the grouping does not change the result.
  const std::int64_t q_blocks_per_item = backward_blocks_per_item(params.batch * params.heads_q, q_blocks, threads);
  const std::int64_t query_items = (q_blocks + q_blocks_per_item - 1) / q_blocks_per_item;
  const std::int64_t q_items = params.batch * params.heads_q * query_items;
  // dBias: accumulated in double in its own (broadcast) shape, written once at the end.
  const bool has_dbias = params.maybe_dbias != nullptr;
  const DbiasIndex dbias_index{{params.dbias_shape[0], params.dbias_shape[1], params.dbias_shape[2], params.dbias_shape[3]}};
  std::vector<double> dbias(has_dbias ? static_cast<std::size_t>(dbias_index.size()) : 0, 0.0);
  const bool dbias_is_shared = has_dbias && ((dbias_index.shape[0] == 1 && params.batch > 1) || (dbias_index.shape[1] == 1 && params.heads_q > 1) ||
                                             (dbias_index.shape[2] == 1 && query_items > 1));
#pragma omp parallel num_threads(threads)
  {
    std::vector<QueryBlock> query_blocks;
    for (std::int64_t c = 0; c < q_blocks_per_item; ++c) query_blocks.emplace_back(head_dim, head_dim_padded);
    KeyBlock kb(head_dim_padded);
    TileScratch scratch;
    AlignedBuffer dq(q_blocks_per_item * kBlockM * head_dim_padded);  // block c: (kBlockM, head_dim_padded) at c * kBlockM * head_dim_padded
    HeadMask extra;
    // One (b, query head h, run of query blocks) item.
    auto run_item = [&](std::int64_t b, std::int64_t h, std::int64_t query_item) {
      const MaskRule mask = params.mask_of(b);
      const std::int64_t item_row_begin = query_item * q_blocks_per_item * kBlockM;
      if (item_row_begin >= mask.seqlen_q) return;
      const std::int64_t blocks = std::min(q_blocks_per_item, (mask.seqlen_q - item_row_begin + kBlockM - 1) / kBlockM);
      const std::int64_t item_row_end = std::min(mask.seqlen_q, item_row_begin + blocks * kBlockM);
      const std::int64_t h_kv = h / params.group_size;
      const HeadVariant variant = head_variant(params, b, h, mask);
      extra.reset(params, b, h);
      for (std::int64_t c = 0; c < blocks; ++c) {
        const std::int64_t row_begin = item_row_begin + c * kBlockM;
        query_blocks[static_cast<std::size_t>(c)].load(params, b, h, row_begin, std::min(kBlockM, mask.seqlen_q - row_begin), q_scale, delta);
      }
      std::fill(dq.data(), dq.data() + blocks * kBlockM * head_dim_padded, 0.0f);
      const auto cols = mask.columns_of_rows(item_row_begin, item_row_end);
      const std::int64_t first_col = cols.begin < cols.end ? block_floor(cols.begin, kBlockN) : cols.end;
      for (std::int64_t col_begin = first_col; col_begin < cols.end; col_begin += kBlockN) {
        const std::int64_t n = std::min(kBlockN, mask.seqlen_k - col_begin);
        // K0 of the block mask: key blocks none of the item's rows visit are not loaded.
        if (extra.is_active() && extra.tile_kind(item_row_begin, item_row_end, col_begin, col_begin + n) == TileKind::empty) continue;
        kb.load(params, b, h_kv, col_begin, n, head_dim_padded);
        for (std::int64_t c = 0; c < blocks; ++c) {
          const std::int64_t row_begin = item_row_begin + c * kBlockM;
          const std::int64_t rows = std::min(kBlockM, mask.seqlen_q - row_begin);
          const TileRange r = tile_range(mask, row_begin, rows, col_begin, n);
          if (r.empty()) continue;
          const TileMask tile_mask = tile_mask_of(extra, r, row_begin, rows, col_begin, has_dbias ? dbias.data() : nullptr, &dbias_index, b, h,
                                                  mask.seqlen_k);
          if (tile_mask.kind == TileKind::empty) continue;
          const bool has_hidden = probabilities_and_score_gradients(kernels, mask, variant, query_blocks[static_cast<std::size_t>(c)], row_begin,
                                                                    rows, col_begin, r, kb.k, kb.k_stride, kb.v, kb.v_stride, scratch, tile_mask);
          // dQ (lanes, head_dim_padded) += dS K: dS read through dS^T's strides.
          if (has_hidden && !kb.all_finite_k) {  // the NaN rule: a hidden 0 never meets a NaN/Inf row of K
            visible_matmul(scratch.ds_t.data() + r.key_begin * kBlockM + r.lane_begin, scratch.hidden.data() + r.key_begin * kBlockM + r.lane_begin,
                           1, kBlockM, kb.k + r.key_begin * kb.k_stride, kb.k_stride, r.keys(), dq.data() + (c * kBlockM + r.lane_begin) * head_dim_padded,
                           head_dim_padded, r.lanes(), head_dim_padded);
            continue;
          }
          kernels.matmul(scratch.ds_t.data() + r.key_begin * kBlockM + r.lane_begin, 1, kBlockM, kb.k + r.key_begin * kb.k_stride, kb.k_stride,
                         r.keys(), dq.data() + (c * kBlockM + r.lane_begin) * head_dim_padded, head_dim_padded, r.lanes(), head_dim_padded, true);
        }
      }
      for (std::int64_t r = 0; r < item_row_end - item_row_begin; ++r)
        store_row(dq.data() + r * head_dim_padded, head_dim, params.softmax_scale, params.dq, params.dtype,
                  params.dq_offset(b, h) + (item_row_begin + r) * params.dq_row_stride);
    };
    if (!dbias_is_shared) {
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t item = 0; item < q_items; ++item) {
        const std::int64_t query_item = query_items - 1 - item % query_items;  // most keys first under a causal mask
        run_item(item / (query_items * params.heads_q), (item / query_items) % params.heads_q, query_item);
      }
    } else {
      // Items own dBias elements: the dimensions dBias broadcasts over run inside one item.
      const std::int64_t batch_items = dbias_index.shape[0] == 1 ? 1 : params.batch;
      const std::int64_t head_items = dbias_index.shape[1] == 1 ? 1 : params.heads_q;
      const std::int64_t row_items = dbias_index.shape[2] == 1 ? 1 : query_items;
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t item = 0; item < batch_items * head_items * row_items; ++item) {
        const std::int64_t own_row = item % row_items, own_h = (item / row_items) % head_items, own_b = item / (row_items * head_items);
        for (std::int64_t b = (batch_items == 1 ? 0 : own_b); b < (batch_items == 1 ? params.batch : own_b + 1); ++b)
          for (std::int64_t h = (head_items == 1 ? 0 : own_h); h < (head_items == 1 ? params.heads_q : own_h + 1); ++h)
            for (std::int64_t qi = (row_items == 1 ? 0 : own_row); qi < (row_items == 1 ? query_items : own_row + 1); ++qi) run_item(b, h, qi);
      }
    }
  }
  if (has_dbias) store_dbias(params, dbias);
}

}  // namespace flashattn::cpu
