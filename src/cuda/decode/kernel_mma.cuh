// src/cuda/decode/kernel_mma.cuh — the split-KV ("flash-decoding") attention kernel
// on tensor cores (mma.sync m16n8k16).
//
// Why tensor cores for a memory-bound kernel: at 3 TB/s an H100 SM must consume
// ~13 bytes of K/V per clock. With fp32 FMAs, S = q K^T and O += P V cost 2 FMAs per
// 16-bit element per query row, plus conversions, shuffles and the softmax: the FMA
// kernel (kernel_fma.cuh) measured 1.06 TB/s at batch 8 / KV 64k on the H100
// (2026-11-22), issue-bound. One mma does 2048 FMAs, so even with the 16-row tile
// mostly padding (a GQA group of 4 uses 4 of 16 rows) the math vanishes under the
// loads and the kernel is left with what it should be: moving bytes.
//
// Work decomposition. One CTA = (query block, split, kv head, sequence):
//   * query rows: the GQA group's query heads x seqlen_q positions, packed as
//     row = i * group_size + g; a CTA takes kRows = 16 of them (one mma M tile), so
//     one read of K/V serves the whole group (GQA packing);
//   * keys: the sequence's key range cut into num_splits chunks of whole tiles;
//     a tile is kTileN = 64 keys, warp w takes keys [16w, 16w + 16) of it.
// K/V tiles stream through a kStages-deep cp.async pipeline in swizzled shared
// memory (16-byte copies; for a paged cache the page-table entries are looked up a
// tile ahead); q joins the first copy group. Each warp keeps its own online-softmax
// state for the 16 rows; at the end the warps' states are merged with
// online_softmax::merge through shared memory, and the CTA writes the output (one
// split), or a normalised partial (O, LSE) row: into the workspace for the combine
// kernel, or — two splits launched as one thread-block cluster — into its shared
// memory, where the cluster merges the splits itself (distributed shared memory).
// The kernel is launched with PDL (launch_kernel.cuh): it waits for the previous
// kernel before its first read.
// Scores: each packed row's ScoreRule (flashattn/score.hpp; its query head's ALiBi slope,
// the diagonal of its sequence's length) in score_tile — ALiBi on whole tiles left of every
// row's diagonal in its affine form (common/alibi_path.hpp) —; the online softmax is
// online_softmax::State with the SFU's exp2 (DecodeState), both shared with kernel_tma.cuh.
//
// Measured on the H100 (bench/results/gpu_decode.md, 2026-11-22): 1.64 / 2.43 / 2.90 /
// 3.05 TB/s at batch 8, 32/8 heads, d128, KV 1k / 4k / 16k / 64k (device copy 3.01).
// It runs where the TMA kernel (kernel_tma.cuh) cannot: GPUs before Hopper,
// cache_batch_idx, strides a tensor map cannot encode (kernel_choice.hpp).
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "flashattn/score.hpp"
#include "src/core/kvcache_params.hpp"
#include "src/cuda/common/fragment.cuh"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/common/sfu_math.cuh"
#include "src/cuda/common/swizzle.cuh"
#include "src/cuda/decode/launch_kernel.cuh"
#include "src/cuda/decode/rotary.cuh"
#include "src/cuda/ptx/arch.cuh"
#include "src/cuda/ptx/cp_async.cuh"
#include "src/cuda/ptx/ldmatrix.cuh"
#include "src/cuda/ptx/mma_sync.cuh"

