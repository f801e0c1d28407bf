// src/cuda/decode/kernel_mma_fp8.cuh — the split-KV decode kernel over an FP8 (e4m3)
// KV cache: kernel_mma.cuh's algorithm (one CTA = query block x split x kv head x
// sequence, 16 packed GQA rows, 64-key tiles, warp w on keys 16w..16w+15, mma.sync
// m16n8k16 in q's dtype, per-warp online softmax merged by store_split_rows), with the
// cache moved as bytes: half the bytes of a 16-bit cache per key, which is the point —
// decoding is bound by reading the cache.
//
// Bytes in, 16-bit mma operands out, without ldmatrix (it moves 16-bit elements only,
// and its .trans form cannot transpose bytes). Each lane loads the bytes its B fragments
// need with 16-byte (K) and 8-byte (V) shared loads and converts them in registers
// (cvt.rn.f16x2.e4m3x2, exact: every e4m3 value is a normal float16; bfloat16 through
// float, also exact). The mma's reduction index need not be the natural one, which is
// what makes the loads wide:
//   * S = Q K^T reduces over the features: lane (g, q) of k step ks = 4u + m takes
//     features 16(4u + q) + 4m + {0,1} (b0) and {2,3} (b1) — four bytes of its 16-byte
//     chunk 4u + q — so q's tile is staged with the same permutation of its columns
//     (feature_of_column); the dot products are unchanged.
//   * O = P V reduces over the keys: P's column n of an 8-key half is key
//     key_of_column(n) — a permutation, so that the two rows of one 16-byte-load phase
//     (d >= 128) lie in different halves of the banks — and the output's column is a
//     feature permutation: lane g loads 8 features (64v + 8g .. + 7) of its four key
//     rows as 8-byte words, and byte_perm pairs the keys of each feature (output tile
//     n = 8v + j holds feature 64v + 8g + j in column g; the epilogue writes them back
//     in feature order).
// Descales: k_descale of (b, kv head) scales the scores — folded into the score rule's
// scale (exact in real arithmetic: the rule is linear in the dot product) —, v_descale
// the normalised output (store_split_rows' output_scale); each is read once per CTA.
// Layout: K and V tiles (kTileN, kHeadDim) bytes per stage, 16-byte chunks XOR-swizzled
// per row (k_swizzle / v_swizzle) so the loads above are free of bank conflicts at
// d >= 128 (d = 64: V loads 2-way).
#pragma once

#include <cooperative_groups.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/core/kvcache_params.hpp"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/common/swizzle.cuh"
#include "src/cuda/decode/kernel_mma.cuh"
#include "src/cuda/decode/launch_kernel.cuh"
#include "src/cuda/decode/rotary.cuh"
#include "src/cuda/ptx/cp_async.cuh"
#include "src/cuda/ptx/ldmatrix.cuh"
#include "src/cuda/ptx/mma_sync.cuh"

namespace flashattn::cuda::decode {

// Tile geometry (performance-only: results do not depend on it, the permutations included).
template <int kHeadDim_>
struct MmaFp8DecodeConfig {
  static constexpr int kHeadDim = kHeadDim_;  // padded head dim (64, 128, 256)
  static constexpr int kRows = 16;            // packed query rows per CTA: one mma M tile
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKeysPerWarp = 16;
  static constexpr int kTileN = kWarps * kKeysPerWarp;  // 64
  static constexpr int kRowChunks = kHeadDim / 16;      // 16-byte chunks of one cached row
  static constexpr int kTileBytes = kTileN * kHeadDim;  // one K (or V) tile
  static constexpr int kStageBytes = 2 * kTileBytes;
  // Half the bytes of a 16-bit stage, so more stages in flight for the same shared memory
  // as kernel_mma.cuh (two CTAs per SM up to d128). Not tuned on a GPU yet.
  static constexpr int kStages = kHeadDim <= 64 ? 8 : (kHeadDim <= 128 ? 5 : 3);
  static constexpr int kMinBlocksPerSm = kHeadDim <= 128 ? 2 : 1;
  using QTile = SwizzledTile<kRows, kHeadDim>;  // (kRows, kHeadDim) of q's dtype, columns permuted
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kQBytes = QTile::kBytes;
  static constexpr int kPipelineBytes = kQBytes + kStages * kStageBytes;
  // store_split_rows' area: as MmaDecodeConfig's.
  static constexpr int kMergeBytes = (kWarps * kRows * (3 + kHeadDim) + kRows + kRows * kHeadDim) * 4;
  static constexpr int kSharedBytes = kPipelineBytes > kMergeBytes ? kPipelineBytes : kMergeBytes;
  static_assert(kHeadDim % 64 == 0, "whole 64-feature rounds of the V loads");
  static_assert(kMinBlocksPerSm == 1 || kSharedBytes <= 113 * 1024, "two CTAs per SM");

