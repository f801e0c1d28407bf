// src/cuda/bwd/dq_kernel.cuh — the deterministic dQ kernel: one CTA per (query
// block, query head, sequence) walks the key blocks its rows see, recomputes
// S, dP and dS (as dkdv_kernel.cuh does) and sums dQ = scale * dS K in registers
// in a fixed order, so dQ is bitwise reproducible (no atomics). The dK/dV kernel
// runs beside it without its dQ part.
#pragma once

#include <cmath>
#include <cstdint>

#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/core/params.hpp"
#include "src/cuda/bwd/common.cuh"
#include "src/cuda/bwd/dq_traits.hpp"
#include "src/cuda/bwd/tile_config.hpp"
#include "src/cuda/bwd/warp_mma.cuh"
#include "src/cuda/bwd/workspace.hpp"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/ptx/cp_async.cuh"

namespace flashattn::cuda::bwd {

// (kRows, kHeadDim) tile rows [0, rows_valid) x columns [0, head_dim) of a strided
// global tensor into shared memory; everything else (tails, head-dim padding) is
// zero so it contributes nothing to any product. cp.async when every 16-byte
// chunk is aligned, else synchronous element copies (odd strides).
template <class T, int kRows>
__device__ __forceinline__ void load_tile(typename T::Element* smem, const typename T::Element* gmem,
                                          std::int64_t row_stride, std::int64_t rows_valid, int head_dim,
                                          bool is_aligned, int tid) {
  using Element = typename T::Element;
  constexpr int kChunksPerRow = T::kHeadDim / 8;
  for (int index = tid; index < kRows * kChunksPerRow; index += T::kThreads) {
    const int row = index / kChunksPerRow, col = (index % kChunksPerRow) * 8;
    Element* destination = smem + row * T::kLdHead + col;
    const bool is_valid = row < rows_valid && col < head_dim;
    const Element* source = is_valid ? gmem + row * row_stride + col : gmem;
    if (is_aligned) {
      ptx::cp_async_16(ptx::shared_address(destination), source, is_valid);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) destination[e] = is_valid ? source[e] : Numeric<Element>::from_float(0.0f);
    }
  }
}

// LSE (log2 units) and D of query rows [m0, m0 + kBlockM) of (b, h_q) from the padded
// statistics rows (workspace.hpp): rows past the sequence and fully masked rows
// hold LSE = +inf, so P = exp2(s - LSE) = 0 there without a NaN.
template <class T>
__device__ __forceinline__ void load_row_stats(float* lse_smem, float* dsum_smem, const BackwardParams& params,
                                               const Workspace& workspace, std::int64_t b, std::int64_t h_q,
                                               std::int64_t m0, int tid) {
  static_assert(kMaxBlockM % T::kBlockM == 0, "whole tiles of the padded statistics");
  const std::int64_t stats_row = h_q * workspace.stats_head_stride + Workspace::stats_start(params, b) + m0;
  for (int row = tid; row < T::kBlockM; row += T::kThreads) {
    lse_smem[row] = workspace.lse_log2[stats_row + row];
    dsum_smem[row] = workspace.dsum[stats_row + row];
  }
}