namespace flashattn::cuda::decode {

// Tile geometry (performance-only: results do not depend on it).
template <int kHeadDim_>
struct MmaDecodeConfig {
  static constexpr int kHeadDim = kHeadDim_;  // padded head dim (64, 128, 256)
  static constexpr int kRows = 16;            // packed query rows per CTA: one mma M tile
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKeysPerWarp = 16;     // one mma K step of P V
  static constexpr int kTileN = kWarps * kKeysPerWarp;
  // Enough tiles in flight to cover HBM latency, within 2 CTAs per SM for d <= 128.
  // Deeper is not better: 6 stages with one CTA per SM (200 KiB) measured 10-15% slower
  // than 3 stages at batch 8, KV 1k-16k, 2 splits on the H100 (2026-11-22) — it also
  // leaves no room on the SM for the next step's CTAs to launch early (PDL).
  static constexpr int kStages = kHeadDim <= 64 ? 4 : (kHeadDim <= 128 ? 3 : 2);
  static constexpr int kMinBlocksPerSm = kHeadDim <= 128 ? 2 : 1;
  using KVTile = SwizzledTile<kTileN, kHeadDim>;  // (kTileN, kHeadDim)
  using QTile = SwizzledTile<kRows, kHeadDim>;    // (kRows, kHeadDim)
  static constexpr int kChunks = kHeadDim / 8;    // 16-byte chunks per row
  static constexpr int kKSteps = kHeadDim / 16;   // mma K steps of S = Q K^T
  static constexpr int kDTiles = kHeadDim / 8;    // mma N tiles of O = P V
  static constexpr int kStageBytes = 2 * KVTile::kBytes;  // K and V
  static constexpr int kQBytes = QTile::kBytes;
  static constexpr int kPipelineBytes = kQBytes + kStages * kStageBytes;
  // Merge area (reuses everything): per warp, per row, m and l, then o (kRows, kHeadDim),
  // then per warp and row the merge scale, per row the LSE, and the CTA's normalised
  // rows (kRows, kHeadDim) for the in-cluster merge of the splits.
  static constexpr int kMergeBytes = (kWarps * kRows * (3 + kHeadDim) + kRows + kRows * kHeadDim) * 4;
  static constexpr int kSharedBytes = kPipelineBytes > kMergeBytes ? kPipelineBytes : kMergeBytes;
  static_assert((kTileN * kChunks) % kThreads == 0, "whole chunks per thread");
  static_assert(kDTiles % 2 == 0, "ldmatrix x4 covers pairs of tiles");
};

// A lane's two rows of every S fragment (half 0: group_row, half 1: group_row + 8 of the
// CTA's 16 packed (position, query head) rows), as score_tile reads them: the score rule
// of the row's query head (a GQA group's heads have their own ALiBi slopes), and as
// 32-bit offsets from the CTA's first tile key `origin`, the keys the row may see,
// [key_begin, key_end) — its mask columns within the CTA's keys, none for a padding
// row — and its ALiBi distance to key offset 0. Built once per CTA: the loop keeps six
// integers per lane, not the rows' int64 positions and mask bounds.
struct LaneRows {
  ScoreRule rule[2];
  int key_begin[2], key_end[2], distance0[2];
};
__device__ __forceinline__ LaneRows lane_rows(const AttentionParams& a, const MaskRule& mask, std::int64_t b, const std::int64_t (&head)[2],
                                              const std::int64_t (&position)[2], const bool (&is_row)[2], std::int64_t key_begin,
                                              std::int64_t key_end, std::int64_t origin) {
  LaneRows rows;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    rows.rule[half] = a.score_of(b, head[half], mask);
    const std::int64_t begin = mask.col_begin(position[half]) > key_begin ? mask.col_begin(position[half]) : key_begin;
    const std::int64_t end = mask.col_end(position[half]) < key_end ? mask.col_end(position[half]) : key_end;
    rows.key_begin[half] = static_cast<int>(begin - origin);  // one CTA's keys: < 2^31 apart (validate_kvcache)
    rows.key_end[half] = is_row[half] ? static_cast<int>(end - origin) : rows.key_begin[half];
    rows.distance0[half] = static_cast<int>(rows.rule[half].distance(position[half], origin));
  }
  return rows;
}

// One tile's score step of a warp, for its (16 rows, 16 keys) S fragments, two n8 tiles
// of the m16n8 layout (common/fragment.cuh; softmax_tile reads the same): raw q·k -> log2
// scores by the rows' ScoreRules (flashattn/score.hpp), -inf where masked. Each element's
// row (half = row / 8 picks the lane's LaneRows entry) and key come from
// fragment::for_each_element: lane_key is the key offset (from the origin of LaneRows) of
// the lane's element 0, an element's key is lane_key + its column. Whole tiles
// (is_full_tile: every row sees every key) skip the element mask, and when the call's rule
// is a plain positive scale (is_fast_tile: no softcap, no ALiBi) take the fast path, one
// multiply per score: warp-uniform branches, so the common path is straight-line. Rows
// past row_end need no mask there: their q is zero and their output is never written.
// kPairStride: the key distance between elements e = 0 and e = 1 of a lane (1 here; the
// FP8 kernel's key permutation, kernel_mma_fp8.cuh, makes it 4).
// is_affine_tile: a whole tile left of every row's diagonal (WholeTiles::is_left) with ALiBi
// and no softcap: the bias is linear in the key there (ScoreRule::bias_on_side), two FFMAs
// per score from the row's bias at lane_key, instead of the per-element form's subtract,
// int-to-float conversion, multiply and FFMA under per-element uniform branches (SASS, sm_80
// d128: 22 instructions per lane and tile against ~110 with ~24 branches).
template <int kPairStride = 1>
__device__ __forceinline__ void score_tile(float (&s)[2][4], const LaneRows& rows, bool is_fast_tile, bool is_full_tile,
                                           bool is_affine_tile, int lane_key) {
  float(&scores)[8] = fragment::flat(s);
  if (is_fast_tile) {
    fragment::for_each_element<2, kPairStride>(
        [&](int index, int row, int) { scores[index] *= rows.rule[row / 8].scale_log2; });
    return;
  }
  if (is_affine_tile) {
    float bias0[2], bias_per_key[2];  // of the lane's row of each half: the bias at lane_key, its step per key
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const ScoreRule& rule = rows.rule[half];
      bias0[half] = rule.bias_on_side(DiagonalSide::left, static_cast<float>(rows.distance0[half] - lane_key));
      bias_per_key[half] = -rule.bias_on_side(DiagonalSide::left, 1.0f);  // a key further: a distance less
    }
    fragment::for_each_element<2, kPairStride>([&](int index, int row, int column) {
      const int half = row / 8;
      scores[index] = fmaf(scores[index], rows.rule[half].scale_log2,
                           fmaf(bias_per_key[half], static_cast<float>(column), bias0[half]));
    });
    return;
  }
  fragment::for_each_element<2, kPairStride>([&](int index, int row, int column) {
    const int half = row / 8, key = lane_key + column;
    const bool is_allowed = is_full_tile || (key >= rows.key_begin[half] && key < rows.key_end[half]);
    scores[index] = is_allowed ? rows.rule[half].log2_score_at(scores[index], rows.distance0[half] - key)
                               : online_softmax::negative_infinity<float>();
  });
}