  // P's column n (0..7) of an 8-key half is key key_of_column(n) of it. At d >= 128 the
  // 8 lanes of a 16-byte-load phase (columns 0 and 1) read keys 0 and 4, whose chunks
  // k_swizzle puts in opposite halves of the banks; at d = 64 two rows share a 128-byte
  // line, so consecutive keys already do.
  static constexpr bool kInterleavesKeys = kHeadDim >= 128;
  static constexpr int kPairStride = kInterleavesKeys ? 4 : 1;  // key_of_column(2c + 1) - key_of_column(2c)
  FLASHATTN_HOST_DEVICE static constexpr int key_of_column(int n) { return kInterleavesKeys ? n / 2 + 4 * (n % 2) : n; }
  FLASHATTN_HOST_DEVICE static constexpr int k_swizzle(int row) { return kInterleavesKeys ? 4 * ((row / 4) % 2) : 0; }
  // V: the 4 rows one 8-byte-load phase reads (keys key_of_column(2q) for q = 0..3) on
  // distinct 32-byte bank groups.
  FLASHATTN_HOST_DEVICE static constexpr int v_swizzle(int row) { return kInterleavesKeys ? 2 * (row % 4) : 2 * ((row / 2) % 2); }
  FLASHATTN_HOST_DEVICE static constexpr int k_offset(int row, int chunk) { return row * kHeadDim + (chunk ^ k_swizzle(row)) * 16; }
  FLASHATTN_HOST_DEVICE static constexpr int v_offset(int row, int chunk) { return row * kHeadDim + (chunk ^ v_swizzle(row)) * 16; }
  // The feature in q's staged column `column` (k step column / 16, position column % 16
  // of the mma's reduction): lane quad position q = (p % 8) / 2 reads chunk 4u + q of the
  // key row, bytes 4m + 2 (p / 8) + p % 2 — see the header.
  FLASHATTN_HOST_DEVICE static constexpr int feature_of_column(int column) {
    const int k_step = column / 16, p = column % 16;
    return 16 * (4 * (k_step / 4) + (p % 8) / 2) + 4 * (k_step % 4) + 2 * (p / 8) + p % 2;
  }
  // The feature of output tile n, column c (o[n] of lane (g, q): columns 2q, 2q + 1).
  FLASHATTN_HOST_DEVICE static constexpr int feature_of_output(int n, int column) { return 64 * (n / 8) + 8 * column + n % 8; }
};

// Two e4m3 bytes (bits 0-7: the first) as a packed pair of T, exactly.
template <class T>
__device__ __forceinline__ std::uint32_t e4m3_pair_to(std::uint32_t bytes) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bytes & 0xffffu), __NV_E4M3);
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<std::uint32_t>(raw.x) | (static_cast<std::uint32_t>(raw.y) << 16);
  } else {
    const float2 pair = __half22float2(__half2(raw));
    return pack_pair<T>(pair.x, pair.y);
  }
}