// From a warp's S = Q K^T and dP = dO V^T fragments (rows [row0, row0+16), columns
// [col0, col0 + 8*kScoreTiles) of the (kBlockM, kBlockN) tile at (m0, n0)):
// P = exp2(S * scale_log2 - LSE) with the element mask, dS = P ∘ (dP - D), both
// written to shared memory as Element. P only when maybe_p_smem is set.
template <class T>
__device__ __forceinline__ void scores_to_p_and_ds(const float (&s)[T::kScoreTiles][4],
                                                   const float (&dp)[T::kScoreTiles][4], const BackwardParams& params,
                                                   const MaskRule& mask, bool needs_mask, std::int64_t m0,
                                                   std::int64_t n0, std::int64_t seqlen_k, const float* lse_smem,
                                                   const float* dsum_smem, int row0, int col0, int lane,
                                                   typename T::Element* maybe_p_smem,
                                                   typename T::Element* ds_smem) {
  using Element = typename T::Element;
  const int g = lane / 4, t = lane % 4;
  const bool has_softcap = params.has_softcap();
  const float scale_over_cap = has_softcap ? params.softmax_scale / params.softcap : 0.0f;
  const float cap_log2 = params.softcap * static_cast<float>(online_softmax::kLog2e);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    const float lse_log2 = lse_smem[row];
    const float dsum = dsum_smem[row];
#pragma unroll
    for (int j = 0; j < T::kScoreTiles; ++j) {
      const int col = col0 + 8 * j + 2 * t;
      float p[2], ds[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float raw = s[j][2 * half + e];
        float score_log2, derivative = 1.0f;
        if (has_softcap) {
          const float capped = tanhf(raw * scale_over_cap);
          score_log2 = capped * cap_log2;
          derivative = 1.0f - capped * capped;
        } else {
          score_log2 = raw * params.softmax_scale_log2;
        }
        p[e] = exp2f(score_log2 - lse_log2);
        if (needs_mask) {
          const std::int64_t column = n0 + col + e;
          if (column >= seqlen_k || !mask.allowed(m0 + row, column)) p[e] = 0.0f;
        }
        ds[e] = p[e] * (dp[j][2 * half + e] - dsum) * derivative;
      }
      if (maybe_p_smem) *reinterpret_cast<std::uint32_t*>(maybe_p_smem + row * T::kLdN + col) = pack_pair<Element>(p[0], p[1]);
      *reinterpret_cast<std::uint32_t*>(ds_smem + row * T::kLdN + col) = pack_pair<Element>(ds[0], ds[1]);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(T::kThreads)
    dq_kernel(const __grid_constant__ BackwardParams params, const Workspace workspace, int num_m_blocks,
              bool is_aligned) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kStages = T::kStages;
  extern __shared__ __align__(128) unsigned char shared_bytes[];
  Element* q_smem = reinterpret_cast<Element*>(shared_bytes);  // (kBlockM, kHeadDim)
  Element* do_smem = q_smem + T::kTileQ;                        // (kBlockM, kHeadDim)
  Element* k_smem = do_smem + T::kTileQ;                        // kStages x (kBlockN, kHeadDim)
  Element* v_smem = k_smem + kStages * T::kTileKv;              // kStages x (kBlockN, kHeadDim)
  Element* ds_smem = v_smem + kStages * T::kTileKv;             // (kBlockM, kBlockN)
  float* lse_smem = reinterpret_cast<float*>(ds_smem + T::kTileScores);  // (kBlockM)
  float* dsum_smem = lse_smem + kBlockM;                                 // (kBlockM)

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const std::int64_t m_block = blockIdx.x % num_m_blocks;
  const std::int64_t h_q = (blockIdx.x / num_m_blocks) % params.heads_q;
  const std::int64_t b = blockIdx.x / num_m_blocks / params.heads_q;
  const std::int64_t h_kv = h_q / params.group_size;
  const std::int64_t seqlen_q = params.seqlen_q_of(b), seqlen_k = params.seqlen_k_of(b);
  const std::int64_t m0 = m_block * kBlockM;
  if (m0 >= seqlen_q) return;
  const std::int64_t q_rows = seqlen_q - m0 < kBlockM ? seqlen_q - m0 : kBlockM;
  const int head_dim = static_cast<int>(params.head_dim);
  const MaskRule mask = params.mask_of(b);

  load_tile<T, kBlockM>(q_smem, static_cast<const Element*>(params.q) + params.q_offset(b, h_q) + m0 * params.q_row_stride,
                        params.q_row_stride, q_rows, head_dim, is_aligned, tid);
  load_tile<T, kBlockM>(do_smem,
                        static_cast<const Element*>(params.dout) + params.dout_offset(b, h_q) + m0 * params.dout_row_stride,
                        params.dout_row_stride, q_rows, head_dim, is_aligned, tid);
  load_row_stats<T>(lse_smem, dsum_smem, params, workspace, b, h_q, m0, tid);

  const MaskRule::ColumnRange columns = mask.columns_of_rows(m0, m0 + q_rows);
  const std::int64_t n_block_begin = columns.begin / kBlockN;
  const std::int64_t steps = columns.end > columns.begin ? (columns.end + kBlockN - 1) / kBlockN - n_block_begin : 0;
  const Element* k_base = static_cast<const Element*>(params.k) + params.k_offset(b, h_kv);
  const Element* v_base = static_cast<const Element*>(params.v) + params.v_offset(b, h_kv);
  auto issue_step_loads = [&](std::int64_t step, int stage) {
    const std::int64_t n0 = (n_block_begin + step) * kBlockN;
    load_tile<T, kBlockN>(k_smem + stage * T::kTileKv, k_base + n0 * params.k_row_stride, params.k_row_stride,
                          seqlen_k - n0, head_dim, is_aligned, tid);
    load_tile<T, kBlockN>(v_smem + stage * T::kTileKv, v_base + n0 * params.v_row_stride, params.v_row_stride,
                          seqlen_k - n0, head_dim, is_aligned, tid);
  };

  float dq_acc[T::kDqTiles][4];  // (16, kHeadDim / kWarpsColsQ) of dQ (kBlockM, kHeadDim), unscaled
  zero(dq_acc);
  const int score_row0 = (warp % T::kWarpsRowsQ) * 16;
  const int score_col0 = (warp / T::kWarpsRowsQ) * (kBlockN / T::kWarpsColsQ);
  const int dq_col0 = (warp / T::kWarpsRowsQ) * (T::kHeadDim / T::kWarpsColsQ);

  if (steps > 0) issue_step_loads(0, 0);
  ptx::cp_async_commit_group();
  for (std::int64_t step = 0; step < steps; ++step) {
    const int stage = kStages == 1 ? 0 : static_cast<int>(step % 2);
    if constexpr (kStages == 2) {
      if (step + 1 < steps) issue_step_loads(step + 1, 1 - stage);
      ptx::cp_async_commit_group();
      ptx::cp_async_wait_group<1>();
    } else {
      ptx::cp_async_wait_group<0>();
    }
    __syncthreads();

    const std::int64_t n0 = (n_block_begin + step) * kBlockN;
    const Element* k_tile = k_smem + stage * T::kTileKv;  // (kBlockN, kHeadDim)
    const Element* v_tile = v_smem + stage * T::kTileKv;  // (kBlockN, kHeadDim)
    float s[T::kScoreTiles][4], dp[T::kScoreTiles][4];
    zero(s);
    zero(dp);
    warp_gemm<T::kScoreTiles, T::kHeadDim, false, false>(s, q_smem, T::kLdHead, score_row0, k_tile, T::kLdHead,
                                                          score_col0, lane);
    warp_gemm<T::kScoreTiles, T::kHeadDim, false, false>(dp, do_smem, T::kLdHead, score_row0, v_tile, T::kLdHead,
                                                          score_col0, lane);
    const bool needs_mask = n0 + kBlockN > seqlen_k || !mask.tile_fully_allowed(m0, m0 + q_rows, n0, n0 + kBlockN);
    scores_to_p_and_ds<T>(s, dp, params, mask, needs_mask, m0, n0, seqlen_k, lse_smem, dsum_smem, score_row0,
                          score_col0, lane, nullptr, ds_smem);
    __syncthreads();
    // dQ += dS K: (kBlockM, kHeadDim) with depth kBlockN
    warp_gemm<T::kDqTiles, kBlockN, false, true>(dq_acc, ds_smem, T::kLdN, score_row0, k_tile, T::kLdHead, dq_col0,
                                                 lane);
    __syncthreads();
    if constexpr (kStages == 1) {
      if (step + 1 < steps) issue_step_loads(step + 1, 0);
      ptx::cp_async_commit_group();
    }
  }
  ptx::cp_async_wait_group<0>();
  store_fragment_tile<Element, T::kDqTiles>(
      dq_acc, params.softmax_scale, static_cast<Element*>(params.dq) + params.dq_offset(b, h_q) + m0 * params.dq_row_stride,
      params.dq_row_stride, score_row0, dq_col0, q_rows, head_dim, is_aligned, lane);
}

}  // namespace flashattn::cuda::bwd