// Features d..d+3 of output row (b, h, i), and its LSE with the first quad.
template <class T>
__device__ __forceinline__ void store_output_quad(const AttentionParams& a, std::int64_t b, std::int64_t h, std::int64_t i, int d,
                                                  float4 value, float lse) {
  using Numeric = Numeric<T>;
  T* out = static_cast<T*>(a.out) + a.out_offset(b, h) + i * a.out_row_stride + d;
  out[0] = Numeric::from_float(value.x), out[1] = Numeric::from_float(value.y);
  out[2] = Numeric::from_float(value.z), out[3] = Numeric::from_float(value.w);
  if (d == 0 && a.maybe_lse) a.maybe_lse[a.lse_offset(b, h) + i * a.lse_row_stride] = lse;
}

// The tiles of kTileN keys, numbered from the key `origin`, that every row of positions
// [position_begin, position_end) sees whole inside the CTA's keys [key_begin, key_end):
// [first, end). Those tiles skip the element mask. Of them, those below left_end lie left
// of every row's diagonal (each key <= position_begin + seqlen_k - seqlen_q): ALiBi's
// affine form there (score_tile).
struct WholeTiles {
  int first = 0, end = 0, left_end = 0;
  __device__ __forceinline__ bool contains(int tile) const { return tile >= first && tile < end; }
  __device__ __forceinline__ bool is_left(int tile) const { return tile < left_end; }
};
template <int kTileN>
__device__ __forceinline__ WholeTiles whole_tiles(const MaskRule& mask, std::int64_t position_begin, std::int64_t position_end,
                                                  std::int64_t key_begin, std::int64_t key_end, std::int64_t origin) {
  const MaskRule::ColumnRange all = mask.columns_of_all_rows(position_begin, position_end);
  const std::int64_t begin = all.begin > key_begin ? all.begin : key_begin, end = all.end < key_end ? all.end : key_end;
  WholeTiles tiles;
  if (end > begin) {
    tiles.first = static_cast<int>((begin - origin + kTileN - 1) / kTileN);
    tiles.end = static_cast<int>((end - origin) / kTileN);
    // The first left_keys keys from origin are left of the first row's diagonal, hence of every row's.
    const std::int64_t left_keys = position_begin + mask.seqlen_k - mask.seqlen_q + 1 - origin;
    tiles.left_end = left_keys > 0 ? static_cast<int>((left_keys < end - origin ? left_keys : end - origin) / kTileN) : 0;
  }
  return tiles;
}

// The online-softmax state of the decode kernels' tile loops and epilogues: State's
// rules with the SFU's exp2, log2 and 1/x (common/sfu_math.cuh).
using DecodeState = online_softmax::State<float, SfuMath>;

// One 64-key tile's online-softmax step of a warp, for its (16 rows, 16 keys) score
// fragments s (log2 units, masked = -inf; row group_row in s[.][0..1], row group_row + 8 in
// s[.][2..3], the row's 16 keys over the 4 lanes of a quad): State::raise_max (an empty
// row's factor is ex2(-inf) = 0, an unchanged max's exactly 1), the accumulator o rescaled
// only when some row's max moved (a warp vote: skipping a multiply by exactly 1 changes no
// bit), the tile's terms added to l, and P packed as the A fragment of O += P V (the S
// fragments of the two n8 tiles, mma_sync.cuh).
template <class T, int kDTiles>
__device__ __forceinline__ void softmax_tile(const float (&s)[2][4], DecodeState (&state)[2], float (&o)[kDTiles][4],
                                             std::uint32_t (&p_fragment)[4]) {
  float factor[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float block_max = fmaxf(fmaxf(s[0][2 * half], s[0][2 * half + 1]), fmaxf(s[1][2 * half], s[1][2 * half + 1]));
    block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
    block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
    factor[half] = state[half].raise_max(block_max);
  }
  if (__any_sync(0xffffffffu, factor[0] != 1.0f || factor[1] != 1.0f)) {
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      o[n][0] *= factor[0], o[n][1] *= factor[0];
      o[n][2] *= factor[1], o[n][3] *= factor[1];
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float p[2][2];
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) p[t][e] = state[half].term(s[t][2 * half + e]);
    state[half].add(p[0][0] + p[0][1] + p[1][0] + p[1][1]);
    p_fragment[half] = pack_pair<T>(p[0][0], p[0][1]);
    p_fragment[2 + half] = pack_pair<T>(p[1][0], p[1][1]);
  }
}