template <class T, class Config>
__global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocksPerSm)
    mma_fp8_decode_kernel(const __grid_constant__ KVCacheParams params) {
  using Numeric = Numeric<T>;
  using QTile = typename Config::QTile;
  constexpr int kRows = Config::kRows, kTileN = Config::kTileN, kStages = Config::kStages, kThreads = Config::kThreads;
  constexpr int kRowChunks = Config::kRowChunks, kHeadDim = Config::kHeadDim;
  extern __shared__ __align__(128) unsigned char shared[];
  T* q_tile = reinterpret_cast<T*>(shared);                     // (kRows, kHeadDim), swizzled, columns permuted
  unsigned char* kv_tiles = shared + Config::kQBytes;           // [stage][K|V] (kTileN, kHeadDim) bytes, swizzled

  wait_for_prior_grids();  // everything below reads what earlier kernels wrote (the append's bytes included)
  allow_dependent_launch();

  const AttentionParams& a = params.attention;
  const int num_splits = params.num_splits;
  const int split = static_cast<int>(blockIdx.x) % num_splits;
#if FLASHATTN_SM90_DEVICE_CODE
  const bool is_cluster_merge = num_splits > 1 && cooperative_groups::this_cluster().num_blocks() == static_cast<unsigned>(num_splits);
#else
  const bool is_cluster_merge = false;
#endif
  const std::int64_t query_block = blockIdx.x / num_splits;
  const std::int64_t h_kv = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int group_row = lane / 4, quad_lane = lane % 4;  // mma fragment coordinates (g, q)

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

  // Copies: each thread a fixed 16-byte chunk of kPasses key rows, kRowsPerPass apart.
  // Rows past the key range and chunks past head_dim are zero-filled (decode(0) = 0:
  // such V rows add 0 * 0, such K columns meet zero q columns).
  constexpr int kRowsPerPass = kThreads / kRowChunks;
  constexpr int kPasses = kTileN / kRowsPerPass;
  const int copy_chunk = tid % kRowChunks, copy_row = tid / kRowChunks;
  const bool has_chunk = copy_chunk * 16 < a.head_dim;
  const auto* k_base = static_cast<const unsigned char*>(a.k) + h_kv * a.k_head_stride + copy_chunk * 16;
  const auto* v_base = static_cast<const unsigned char*>(a.v) + h_kv * a.v_head_stride + copy_chunk * 16;
  const bool is_paged = params.is_paged();
  const std::int32_t* page_table = params.maybe_block_table + b * params.block_table_stride;
  const int page_size = static_cast<int>(params.page_size);
  if (!is_paged) {
    const std::int64_t cache_b = params.cache_row(b);  // clamped into k_cache (kvcache_params.hpp)
    k_base += cache_b * a.k_batch_stride;
    v_base += cache_b * a.v_batch_stride;
  }
  const std::int64_t range_position = first_position + key_begin;  // cache position of the first key visited
  const std::uint32_t kv_tiles_address = ptx::shared_address(kv_tiles);
  const auto load_tile = [&](int tile, int stage) {
    const std::uint32_t k_tile = kv_tiles_address + stage * Config::kStageBytes;
    const std::uint32_t v_tile = k_tile + Config::kTileBytes;
    const std::int64_t tile_rows_left = key_end - key_begin - static_cast<std::int64_t>(tile) * kTileN;
    const std::int64_t tile_position = range_position + static_cast<std::int64_t>(tile) * kTileN;
    // Paged: the page of this thread's first row (one division per tile), then advanced
    // row by row (kRowsPerPass may exceed page_size: a while, at most two steps).
    int page = 0, in_page = 0;
    if (is_paged) {
      const int position = static_cast<int>(tile_position) + copy_row;  // < 2^31 (validate_kvcache)
      page = position / page_size, in_page = position - page * page_size;
    }
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = copy_row + pass * kRowsPerPass;
      const bool is_valid = row < tile_rows_left && has_chunk;
      std::int64_t k_offset, v_offset;
      if (is_paged) {
        if (pass > 0) {
          in_page += kRowsPerPass;
          while (in_page >= page_size) in_page -= page_size, ++page;
        }
        const std::int64_t block = row < tile_rows_left ? params.page_block(page_table, page) : 0;
        k_offset = block * a.k_batch_stride + in_page * a.k_row_stride;
        v_offset = block * a.v_batch_stride + in_page * a.v_row_stride;
      } else {
        k_offset = (tile_position + row) * a.k_row_stride;
        v_offset = (tile_position + row) * a.v_row_stride;
      }
      ptx::cp_async_16(k_tile + Config::k_offset(row, copy_chunk), k_base + k_offset, is_valid);
      ptx::cp_async_16(v_tile + Config::v_offset(row, copy_chunk), v_base + v_offset, is_valid);
    }
  };

  // Start streaming K/V: the first tiles' latency overlaps the q setup.
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < num_tiles) load_tile(stage, stage);
    ptx::cp_async_commit_group();  // empty groups keep the count uniform
  }

  // q rows of this CTA (row r = packed query row row_begin + r), rotated like flash_attn,
  // zero past the rows and head_dim, stored with the column permutation of the K loads.
  const auto q_row_of = [&](int r) {
    const std::int64_t packed = row_begin + r;
    const bool is_row = packed < row_end;
    const std::int64_t i = is_row ? packed / group : 0, h = h_kv * group + (is_row ? packed % group : 0);
    return static_cast<const T*>(a.q) + a.q_offset(b, h) + i * a.q_row_stride;
  };
  for (int r = 0; r < kRows; ++r) {
    const bool is_row = row_begin + r < row_end;
    const T* q_row = q_row_of(r);
    const std::int64_t rotary_position = params.has_rotary() && is_row ? params.q_rotary_position(b, (row_begin + r) / group) : 0;
    for (int column = tid; column < kHeadDim; column += kThreads) {
      const int d = Config::feature_of_column(column);
      float x = 0.0f;
      if (is_row && d < a.head_dim)
        x = (params.has_rotary() && d < params.rotary_dim) ? rotate_feature<T>(params, q_row, d, rotary_position) : Numeric::to_float(q_row[d]);
      q_tile[QTile::offset(r, column)] = Numeric::from_float(x);
    }
  }

  DecodeState state[2];         // rows group_row, group_row + 8 (l: this lane's columns only)
  float o[Config::kDTiles][4];  // (16 rows, kHeadDim) accumulator fragments, features permuted
