// src/cuda/bwd/dkdv_kernel.cuh — the main backward kernel (FA2 structure, mma.sync).
//
// For one (sequence, head) with P = exp(S - LSE), S = scale * Q K^T (softcap:
// S = c * tanh(scale * Q K^T / c)):
//   D  = rowsum(dO ∘ O)                  (preprocess, pre_post.cu)
//   dV = P^T dO        dP = dO V^T       dS = P ∘ (dP - D)   (softcap: ∘ (1 - tanh²))
//   dK = scale * dS^T Q                  dQ = scale * dS K
//
// One CTA per (key block, kv head, sequence). K and V of the block stay in shared
// memory, dK and dV in registers; the CTA walks every (query head of the GQA group,
// query block) that sees the block, so the group's dK/dV are summed in registers in
// a fixed order (bitwise reproducible, no per-head copies). One step:
//   S = Q K^T, dP = dO V^T           registers, warp grid over (block_m, block_n)
//   P, dS -> shared memory (16-bit)  once; the element mask only on boundary tiles
//   dV += P^T dO, dK += dS^T Q       warp grid over (block_n, head_dim), ldmatrix.trans
//   dQ_step = dS K                   warp grid over (block_m, head_dim) -> fp32 staging
//                                    tile -> added to the fp32 accumulator in global
//                                    memory by the TMA unit (cp.reduce.async.bulk, one
//                                    op per row) while the next step computes.
// Q, dO, LSE and D of the next step stream in through cp.async during this one.
// Every 16-bit tile is swizzled (common/swizzle.cuh): ldmatrix and cp.async without
// bank conflicts and without padding. Deterministic mode skips dQ here (dq_kernel).
#pragma once

#include <cmath>
#include <cstdint>

#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/core/params.hpp"
#include "src/cuda/bwd/common.cuh"
#include "src/cuda/bwd/tile_config.hpp"
#include "src/cuda/bwd/workspace.hpp"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/common/swizzle.cuh"
#include "src/cuda/ptx/bulk_reduce.cuh"
#include "src/cuda/ptx/cp_async.cuh"
#include "src/cuda/ptx/ldmatrix.cuh"
#include "src/cuda/ptx/math.cuh"
#include "src/cuda/ptx/mma_sync.cuh"

namespace flashattn::cuda::bwd {

// kConfig_ defaults to the table; the timing tool instantiates alternatives.
template <class Element_, int kHeadDim_, DkdvConfig kConfig_ = dkdv_config(kHeadDim_)>
struct DkdvTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr DkdvConfig kConfig = kConfig_;
  static constexpr int kBlockM = kConfig.block_m;
  static constexpr int kBlockN = kConfig.block_n;
  static constexpr int kWarps = kConfig.warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = kConfig.stages;
  // S, dP: (kBlockM, kBlockN), warp tiles (kSdpWarpRows, kSdpWarpCols)
  static constexpr int kSdpWarpsM = kConfig.sdp_warps_m, kSdpWarpsN = kWarps / kSdpWarpsM;
  static constexpr int kSdpWarpRows = kBlockM / kSdpWarpsM, kSdpWarpCols = kBlockN / kSdpWarpsN;
  static constexpr int kSdpMTiles = kSdpWarpRows / 16, kSdpNTiles = kSdpWarpCols / 8;
  // dK, dV: (kBlockN, kHeadDim), warp tiles (kKvWarpRows, kKvWarpCols)
  static constexpr int kKvWarpsN = kConfig.dkdv_warps_n, kKvWarpsD = kWarps / kKvWarpsN;
  static constexpr int kKvWarpRows = kBlockN / kKvWarpsN, kKvWarpCols = kHeadDim / kKvWarpsD;
  static constexpr int kKvMTiles = kKvWarpRows / 16, kKvNTiles = kKvWarpCols / 8;
  // dQ: (kBlockM, kHeadDim), warp tiles (kDqWarpRows, kDqWarpCols)
  static constexpr int kDqWarpsM = kConfig.dq_warps_m, kDqWarpsD = kWarps / kDqWarpsM;
  static constexpr int kDqWarpRows = kBlockM / kDqWarpsM, kDqWarpCols = kHeadDim / kDqWarpsD;
  static constexpr int kDqMTiles = kDqWarpRows / 16, kDqNTiles = kDqWarpCols / 8;
  static_assert(kWarps % kSdpWarpsM == 0 && kWarps % kKvWarpsN == 0 && kWarps % kDqWarpsM == 0);
  static_assert(kSdpWarpRows % 16 == 0 && kSdpWarpCols % 16 == 0, "S/dP warp tiles: m16 x (pairs of n8)");
  static_assert(kKvWarpRows % 16 == 0 && kKvWarpCols % 16 == 0, "dK/dV warp tiles: m16 x (pairs of n8)");
  static_assert(kDqWarpRows % 16 == 0 && kDqWarpCols % 16 == 0, "dQ warp tiles: m16 x (pairs of n8)");
  static_assert(kBlockM <= kMaxBlockM && kBlockM % 16 == 0 && kHeadDim % 16 == 0);
  static_assert(kStages == 1 || kStages == 2);