// The end of a split-KV CTA, once its warps' {m, l} (kWarps, kRows) and unnormalised
// o rows (kWarps, kRows, kHeadDim) are in shared memory (merge_m, merge_l, merge_o from
// `shared` on) and the CTA has synchronised: the warps' states merged per row, the rows
// normalised and multiplied by output_scale (an FP8 cache's v_descale; 1 otherwise:
// exact), then written as the output (one split), a workspace partial for the combine
// kernel, or merged with the other split of the cluster (distributed shared memory).
template <class T, class Config>
__device__ __forceinline__ void store_split_rows(const KVCacheParams& params, unsigned char* shared, float output_scale, int split,
                                                 bool is_cluster_merge, std::int64_t row_begin, std::int64_t row_end, std::int64_t h_kv,
                                                 std::int64_t b) {
  constexpr int kRows = Config::kRows, kThreads = Config::kThreads, kHeadDim = Config::kHeadDim;
  const AttentionParams& a = params.attention;
  const int tid = threadIdx.x;
  const int num_splits = params.num_splits;
  const std::int64_t group = a.group_size;
  float* merge_m = reinterpret_cast<float*>(shared);
  float* merge_l = merge_m + Config::kWarps * kRows;
  float* merge_o = merge_l + Config::kWarps * kRows;

  // Per row: the merged state and each warp's scale (rescale factor / row sum), so the
  // per-element loop below is kWarps multiply-adds.
  float* merge_scale = merge_o + Config::kWarps * kRows * kHeadDim;  // (kWarps, kRows)
  float* merge_lse = merge_scale + Config::kWarps * kRows;            // (kRows)
  if (tid < kRows) {
    online_softmax::State<float> total;
    float factor[Config::kWarps];
#pragma unroll
    for (int w = 0; w < Config::kWarps; ++w) {
      online_softmax::State<float> part;
      part.m = merge_m[w * kRows + tid];
      part.l = merge_l[w * kRows + tid];
      float factor_total, factor_part;
      total = online_softmax::merge(total, part, &factor_total, &factor_part);
#pragma unroll
      for (int v = 0; v < w; ++v) factor[v] *= factor_total;
      factor[w] = factor_part;
    }
#pragma unroll
    for (int w = 0; w < Config::kWarps; ++w) merge_scale[w * kRows + tid] = factor[w] * total.inverse_sum() * output_scale;
    merge_lse[tid] = total.lse();
  }
  __syncthreads();

  // Output (one split) or normalised partial row, four features per thread per step:
  // to the workspace for the combine kernel, or to this CTA's shared memory when the
  // splits merge inside their cluster (below).
  float* cluster_o = merge_lse + kRows;  // (kRows, kHeadDim): this split's normalised rows
  const bool is_single_split = num_splits == 1;
  constexpr int kQuads = kHeadDim / 4;
  const int rows_here = static_cast<int>(row_end - row_begin);
  for (int element = tid; element < rows_here * kQuads; element += kThreads) {
    const int r = element / kQuads, d = 4 * (element % kQuads);
    if (d >= a.head_dim) continue;  // head_dim is a multiple of 8: a quad is all in or all out
    float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < Config::kWarps; ++w) {
      const float scale = merge_scale[w * kRows + r];
      const float4 x = *reinterpret_cast<const float4*>(merge_o + (w * kRows + r) * kHeadDim + d);
      value.x += scale * x.x, value.y += scale * x.y, value.z += scale * x.z, value.w += scale * x.w;
    }
    const std::int64_t packed = row_begin + r;
    const std::int64_t i = packed / group, h = h_kv * group + packed % group;
    if (is_single_split) {
      store_output_quad<T>(a, b, h, i, d, value, merge_lse[r]);
    } else if (is_cluster_merge) {
      *reinterpret_cast<float4*>(cluster_o + r * kHeadDim + d) = value;
    } else {
      float* partial_o = static_cast<float*>(params.maybe_workspace);
      const std::int64_t row = params.partial_row(split, b, h, i);
      *reinterpret_cast<float4*>(partial_o + row * a.head_dim + d) = value;
      if (d == 0) partial_o[params.num_splits * params.partial_rows() * a.head_dim + row] = merge_lse[r];
    }
  }

#if FLASHATTN_SM90_DEVICE_CODE
  if (is_cluster_merge) {
    // The splits of this query block are the CTAs of one cluster (rank = split): merge
    // their rows through distributed shared memory — out = sum_s w_s o_s with
    // w_s = e^(lse_s - lse), as the combine kernel does — with no workspace round trip
    // and no second kernel. CTA `split` merges its share of the rows' quads.
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();  // every split's rows and LSEs are in its shared memory
    const int quads = rows_here * kQuads;
    const int per_split = (quads + num_splits - 1) / num_splits;
    const int last = (split + 1) * per_split < quads ? (split + 1) * per_split : quads;
    for (int element = split * per_split + tid; element < last; element += kThreads) {
      const int r = element / kQuads, d = 4 * (element % kQuads);
      if (d >= a.head_dim) continue;
      float split_lse[kMaxClusterSplits];
      float lse = online_softmax::negative_infinity<float>();
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        split_lse[s] = s < num_splits ? *cluster.map_shared_rank(merge_lse + r, s) : online_softmax::negative_infinity<float>();
        lse = online_softmax::merge_weights(lse, split_lse[s]).lse;
      }
      const float lse_log2 = lse * static_cast<float>(online_softmax::kLog2e);
      float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (s >= num_splits) break;
        const float weight = online_softmax::rescale_factor(split_lse[s] * static_cast<float>(online_softmax::kLog2e), lse_log2);
        const float4 x = *reinterpret_cast<const float4*>(cluster.map_shared_rank(cluster_o + r * kHeadDim + d, s));
        value.x += weight * x.x, value.y += weight * x.y, value.z += weight * x.z, value.w += weight * x.w;
      }
      const std::int64_t packed = row_begin + r;
      store_output_quad<T>(a, b, h_kv * group + packed % group, packed / group, d, value, lse);
    }
    cluster.sync();  // no CTA exits while another still reads its shared memory
  }