#pragma unroll
  for (int n = 0; n < Config::kDTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;

  // q's ldmatrix addresses: as kernel_mma.cuh (8-chunk swizzle, four offsets per lane).
  static_assert(QTile::kSwizzleWidth == 8, "8-chunk swizzle: head dims that are multiples of 64");
  const int matrix = lane / 8, matrix_row = lane % 8;
  const int warp_key = warp * Config::kKeysPerWarp;  // first key row of this warp in a tile
  std::uint32_t q_offsets[4];
  {
    const int q_row = (matrix % 2) * 8 + matrix_row;
    const int q_xor = (matrix / 2) ^ QTile::row_swizzle(q_row);
#pragma unroll
    for (int j = 0; j < 4; ++j) q_offsets[j] = ptx::shared_address(q_tile + q_row * kHeadDim + ((2 * j) ^ q_xor) * 8);
  }
  // This lane's K rows (column group_row of n-tile t: key t * 8 + key_of_column(group_row))
  // and V rows (P columns 2q, 2q + 1 of each half: keys {0, 8} + key_of_column(2q + {0, 1})),
  // as byte offsets from a stage's tile.
  std::uint32_t k_row_offsets[2][Config::kRowChunks / 4], v_row_offsets[4][kHeadDim / 64];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const int row = warp_key + 8 * t + Config::key_of_column(group_row);
#pragma unroll
    for (int u = 0; u < Config::kRowChunks / 4; ++u) k_row_offsets[t][u] = Config::k_offset(row, 4 * u + quad_lane);
  }
#pragma unroll
  for (int slot = 0; slot < 4; ++slot) {
    const int row = warp_key + 8 * (slot / 2) + Config::key_of_column(2 * quad_lane + slot % 2);
#pragma unroll
    for (int v = 0; v < kHeadDim / 64; ++v) v_row_offsets[slot][v] = Config::v_offset(row, 4 * v + group_row / 2) + 8 * (group_row % 2);
  }

  // This thread's two rows of every fragment (key offsets from key_begin), with k_descale
  // folded into the rules' scales; v_descale scales the output in store_split_rows.
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
    const float k_descale = params.k_descale(b, h_kv);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      rows.rule[half].scale_log2 *= k_descale;
      rows.rule[half].softcap_input_scale *= k_descale;
    }
  }
  const float v_descale = params.v_descale(b, h_kv);
  const WholeTiles whole = whole_tiles<kTileN>(mask, position_begin, position_end, key_begin, key_end, key_begin);
  const bool is_scale = a.score_is_positive_scale();  // no softcap, no ALiBi: score_tile's fast path
  const int lane_key = warp_key + Config::key_of_column(2 * quad_lane);  // key of the lane's element (t = 0, e = 0)
  for (int tile = 0; tile < num_tiles; ++tile) {
    ptx::cp_async_wait_group<kStages - 2>();  // this thread's copies of `tile` landed
    __syncthreads();                          // ... everyone's (q's staging too); everyone is done with tile - 1
    if (tile + kStages - 1 < num_tiles) load_tile(tile + kStages - 1, (tile + kStages - 1) % kStages);
    ptx::cp_async_commit_group();
    const unsigned char* k_tile = kv_tiles + (tile % kStages) * Config::kStageBytes;
    const unsigned char* v_tile = k_tile + Config::kTileBytes;

    // S = Q K^T for the warp's 16 keys: per 4 k steps one 16-byte load per n-tile.
    float s[2][4] = {};
#pragma unroll
    for (int u = 0; u < Config::kRowChunks / 4; ++u) {
      uint4 k_bytes[2];
#pragma unroll
      for (int t = 0; t < 2; ++t) k_bytes[t] = *reinterpret_cast<const uint4*>(k_tile + k_row_offsets[t][u]);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int k_step = 4 * u + m;
        std::uint32_t q_fragment[4];
        ptx::ldmatrix_x4(q_fragment[0], q_fragment[1], q_fragment[2], q_fragment[3], q_offsets[k_step % 4] + (k_step / 4) * 128);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const std::uint32_t word = m == 0 ? k_bytes[t].x : m == 1 ? k_bytes[t].y : m == 2 ? k_bytes[t].z : k_bytes[t].w;
          const std::uint32_t k_fragment[2] = {e4m3_pair_to<T>(word), e4m3_pair_to<T>(word >> 16)};
          ptx::mma_m16n8k16<Numeric::kMmaInput>(s[t], q_fragment, k_fragment);
        }
      }
    }

    // Scores in log2 units (the permuted keys: pair stride kPairStride); whole tiles skip the mask.
    const bool is_full_tile = whole.contains(tile);
    // ALiBi in its per-element form here (no affine form: the FP8 tests' reference has no ALiBi,
    // tests/cpu/kvcache_fp8_problem.hpp).
    score_tile<Config::kPairStride>(s, rows, is_full_tile && is_scale, is_full_tile, false, tile * kTileN + lane_key);

    std::uint32_t p_fragment[4];
    softmax_tile<T>(s, state, o, p_fragment);

    // O += P V: per 64 features, 8 bytes of each of the lane's 4 key rows; byte_perm pairs
    // the keys of one feature ({slot 0, slot 1} -> b0, {slot 2, slot 3} -> b1).