  using QTile = SwizzledTile<kBlockM, kHeadDim>;      // Q, dO
  using KvTile = SwizzledTile<kBlockN, kHeadDim>;     // K, V
  using ScoreTile = SwizzledTile<kBlockM, kBlockN>;   // P, dS
  // fp32 dQ staging rows padded by 32 bytes: the float2 fragment stores of 8 rows
  // then cover all 32 banks twice (2 wavefronts, the minimum for 256 bytes).
  static constexpr int kDqStagingLd = kHeadDim + 8;

  // Shared memory, byte offsets: K | V | Q x stages | dO x stages | P | dS | dQ staging | LSE x stages | D x stages
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + KvTile::kBytes;
  static constexpr int kQOffset = kVOffset + KvTile::kBytes;
  static constexpr int kDoOffset = kQOffset + kStages * QTile::kBytes;
  static constexpr int kPOffset = kDoOffset + kStages * QTile::kBytes;
  static constexpr int kDsOffset = kPOffset + ScoreTile::kBytes;
  static constexpr int kDqOffset = kDsOffset + ScoreTile::kBytes;
  static constexpr int kLseOffset = kDqOffset + kBlockM * kDqStagingLd * 4;
  static constexpr int kDsumOffset = kLseOffset + kStages * kBlockM * 4;
  static constexpr int kSmemBytes = kDsumOffset + kStages * kBlockM * 4;
};

// Per-lane ldmatrix addresses into a swizzled tile. A lane addresses row `row` (its
// own row of the 8x8 matrices) and logical chunk warp_chunk + lane_bit + c for
// compile-time c; the unrolled loops then add immediates only. kWarpChunks is the
// chunk extent of one warp when several warps split the columns (0: one warp, or
// no warp offset): a power of two lets the warp's chunk bits join the lane XOR
// (warp_chunk is a multiple of it and c < it, so their bits are disjoint);
// otherwise the chunk is added at run time.
template <class Tile, int kWarpChunks>
struct FragmentAddress {
  static constexpr int kWidth = Tile::kSwizzleWidth;
  static constexpr int kCols = Tile::kChunks * kChunkElements;
  static constexpr bool kIsXorOnly = kWarpChunks == 0 || (kWarpChunks & (kWarpChunks - 1)) == 0;
  static_assert(kWidth >= 2, "the lane's chunk bit must stay inside the XOR pattern");
  std::uint32_t row_address;
  int lane_xor;
  int chunk_base;

  __device__ __forceinline__ FragmentAddress(const void* tile, int row, int warp_chunk, int lane_bit) {
    if constexpr (kIsXorOnly) {
      row_address = ptx::shared_address(tile) + 2 * (row * kCols + (warp_chunk & ~(kWidth - 1)) * kChunkElements);
      lane_xor = Tile::row_swizzle(row) ^ (warp_chunk & (kWidth - 1)) ^ lane_bit;
      chunk_base = 0;
    } else {
      row_address = ptx::shared_address(tile) + 2 * row * kCols;
      lane_xor = Tile::row_swizzle(row);
      chunk_base = warp_chunk + lane_bit;
    }
  }
  // Byte address of the lane's row at row_offset (a multiple of 8: same swizzle) and chunk c (even).
  __device__ __forceinline__ std::uint32_t at(int row_offset, int c) const {
    if constexpr (kIsXorOnly) {
      return row_address + 2 * (row_offset * kCols + Tile::xor_chunk_offset(c, lane_xor));
    } else {
      return row_address + 2 * (row_offset * kCols + ((chunk_base + c) ^ lane_xor) * kChunkElements);
    }
  }
};