#endif
}

template <class T, class Config>
__global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocksPerSm)
    mma_decode_kernel(const __grid_constant__ KVCacheParams params, bool is_alibi_affine) {
  using Numeric = Numeric<T>;
  using KVTile = typename Config::KVTile;
  using QTile = typename Config::QTile;
  constexpr int kRows = Config::kRows, kTileN = Config::kTileN, kStages = Config::kStages, kThreads = Config::kThreads;
  constexpr int kChunks = Config::kChunks, kHeadDim = Config::kHeadDim;
  extern __shared__ __align__(128) unsigned char shared[];
  T* q_tile = reinterpret_cast<T*>(shared);                     // (kRows, kHeadDim), swizzled
  T* kv_tiles = reinterpret_cast<T*>(shared + Config::kQBytes);  // [stage][K|V] (kTileN, kHeadDim), swizzled

  // Everything below reads what earlier kernels wrote (cache, q, lengths, page table).
  wait_for_prior_grids();
  // The combine (or the next step) may start launching: it waits for our completion.
  allow_dependent_launch();

  const AttentionParams& a = params.attention;
  const int num_splits = params.num_splits;
  const int split = static_cast<int>(blockIdx.x) % num_splits;
  // Launched in clusters of num_splits CTAs (launch_decode.cuh): the splits merge here.
#if FLASHATTN_SM90_DEVICE_CODE
  const bool is_cluster_merge = num_splits > 1 && cooperative_groups::this_cluster().num_blocks() == static_cast<unsigned>(num_splits);
#else
  const bool is_cluster_merge = false;
#endif
  const std::int64_t query_block = blockIdx.x / num_splits;
  const std::int64_t h_kv = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int group_row = lane / 4, quad_lane = lane % 4;  // mma fragment coordinates

  const std::int64_t group = a.group_size;
  const std::int64_t packed_rows = a.seqlen_q * group;
  const std::int64_t row_begin = query_block * kRows;
  const std::int64_t row_end = row_begin + kRows < packed_rows ? row_begin + kRows : packed_rows;
  const MaskRule mask = params.mask_of(b);
  const std::int64_t first_position = params.leftpad(b);
  const std::int64_t position_begin = row_begin / group, position_end = (row_end - 1) / group + 1;

  // Keys this CTA visits: the rows' mask columns, intersected with the split's tiles.
  const MaskRule::ColumnRange seen = mask.columns_of_rows(position_begin, position_end);
  const std::int64_t key_blocks = (mask.seqlen_k + kTileN - 1) / kTileN;
  const std::int64_t blocks_per_split = (key_blocks + num_splits - 1) / num_splits;
  std::int64_t key_begin = split * blocks_per_split * kTileN, key_end = key_begin + blocks_per_split * kTileN;
  if (key_begin < seen.begin) key_begin = seen.begin;
  if (key_end > seen.end) key_end = seen.end;
  const int num_tiles = key_end > key_begin ? static_cast<int>((key_end - key_begin + kTileN - 1) / kTileN) : 0;

  // Each thread copies a fixed 16-byte column chunk of kPasses key rows, kRowsPerPass apart.
  constexpr int kRowsPerPass = kThreads / kChunks;
  constexpr int kPasses = kTileN / kRowsPerPass;
  static_assert(kRowsPerPass <= 16, "one pass crosses at most one page boundary (page_size >= 16)");
  const int copy_chunk = tid % kChunks;
  const int copy_row = tid / kChunks;
  const bool has_chunk = copy_chunk * 8 < a.head_dim;
  // Per-CTA constant parts of the K/V addresses (kv head, this thread's chunk, and for a
  // contiguous cache the sequence's cache row), so a key row costs one multiply-add.
  const T* k_base = static_cast<const T*>(a.k) + h_kv * a.k_head_stride + copy_chunk * 8;
  const T* v_base = static_cast<const T*>(a.v) + h_kv * a.v_head_stride + copy_chunk * 8;
  const bool is_paged = params.is_paged();
  const std::int32_t* page_table = params.maybe_block_table + b * params.block_table_stride;
  const int page_size = static_cast<int>(params.page_size);
  if (!is_paged) {
    const std::int64_t cache_b = params.cache_row(b);  // clamped into k_cache (kvcache_params.hpp)
    k_base += cache_b * a.k_batch_stride;
    v_base += cache_b * a.v_batch_stride;
  }
  const std::int64_t range_position = first_position + key_begin;  // cache position of the first key visited

  // Paged cache: (block, row in block) of this thread's rows of a tile. The loop looks
  // them up one tile ahead (page_block/page_row: the next tile to load), so the
  // page-table loads of tile t + 1 are in flight while tile t is computed instead of
  // stalling the copies; the prologue looks up its tiles all at once. The page index
  // advances by comparison: one division per tile. At d = 256 (16 passes, the kernel at
  // the 255-register limit) the 32 look-ahead registers cost ~130 bytes of spills: there
  // load_tile advances the page row by row itself, just before each copy (36 bytes).
  constexpr bool kResolvesAhead = kPasses <= 8;
  using PassInts = std::int32_t[kPasses];
  PassInts page_block, page_row;
  const auto resolve_pages = [&](int tile, PassInts& block_of, PassInts& row_of) {
    const std::int64_t tile_rows_left = key_end - key_begin - static_cast<std::int64_t>(tile) * kTileN;
    const int position = static_cast<int>(range_position + static_cast<std::int64_t>(tile) * kTileN) + copy_row;  // < 2^31 (validate_kvcache)
    int page = position / page_size, in_page = position - page * page_size;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      if (pass > 0) {
        in_page += kRowsPerPass;
        if (in_page >= page_size) in_page -= page_size, ++page;
      }
      block_of[pass] = copy_row + pass * kRowsPerPass < tile_rows_left ? params.page_block(page_table, page) : 0;
      row_of[pass] = in_page;
    }
  };
  // Contiguous cache: this thread's first row of the range, and the steps between its
  // rows, as pointers (a copy then costs a 64-bit add, not an index product).
  const T* k_rows = k_base + (range_position + copy_row) * a.k_row_stride;
  const T* v_rows = v_base + (range_position + copy_row) * a.v_row_stride;
  const std::int64_t k_pass_stride = kRowsPerPass * a.k_row_stride, v_pass_stride = kRowsPerPass * a.v_row_stride;
  const auto load_tile = [&](int tile, int stage, const PassInts& block_of, const PassInts& row_of) {
    T* k_tile = kv_tiles + stage * 2 * KVTile::kElements;
    T* v_tile = k_tile + KVTile::kElements;
    const std::int64_t tile_position = range_position + static_cast<std::int64_t>(tile) * kTileN;
    const std::int64_t tile_rows_left = key_end - key_begin - static_cast<std::int64_t>(tile) * kTileN;
    if (!is_paged) {
      const int rows_left = tile_rows_left < kTileN ? static_cast<int>(tile_rows_left) : kTileN;
      const T* k_src = k_rows + static_cast<std::int64_t>(tile) * kTileN * a.k_row_stride;
      const T* v_src = v_rows + static_cast<std::int64_t>(tile) * kTileN * a.v_row_stride;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int row = copy_row + pass * kRowsPerPass;
        const bool is_valid = row < rows_left && has_chunk;
        const int offset = KVTile::chunk_offset(row, copy_chunk);
        ptx::cp_async_16(ptx::shared_address(k_tile + offset), k_src + pass * k_pass_stride, is_valid);
        ptx::cp_async_16(ptx::shared_address(v_tile + offset), v_src + pass * v_pass_stride, is_valid);
      }
      return;
    }
    // Without the look-ahead: the page of each row, advanced pass by pass (no arrays).
    int page = 0, in_page = 0;
    if (!kResolvesAhead && is_paged) {
      const int position = static_cast<int>(tile_position) + copy_row;
      page = position / page_size, in_page = position - page * page_size;
    }
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = copy_row + pass * kRowsPerPass;
      const bool is_valid = row < tile_rows_left && has_chunk;
      std::int64_t k_offset, v_offset;
      if (!kResolvesAhead && is_paged) {
        if (pass > 0) {
          in_page += kRowsPerPass;
          if (in_page >= page_size) in_page -= page_size, ++page;
        }
        const std::int64_t block = row < tile_rows_left ? params.page_block(page_table, page) : 0;
        k_offset = block * a.k_batch_stride + in_page * a.k_row_stride;
        v_offset = block * a.v_batch_stride + in_page * a.v_row_stride;
      } else {
        k_offset = block_of[pass] * a.k_batch_stride + row_of[pass] * a.k_row_stride;
        v_offset = block_of[pass] * a.v_batch_stride + row_of[pass] * a.v_row_stride;
      }
      const int offset = KVTile::chunk_offset(row, copy_chunk);
      ptx::cp_async_16(ptx::shared_address(k_tile + offset), k_base + k_offset, is_valid);
      ptx::cp_async_16(ptx::shared_address(v_tile + offset), v_base + v_offset, is_valid);
    }
  };

  // q rows of this CTA (row r = packed query row row_begin + r), zero past the rows and
  // head_dim. Without rotary and with 16-byte aligned rows, q takes the cp.async path in
  // the first copy group (all its loads in flight at once); otherwise it is rotated like
  // flash_attn and rounded to T, feature by feature, after the K/V copies are issued.
  const bool is_q_copied = !params.has_rotary() && reinterpret_cast<std::uintptr_t>(a.q) % 16 == 0 && a.q_batch_stride % 8 == 0 &&
                           a.q_row_stride % 8 == 0 && a.q_head_stride % 8 == 0;
  const auto q_row_of = [&](int r) {
    const std::int64_t packed = row_begin + r;
    const bool is_row = packed < row_end;
    const std::int64_t i = is_row ? packed / group : 0, h = h_kv * group + (is_row ? packed % group : 0);
    return static_cast<const T*>(a.q) + a.q_offset(b, h) + i * a.q_row_stride;
  };
  if (is_q_copied) {
#pragma unroll
    for (int c = tid; c < kRows * kChunks; c += kThreads) {
      const int r = c / kChunks, chunk = c % kChunks;
      const bool is_valid = row_begin + r < row_end && chunk * 8 < a.head_dim;
      ptx::cp_async_16(ptx::shared_address(q_tile + QTile::chunk_offset(r, chunk)), q_row_of(r) + chunk * 8, is_valid);
    }
  }

  // Start streaming K/V: the first tiles' latency overlaps the q setup.
  if constexpr (kResolvesAhead) {
    PassInts prologue_block[kStages - 1], prologue_row[kStages - 1];
    if (is_paged) {
#pragma unroll
      for (int stage = 0; stage < kStages - 1; ++stage)
        if (stage < num_tiles) resolve_pages(stage, prologue_block[stage], prologue_row[stage]);
      if (kStages - 1 < num_tiles) resolve_pages(kStages - 1, page_block, page_row);
    }
#pragma unroll
    for (int stage = 0; stage < kStages - 1; ++stage) {
      if (stage < num_tiles) load_tile(stage, stage, prologue_block[stage], prologue_row[stage]);
      ptx::cp_async_commit_group();  // empty groups keep the count uniform
    }
  } else {
#pragma unroll
    for (int stage = 0; stage < kStages - 1; ++stage) {
      if (stage < num_tiles) load_tile(stage, stage, page_block, page_row);
      ptx::cp_async_commit_group();
    }
  }

  if (!is_q_copied) {
    for (int r = 0; r < kRows; ++r) {
      const bool is_row = row_begin + r < row_end;
      const T* q_row = q_row_of(r);
      const std::int64_t rotary_position = params.has_rotary() && is_row ? params.q_rotary_position(b, (row_begin + r) / group) : 0;
      for (int d = tid; d < kHeadDim; d += kThreads) {
        float x = 0.0f;
        if (is_row && d < a.head_dim)
          x = (params.has_rotary() && d < params.rotary_dim) ? rotate_feature<T>(params, q_row, d, rotary_position)
                                                              : Numeric::to_float(q_row[d]);
        q_tile[QTile::offset(r, d)] = Numeric::from_float(x);
      }
    }
  }


  DecodeState state[2];         // rows group_row, group_row + 8 (l: this lane's columns only)
  float o[Config::kDTiles][4];  // (16 rows, kHeadDim) accumulator fragments, unnormalised