#pragma unroll
    for (int v = 0; v < kHeadDim / 64; ++v) {
      uint2 v_bytes[4];
#pragma unroll
      for (int slot = 0; slot < 4; ++slot) v_bytes[slot] = *reinterpret_cast<const uint2*>(v_tile + v_row_offsets[slot][v]);
#pragma unroll
      for (int half_word = 0; half_word < 2; ++half_word) {
        const std::uint32_t w0 = half_word ? v_bytes[0].y : v_bytes[0].x, w1 = half_word ? v_bytes[1].y : v_bytes[1].x;
        const std::uint32_t w2 = half_word ? v_bytes[2].y : v_bytes[2].x, w3 = half_word ? v_bytes[3].y : v_bytes[3].x;
        // Bytes {w0.j, w1.j, w0.j+1, w1.j+1}: features j, j + 1 of keys slot 0 | slot 1.
        const std::uint32_t low01 = __byte_perm(w0, w1, 0x5140), high01 = __byte_perm(w0, w1, 0x7362);
        const std::uint32_t low23 = __byte_perm(w2, w3, 0x5140), high23 = __byte_perm(w2, w3, 0x7362);
        const std::uint32_t pairs01[4] = {low01, low01 >> 16, high01, high01 >> 16};
        const std::uint32_t pairs23[4] = {low23, low23 >> 16, high23, high23 >> 16};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const std::uint32_t v_fragment[2] = {e4m3_pair_to<T>(pairs01[j]), e4m3_pair_to<T>(pairs23[j])};
          ptx::mma_m16n8k16<Numeric::kMmaInput>(o[8 * v + 4 * half_word + j], p_fragment, v_fragment);
        }
      }
    }
  }
  ptx::cp_async_wait_group<0>();
  __syncthreads();  // everyone is done with the pipeline: reuse shared memory for the merge

  // Row sums over the quad; then the warps' states and rows (features back in order) to
  // shared memory for store_split_rows.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    state[half].l += __shfl_xor_sync(0xffffffffu, state[half].l, 1);
    state[half].l += __shfl_xor_sync(0xffffffffu, state[half].l, 2);
  }
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
    for (int n = 0; n < Config::kDTiles; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        merge_o[(warp * kRows + r) * kHeadDim + Config::feature_of_output(n, 2 * quad_lane + e)] = o[n][2 * half + e];
  }
  __syncthreads();
  store_split_rows<T, Config>(params, shared, v_descale, split, is_cluster_merge, row_begin, row_end, h_kv, b);
}

}  // namespace flashattn::cuda::decode