// (kRows, kCols) tile rows [0, rows_valid) x columns [0, head_dim) of a strided global
// tensor into swizzled shared memory; everything else (tails, head-dim padding) is
// zero so it contributes nothing to any product. cp.async when every 16-byte chunk
// is aligned, else synchronous element copies (odd strides).
template <int kRows, int kCols, int kThreads, class Element>
__device__ __forceinline__ void load_swizzled_tile(Element* tile, const Element* gmem, std::int64_t row_stride,
                                                   std::int64_t rows_valid, int head_dim, bool is_aligned, int tid) {
  using Tile = SwizzledTile<kRows, kCols>;
  constexpr int kTotalChunks = kRows * Tile::kChunks;
#pragma unroll
  for (int index = tid; index < kTotalChunks; index += kThreads) {
    const int row = index / Tile::kChunks, chunk = index % Tile::kChunks;
    const bool is_valid = row < rows_valid && chunk * kChunkElements < head_dim;
    Element* destination = tile + Tile::chunk_offset(row, chunk);
    const Element* source = gmem + row * row_stride + chunk * kChunkElements;
    if (is_aligned) {
      ptx::cp_async_16(ptx::shared_address(destination), is_valid ? source : gmem, is_valid);
    } else {
#pragma unroll
      for (int e = 0; e < kChunkElements; ++e)
        destination[e] = is_valid ? source[e] : Numeric<Element>::from_float(0.0f);
    }
  }
}