#pragma unroll
  for (int n = 0; n < Config::kDTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;

  // ldmatrix lane roles: matrix (lane / 8), row (lane % 8) of it. Each lane's addresses
  // are per-lane byte offsets plus compile-time constants: a row r holds chunk c at
  // c ^ (r % 8) (SwizzledTile with 8-chunk swizzle), a lane's chunk is 2j + bit, and
  // (2j + bit) ^ (r % 8) = 2j ^ (bit ^ r % 8) — four offsets per operand cover every step.
  static_assert(KVTile::kSwizzleWidth == 8 && QTile::kSwizzleWidth == 8, "8-chunk swizzle: head dims that are multiples of 64");
  const int matrix = lane / 8, matrix_row = lane % 8;
  const int warp_key = warp * Config::kKeysPerWarp;  // first key row of this warp in a tile
  std::uint32_t q_offsets[4], k_offsets[4], v_offsets[4];
  {
    const int q_row = (matrix % 2) * 8 + matrix_row, k_row = warp_key + (matrix / 2) * 8 + matrix_row;
    const int v_row = warp_key + (matrix % 2) * 8 + matrix_row;
    const int q_xor = (matrix / 2) ^ QTile::row_swizzle(q_row), k_xor = (matrix % 2) ^ KVTile::row_swizzle(k_row);
    const int v_xor = (matrix / 2) ^ KVTile::row_swizzle(v_row);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      q_offsets[j] = ptx::shared_address(q_tile + q_row * kHeadDim + ((2 * j) ^ q_xor) * 8);
      k_offsets[j] = static_cast<std::uint32_t>((k_row * kHeadDim + ((2 * j) ^ k_xor) * 8) * 2);
      v_offsets[j] = static_cast<std::uint32_t>((v_row * kHeadDim + ((2 * j) ^ v_xor) * 8) * 2);
    }
  }
  // This thread's two rows of every fragment: group_row and group_row + 8 (key offsets from key_begin).
  LaneRows rows;
  {
    std::int64_t head[2], position[2];
    bool is_row[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::int64_t packed = row_begin + group_row + 8 * half;
      is_row[half] = packed < row_end;
      position[half] = is_row[half] ? packed / group : 0;
      head[half] = h_kv * group + packed % group;
    }
    rows = lane_rows(a, mask, b, head, position, is_row, key_begin, key_end, key_begin);
  }
  const WholeTiles whole = whole_tiles<kTileN>(mask, position_begin, position_end, key_begin, key_end, key_begin);
  const bool is_scale = a.score_is_positive_scale();  // no softcap, no ALiBi: score_tile's fast path
  const bool has_affine_alibi = is_alibi_affine && a.has_alibi() && !a.has_softcap();  // score_tile's affine form
  const std::uint32_t kv_tiles_address = ptx::shared_address(kv_tiles);
  for (int tile = 0; tile < num_tiles; ++tile) {
    ptx::cp_async_wait_group<kStages - 2>();  // this thread's copies of `tile` landed
    __syncthreads();                          // ... everyone's; and everyone is done with tile - 1
    if (tile + kStages - 1 < num_tiles) {
      load_tile(tile + kStages - 1, (tile + kStages - 1) % kStages, page_block, page_row);
      if (kResolvesAhead && is_paged && tile + kStages < num_tiles) resolve_pages(tile + kStages, page_block, page_row);
    }
    ptx::cp_async_commit_group();
    const std::uint32_t k_tile_address = kv_tiles_address + (tile % kStages) * 2 * KVTile::kBytes;
    const std::uint32_t v_tile_address = k_tile_address + KVTile::kBytes;

    // S = Q K^T for the warp's 16 keys: two n8 tiles, (16 rows, 8 keys) each.
    float s[2][4] = {};
#pragma unroll
    for (int k_step = 0; k_step < Config::kKSteps; ++k_step) {
      std::uint32_t q_fragment[4], k_fragment[4];
      // A: matrices (rows 0-7 | 8-15) x (chunk 2k | 2k+1) -> a[0..3].
      ptx::ldmatrix_x4(q_fragment[0], q_fragment[1], q_fragment[2], q_fragment[3], q_offsets[k_step % 4] + (k_step / 4) * 128);
      // B (K stored key-major = B column-major): matrices (keys 0-7 | 8-15) x (chunk 2k | 2k+1).
      ptx::ldmatrix_x4(k_fragment[0], k_fragment[1], k_fragment[2], k_fragment[3], k_tile_address + k_offsets[k_step % 4] + (k_step / 4) * 128);
      const std::uint32_t b0[2] = {k_fragment[0], k_fragment[1]}, b1[2] = {k_fragment[2], k_fragment[3]};
      ptx::mma_m16n8k16<Numeric::kMmaInput>(s[0], q_fragment, b0);
      ptx::mma_m16n8k16<Numeric::kMmaInput>(s[1], q_fragment, b1);
    }

    // Scores in log2 units; whole tiles skip the element mask.
    const bool is_full_tile = whole.contains(tile);
    score_tile(s, rows, is_full_tile && is_scale, is_full_tile, is_full_tile && has_affine_alibi && whole.is_left(tile),
               tile * kTileN + warp_key + 2 * quad_lane);

    // Online softmax per row, then P.
    std::uint32_t p_fragment[4];
    softmax_tile<T>(s, state, o, p_fragment);

    // O += P V: V stored key-major = B row-major, so ldmatrix.trans; two n8 tiles per x4.
#pragma unroll
    for (int n = 0; n < Config::kDTiles; n += 2) {
      std::uint32_t v_fragment[4];
      ptx::ldmatrix_x4_trans(v_fragment[0], v_fragment[1], v_fragment[2], v_fragment[3],
                             v_tile_address + v_offsets[(n % 8) / 2] + (n / 8) * 128);
      const std::uint32_t b0[2] = {v_fragment[0], v_fragment[1]}, b1[2] = {v_fragment[2], v_fragment[3]};
      ptx::mma_m16n8k16<Numeric::kMmaInput>(o[n], p_fragment, b0);
      ptx::mma_m16n8k16<Numeric::kMmaInput>(o[n + 1], p_fragment, b1);
    }
  }
  ptx::cp_async_wait_group<0>();
  __syncthreads();  // everyone is done with the pipeline: reuse shared memory for the merge

  // Row sums: each lane summed its own columns; the quad holds the whole row.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    state[half].l += __shfl_xor_sync(0xffffffffu, state[half].l, 1);
    state[half].l += __shfl_xor_sync(0xffffffffu, state[half].l, 2);
  }
  // Merge the warps: shared (kWarps, kRows) {m, l}, then (kWarps, kRows, kHeadDim) o.
  float* merge_m = reinterpret_cast<float*>(shared);
  float* merge_l = merge_m + Config::kWarps * kRows;
  float* merge_o = merge_l + Config::kWarps * kRows;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = group_row + 8 * half;
    if (quad_lane == 0) {
      merge_m[warp * kRows + r] = state[half].m;
      merge_l[warp * kRows + r] = state[half].l;
    }
#pragma unroll
    for (int n = 0; n < Config::kDTiles; ++n) {
      float2* dst = reinterpret_cast<float2*>(merge_o + (warp * kRows + r) * kHeadDim + 8 * n + 2 * quad_lane);
      *dst = make_float2(o[n][2 * half], o[n][2 * half + 1]);
    }
  }
  __syncthreads();

  store_split_rows<T, Config>(params, shared, 1.0f, split, is_cluster_merge, row_begin, row_end, h_kv, b);
}

}  // namespace flashattn::cuda::decode