// From a warp's S = Q K^T and dP = dO V^T fragments: P = exp2(S * scale_log2 - LSE)
// with the element mask, dS = P ∘ (dP - D) (softcap: ∘ (1 - tanh²)), both written to
// shared memory as Element. Rows past the sequence have LSE = +inf (P = 0).
template <class T, bool kHasSoftcap>
__device__ __forceinline__ void write_p_and_ds(const float (&s)[T::kSdpMTiles][T::kSdpNTiles][4],
                                               const float (&dp)[T::kSdpMTiles][T::kSdpNTiles][4],
                                               const BackwardParams& params, const MaskRule& mask, bool needs_mask,
                                               std::int64_t m0, std::int64_t n0, const float* lse_tile,
                                               const float* dsum_tile, int warp_m0, int warp_n0, int lane,
                                               typename T::Element* p_tile, typename T::Element* ds_tile) {
  using Element = typename T::Element;
  using ScoreTile = typename T::ScoreTile;
  const int group = lane / 4, quad_lane = lane % 4;
  const float scale_log2 = params.softmax_scale_log2;
  const float softcap_input_scale = kHasSoftcap ? params.softmax_scale / params.softcap : 0.0f;
  const float softcap_scale_log2 = params.softcap * static_cast<float>(online_softmax::kLog2e);
#pragma unroll
  for (int mi = 0; mi < T::kSdpMTiles; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_m0 + mi * 16 + group + 8 * half;
      const float lse_log2 = lse_tile[row];
      const float dsum = dsum_tile[row];
      int begin = 0, end = T::kBlockN;
      if (needs_mask) {
        // Allowed columns of this row relative to n0 (col_end <= seqlen_k covers the key tail).
        begin = static_cast<int>(MaskRule::clamp(mask.col_begin(m0 + row) - n0, 0, T::kBlockN));
        end = static_cast<int>(MaskRule::clamp(mask.col_end(m0 + row) - n0, 0, T::kBlockN));
      }
#pragma unroll
      for (int j = 0; j < T::kSdpNTiles; ++j) {
        const int col = warp_n0 + 8 * j + 2 * quad_lane;
        float p[2], ds[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float raw = s[mi][j][2 * half + e];
          if constexpr (kHasSoftcap) {
            const float capped = tanhf(raw * softcap_input_scale);
            p[e] = ptx::exp2_approx_ftz(capped * softcap_scale_log2 - lse_log2);
            if (col + e < begin || col + e >= end) p[e] = 0.0f;
            ds[e] = p[e] * (dp[mi][j][2 * half + e] - dsum) * (1.0f - capped * capped);
          } else {
            p[e] = ptx::exp2_approx_ftz(fmaf(raw, scale_log2, -lse_log2));
            if (col + e < begin || col + e >= end) p[e] = 0.0f;
            ds[e] = p[e] * (dp[mi][j][2 * half + e] - dsum);
          }
        }
        const int offset = ScoreTile::offset(row, col);
        *reinterpret_cast<std::uint32_t*>(p_tile + offset) = pack_pair<Element>(p[0], p[1]);
        *reinterpret_cast<std::uint32_t*>(ds_tile + offset) = pack_pair<Element>(ds[0], ds[1]);
      }
    }
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    dkdv_kernel(const __grid_constant__ BackwardParams params, const Workspace workspace, int num_n_blocks,
                bool is_aligned) {
  using Element = typename T::Element;
  using QTile = typename T::QTile;
  using KvTile = typename T::KvTile;
  using ScoreTile = typename T::ScoreTile;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kHeadDim = T::kHeadDim, kStages = T::kStages;
  constexpr bool kIsBf16 = Numeric<Element>::kIsBf16;
  extern __shared__ __align__(128) unsigned char shared_bytes[];
  Element* k_smem = reinterpret_cast<Element*>(shared_bytes + T::kKOffset);    // (kBlockN, kHeadDim)
  Element* v_smem = reinterpret_cast<Element*>(shared_bytes + T::kVOffset);    // (kBlockN, kHeadDim)
  Element* q_smem = reinterpret_cast<Element*>(shared_bytes + T::kQOffset);    // kStages x (kBlockM, kHeadDim)
  Element* do_smem = reinterpret_cast<Element*>(shared_bytes + T::kDoOffset);  // kStages x (kBlockM, kHeadDim)
  Element* p_smem = reinterpret_cast<Element*>(shared_bytes + T::kPOffset);    // (kBlockM, kBlockN)
  Element* ds_smem = reinterpret_cast<Element*>(shared_bytes + T::kDsOffset);  // (kBlockM, kBlockN)
  float* dq_staging = reinterpret_cast<float*>(shared_bytes + T::kDqOffset);   // (kBlockM, kDqStagingLd)
  float* lse_smem = reinterpret_cast<float*>(shared_bytes + T::kLseOffset);    // kStages x (kBlockM)
  float* dsum_smem = reinterpret_cast<float*>(shared_bytes + T::kDsumOffset);  // kStages x (kBlockM)

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // Key block fastest: under a causal mask the low key blocks (the most query
  // blocks) start first, the short ones fill the tail.
  const std::int64_t n_block = blockIdx.x % num_n_blocks;
  const std::int64_t h_kv = (blockIdx.x / num_n_blocks) % params.heads_kv;
  const std::int64_t b = blockIdx.x / num_n_blocks / params.heads_kv;
  const std::int64_t seqlen_q = params.seqlen_q_of(b), seqlen_k = params.seqlen_k_of(b);
  const std::int64_t n0 = n_block * kBlockN;
  if (n0 >= seqlen_k) return;
  const std::int64_t kv_rows = seqlen_k - n0 < kBlockN ? seqlen_k - n0 : kBlockN;
  const int head_dim = static_cast<int>(params.head_dim);
  const MaskRule mask = params.mask_of(b);
  const bool has_dq = !params.deterministic;

  load_swizzled_tile<kBlockN, kHeadDim, T::kThreads>(
      k_smem, static_cast<const Element*>(params.k) + params.k_offset(b, h_kv) + n0 * params.k_row_stride,
      params.k_row_stride, kv_rows, head_dim, is_aligned, tid);
  load_swizzled_tile<kBlockN, kHeadDim, T::kThreads>(
      v_smem, static_cast<const Element*>(params.v) + params.v_offset(b, h_kv) + n0 * params.v_row_stride,
      params.v_row_stride, kv_rows, head_dim, is_aligned, tid);

  // Steps: every query head of the group x every query block that sees this key block.
  const MaskRule::RowRange rows = mask.rows_of_columns(n0, n0 + kv_rows);
  const int m_block_begin = static_cast<int>(rows.begin / kBlockM);
  const int m_blocks = rows.end > rows.begin ? static_cast<int>((rows.end + kBlockM - 1) / kBlockM) - m_block_begin : 0;
  const int steps = m_blocks * static_cast<int>(params.group_size);
  const std::int64_t stats_start = Workspace::stats_start(params, b);

  auto step_head = [&](int step) { return h_kv * params.group_size + step / m_blocks; };
  auto step_m0 = [&](int step) { return static_cast<std::int64_t>(m_block_begin + step % m_blocks) * kBlockM; };
  auto issue_step_loads = [&](int step, int stage) {
    const std::int64_t h_q = step_head(step), m0 = step_m0(step);
    load_swizzled_tile<kBlockM, kHeadDim, T::kThreads>(
        q_smem + stage * QTile::kElements,
        static_cast<const Element*>(params.q) + params.q_offset(b, h_q) + m0 * params.q_row_stride,
        params.q_row_stride, seqlen_q - m0, head_dim, is_aligned, tid);
    load_swizzled_tile<kBlockM, kHeadDim, T::kThreads>(
        do_smem + stage * QTile::kElements,
        static_cast<const Element*>(params.dout) + params.dout_offset(b, h_q) + m0 * params.dout_row_stride,
        params.dout_row_stride, seqlen_q - m0, head_dim, is_aligned, tid);
    // Whole padded tiles of LSE and D (workspace.hpp), 4 rows per 16-byte copy.
    const std::int64_t stats_row = h_q * workspace.stats_head_stride + stats_start + m0;
    constexpr int kStatChunks = kBlockM / 4;
    if (tid < 2 * kStatChunks) {
      const bool is_lse = tid < kStatChunks;
      const int chunk = is_lse ? tid : tid - kStatChunks;
      const float* source = (is_lse ? workspace.lse_log2 : workspace.dsum) + stats_row + 4 * chunk;
      float* destination = (is_lse ? lse_smem : dsum_smem) + stage * kBlockM + 4 * chunk;
      ptx::cp_async_16(ptx::shared_address(destination), source, true);
    }
  };

  // The fp32 dQ of the previous step (staging tile) is added to the accumulator.
  // Called after a barrier that follows the staging writes and their proxy fence.
  auto flush_dq = [&](int step) {
    const std::int64_t h_q = step_head(step), m0 = step_m0(step);
    const int rows_valid = static_cast<int>(seqlen_q - m0 < kBlockM ? seqlen_q - m0 : kBlockM);
    float* dq_rows = workspace.dq_accum + (packed_q_row(params, b, m0) * params.heads_q + h_q) * params.head_dim;
    const std::int64_t dq_row_stride = params.heads_q * params.head_dim;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (warp == 0) {
      for (int row = lane; row < rows_valid; row += 32)
        ptx::bulk_reduce_add_f32(dq_rows + row * dq_row_stride,
                                 ptx::shared_address(dq_staging + row * T::kDqStagingLd),
                                 static_cast<std::uint32_t>(head_dim) * 4);
      ptx::bulk_commit_group();
    }
#else
    constexpr int kQuads = kHeadDim / 4;
    for (int index = tid; index < kBlockM * kQuads; index += T::kThreads) {
      const int row = index / kQuads, col = (index % kQuads) * 4;
      if (row < rows_valid && col < head_dim) {
        const float4 value = *reinterpret_cast<const float4*>(dq_staging + row * T::kDqStagingLd + col);
        float* destination = dq_rows + row * dq_row_stride + col;
        atomicAdd(destination, value.x);
        atomicAdd(destination + 1, value.y);
        atomicAdd(destination + 2, value.z);
        atomicAdd(destination + 3, value.w);
      }
    }
#endif
  };

  // Warp tiles of the three products.
  const int sdp_m0 = (warp % T::kSdpWarpsM) * T::kSdpWarpRows, sdp_n0 = (warp / T::kSdpWarpsM) * T::kSdpWarpCols;
  const int kv_n0 = (warp % T::kKvWarpsN) * T::kKvWarpRows, kv_d0 = (warp / T::kKvWarpsN) * T::kKvWarpCols;
  const int dq_m0 = (warp % T::kDqWarpsM) * T::kDqWarpRows, dq_d0 = (warp / T::kDqWarpsM) * T::kDqWarpCols;
  // ldmatrix lane patterns (x4: lanes 8i..8i+7 address matrix i):
  //  A, plain: matrices (rows 0-7 | 8-15) x (k chunk 0 | 1), rows fastest.
  const int a_row = lane % 16, a_bit = lane / 16;
  //  B pair, plain (n rows 0-7: k chunk 0, 1; n rows 8-15: k chunk 0, 1) — and A via
  //  .trans from a matrix stored (k, m): (k 0-7: m chunk 0, 1; k 8-15: m chunk 0, 1).
  const int bn_row = (lane & 7) + ((lane >> 4) << 3), bn_bit = (lane >> 3) & 1;
  //  B pair via .trans from a matrix stored (k, n): (k 0-7 | 8-15) x (n chunk 0 | 1), k fastest.
  const int bk_row = (lane & 7) + (((lane >> 3) & 1) << 3), bk_bit = lane >> 4;
  constexpr int kKvChunks = T::kKvWarpsD > 1 ? T::kKvWarpCols / kChunkElements : 0;
  constexpr int kPChunks = T::kKvWarpsN > 1 ? T::kKvWarpRows / kChunkElements : 0;
  constexpr int kDqChunks = T::kDqWarpsD > 1 ? T::kDqWarpCols / kChunkElements : 0;
  const FragmentAddress<QTile, 0> q_as_a(q_smem, sdp_m0 + a_row, 0, a_bit);           // Q, dO in S, dP
  const FragmentAddress<KvTile, 0> k_as_b(k_smem, sdp_n0 + bn_row, 0, bn_bit);        // K, V in S, dP
  const FragmentAddress<ScoreTile, kPChunks> p_as_a(p_smem, bn_row, kv_n0 / 8, bn_bit);  // P^T, dS^T in dV, dK
  const FragmentAddress<QTile, kKvChunks> q_as_b(q_smem, bk_row, kv_d0 / 8, bk_bit);  // dO, Q in dV, dK
  const FragmentAddress<ScoreTile, 0> ds_as_a(ds_smem, dq_m0 + a_row, 0, a_bit);      // dS in dQ
  const FragmentAddress<KvTile, kDqChunks> k_as_bt(k_smem, bk_row, dq_d0 / 8, bk_bit);  // K in dQ
  constexpr std::uint32_t kDoMinusQ = T::kDoOffset - T::kQOffset;
  constexpr std::uint32_t kVMinusK = T::kVOffset - T::kKOffset;
  constexpr std::uint32_t kDsMinusP = T::kDsOffset - T::kPOffset;

  float dk[T::kKvMTiles][T::kKvNTiles][4] = {};  // (kKvWarpRows, kKvWarpCols) of dK, unscaled
  float dv[T::kKvMTiles][T::kKvNTiles][4] = {};  // (kKvWarpRows, kKvWarpCols) of dV

  if (steps > 0) issue_step_loads(0, 0);
  ptx::cp_async_commit_group();
  for (int step = 0; step < steps; ++step) {
    const int stage = kStages == 1 ? 0 : step % 2;
    // This step's tiles have landed; every warp has finished the previous step
    // (its stage, P/dS and the dQ staging writes may be reused).
    ptx::cp_async_wait_group<0>();
    __syncthreads();
    if (has_dq && step > 0) flush_dq(step - 1);
    if constexpr (kStages == 2) {
      if (step + 1 < steps) issue_step_loads(step + 1, stage ^ 1);
      ptx::cp_async_commit_group();
    }
    const std::int64_t m0 = step_m0(step);
    const std::uint32_t stage_bytes = stage * QTile::kBytes;

    // S = Q K^T, dP = dO V^T: (kSdpWarpRows, kSdpWarpCols) per warp
    float s[T::kSdpMTiles][T::kSdpNTiles][4] = {};
    float dp[T::kSdpMTiles][T::kSdpNTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      std::uint32_t a[T::kSdpMTiles][4];
#pragma unroll
      for (int mi = 0; mi < T::kSdpMTiles; ++mi)
        ptx::ldmatrix_x4(a[mi][0], a[mi][1], a[mi][2], a[mi][3], q_as_a.at(16 * mi, 2 * kk) + stage_bytes);
#pragma unroll
      for (int nj = 0; nj < T::kSdpNTiles / 2; ++nj) {
        std::uint32_t b_even[2], b_odd[2];
        ptx::ldmatrix_x4(b_even[0], b_even[1], b_odd[0], b_odd[1], k_as_b.at(16 * nj, 2 * kk));
#pragma unroll
        for (int mi = 0; mi < T::kSdpMTiles; ++mi) {
          ptx::mma_m16n8k16<kIsBf16>(s[mi][2 * nj], a[mi], b_even);
          ptx::mma_m16n8k16<kIsBf16>(s[mi][2 * nj + 1], a[mi], b_odd);
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      std::uint32_t a[T::kSdpMTiles][4];
#pragma unroll
      for (int mi = 0; mi < T::kSdpMTiles; ++mi)
        ptx::ldmatrix_x4(a[mi][0], a[mi][1], a[mi][2], a[mi][3], q_as_a.at(16 * mi, 2 * kk) + stage_bytes + kDoMinusQ);
#pragma unroll
      for (int nj = 0; nj < T::kSdpNTiles / 2; ++nj) {
        std::uint32_t b_even[2], b_odd[2];
        ptx::ldmatrix_x4(b_even[0], b_even[1], b_odd[0], b_odd[1], k_as_b.at(16 * nj, 2 * kk) + kVMinusK);
#pragma unroll
        for (int mi = 0; mi < T::kSdpMTiles; ++mi) {
          ptx::mma_m16n8k16<kIsBf16>(dp[mi][2 * nj], a[mi], b_even);
          ptx::mma_m16n8k16<kIsBf16>(dp[mi][2 * nj + 1], a[mi], b_odd);
        }
      }
    }

    const std::int64_t q_rows_end = m0 + kBlockM < seqlen_q ? m0 + kBlockM : seqlen_q;
    const bool needs_mask = n0 + kBlockN > seqlen_k || !mask.tile_fully_allowed(m0, q_rows_end, n0, n0 + kBlockN);
    const float* lse_tile = lse_smem + stage * kBlockM;
    const float* dsum_tile = dsum_smem + stage * kBlockM;
    if (params.has_softcap()) {
      write_p_and_ds<T, true>(s, dp, params, mask, needs_mask, m0, n0, lse_tile, dsum_tile, sdp_m0, sdp_n0, lane,
                              p_smem, ds_smem);
    } else {
      write_p_and_ds<T, false>(s, dp, params, mask, needs_mask, m0, n0, lse_tile, dsum_tile, sdp_m0, sdp_n0, lane,
                               p_smem, ds_smem);
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // The TMA has read the previous step's staging tile before anyone rewrites it.
    if (has_dq && warp == 0) ptx::bulk_wait_group_read<0>();
#endif
    __syncthreads();

    // dV += P^T dO, dK += dS^T Q: (kKvWarpRows, kKvWarpCols) per warp, depth kBlockM
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      std::uint32_t a[T::kKvMTiles][4];
#pragma unroll
      for (int mi = 0; mi < T::kKvMTiles; ++mi)
        ptx::ldmatrix_x4_trans(a[mi][0], a[mi][1], a[mi][2], a[mi][3], p_as_a.at(16 * kk, 2 * mi));
#pragma unroll
      for (int dj = 0; dj < T::kKvNTiles / 2; ++dj) {
        std::uint32_t b_even[2], b_odd[2];
        ptx::ldmatrix_x4_trans(b_even[0], b_even[1], b_odd[0], b_odd[1],
                               q_as_b.at(16 * kk, 2 * dj) + stage_bytes + kDoMinusQ);
#pragma unroll
        for (int mi = 0; mi < T::kKvMTiles; ++mi) {
          ptx::mma_m16n8k16<kIsBf16>(dv[mi][2 * dj], a[mi], b_even);
          ptx::mma_m16n8k16<kIsBf16>(dv[mi][2 * dj + 1], a[mi], b_odd);
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      std::uint32_t a[T::kKvMTiles][4];
#pragma unroll
      for (int mi = 0; mi < T::kKvMTiles; ++mi)
        ptx::ldmatrix_x4_trans(a[mi][0], a[mi][1], a[mi][2], a[mi][3], p_as_a.at(16 * kk, 2 * mi) + kDsMinusP);
#pragma unroll
      for (int dj = 0; dj < T::kKvNTiles / 2; ++dj) {
        std::uint32_t b_even[2], b_odd[2];
        ptx::ldmatrix_x4_trans(b_even[0], b_even[1], b_odd[0], b_odd[1], q_as_b.at(16 * kk, 2 * dj) + stage_bytes);
#pragma unroll
        for (int mi = 0; mi < T::kKvMTiles; ++mi) {
          ptx::mma_m16n8k16<kIsBf16>(dk[mi][2 * dj], a[mi], b_even);
          ptx::mma_m16n8k16<kIsBf16>(dk[mi][2 * dj + 1], a[mi], b_odd);
        }
      }
    }
    if constexpr (kStages == 1) {
      // Single buffer: the next Q/dO may land only once every warp is past dK, dV.
      __syncthreads();
      if (step + 1 < steps) issue_step_loads(step + 1, 0);
      ptx::cp_async_commit_group();
    }

    if (has_dq) {
      // dQ_step = dS K: (kDqWarpRows, kDqWarpCols) per warp, depth kBlockN
      float dq[T::kDqMTiles][T::kDqNTiles][4] = {};
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        std::uint32_t a[T::kDqMTiles][4];
#pragma unroll
        for (int mi = 0; mi < T::kDqMTiles; ++mi)
          ptx::ldmatrix_x4(a[mi][0], a[mi][1], a[mi][2], a[mi][3], ds_as_a.at(16 * mi, 2 * kk));
#pragma unroll
        for (int dj = 0; dj < T::kDqNTiles / 2; ++dj) {
          std::uint32_t b_even[2], b_odd[2];
          ptx::ldmatrix_x4_trans(b_even[0], b_even[1], b_odd[0], b_odd[1], k_as_bt.at(16 * kk, 2 * dj));
#pragma unroll
          for (int mi = 0; mi < T::kDqMTiles; ++mi) {
            ptx::mma_m16n8k16<kIsBf16>(dq[mi][2 * dj], a[mi], b_even);
            ptx::mma_m16n8k16<kIsBf16>(dq[mi][2 * dj + 1], a[mi], b_odd);
          }
        }
      }
      const int group = lane / 4, quad_lane = lane % 4;
#pragma unroll
      for (int mi = 0; mi < T::kDqMTiles; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float* staging_row = dq_staging + (dq_m0 + 16 * mi + group + 8 * half) * T::kDqStagingLd + dq_d0 + 2 * quad_lane;
#pragma unroll
          for (int j = 0; j < T::kDqNTiles; ++j)
            *reinterpret_cast<float2*>(staging_row + 8 * j) = make_float2(dq[mi][j][2 * half], dq[mi][j][2 * half + 1]);
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      ptx::fence_proxy_async_shared();
#endif
    }
  }
  ptx::cp_async_wait_group<0>();
  if (has_dq && steps > 0) {
    __syncthreads();
    flush_dq(steps - 1);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (warp == 0) ptx::bulk_wait_group<0>();
#endif
  }

#pragma unroll
  for (int mi = 0; mi < T::kKvMTiles; ++mi) {
    store_fragment_tile<Element, T::kKvNTiles>(
        dk[mi], params.softmax_scale,
        static_cast<Element*>(params.dk) + params.dk_offset(b, h_kv) + n0 * params.dk_row_stride,
        params.dk_row_stride, kv_n0 + 16 * mi, kv_d0, kv_rows, head_dim, is_aligned, lane);
    store_fragment_tile<Element, T::kKvNTiles>(
        dv[mi], 1.0f, static_cast<Element*>(params.dv) + params.dv_offset(b, h_kv) + n0 * params.dv_row_stride,
        params.dv_row_stride, kv_n0 + 16 * mi, kv_d0, kv_rows, head_dim, is_aligned, lane);
  }
}

}  // namespace flashattn::cuda::bwd
