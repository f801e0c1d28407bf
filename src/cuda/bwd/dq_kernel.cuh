// src/cuda/bwd/dq_kernel.cuh — the deterministic dQ kernel: one CTA per (query
// block, query head, sequence) walks the key blocks its rows see, recomputes
// S, dP and dS (as dkdv_kernel.cuh does) and sums dQ = scale * dS K in registers
// in a fixed order, so dQ is bitwise reproducible (no atomics). The dK/dV kernel
// runs beside it without its dQ part.
//
// Same mapping as the dK/dV kernel: swizzled 16-bit tiles (no padding) read by
// ldmatrix through per-lane FragmentAddress, one warp grid per product (dq_traits.hpp),
// fragment prefetch. Q, dO, LSE and D stay in shared memory for the whole CTA; K and V
// of the next step stream in through cp.async during this one. One step:
//   S = Q K^T, dP = dO V^T     registers, warp grid over (block_m, block_n)
//   dS -> shared memory         (the element mask only on boundary tiles, or with a block
//                                mask / attn_mask on the listed partial tiles; score rule
//                                and dropout as in dkdv_kernel's write_p_and_ds)
//   dQ += dS K                  warp grid over (block_m, head_dim), ldmatrix.trans for K
#pragma once

#include <cstdint>

#include "flashattn/mask.hpp"
#include "src/core/params.hpp"
#include "src/cuda/bwd/common.cuh"
#include "src/cuda/bwd/dkdv_kernel.cuh"
#include "src/cuda/bwd/dq_traits.hpp"
#include "src/cuda/bwd/fragment_address.hpp"
#include "src/cuda/bwd/workspace.hpp"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/common/swizzle.cuh"
#include "src/cuda/ptx/cp_async.cuh"

namespace flashattn::cuda::bwd {

// kVariant: see KernelVariant (dkdv_kernel.cuh).
template <class T, KernelVariant kVariant>
__global__ void __launch_bounds__(T::kThreads, 1)
    dq_kernel(const __grid_constant__ BackwardParams params, const Workspace workspace, int num_m_blocks,
              bool is_aligned, bool is_alibi_affine) {
  using Element = typename T::Element;
  using QTile = typename T::QTile;
  using KvTile = typename T::KvTile;
  using ScoreTile = typename T::ScoreTile;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kHeadDim = T::kHeadDim, kStages = T::kStages;
  constexpr ptx::MmaInput kInput = Numeric<Element>::kMmaInput;
  constexpr bool kIsPlain = kVariant == KernelVariant::plain, kIsMasked = kVariant == KernelVariant::masked;
  extern __shared__ __align__(128) unsigned char shared_bytes[];
  Element* q_smem = reinterpret_cast<Element*>(shared_bytes + T::kQOffset);    // (kBlockM, kHeadDim)
  Element* do_smem = reinterpret_cast<Element*>(shared_bytes + T::kDoOffset);  // (kBlockM, kHeadDim)
  Element* k_smem = reinterpret_cast<Element*>(shared_bytes + T::kKOffset);    // kStages x (kBlockN, kHeadDim)
  Element* v_smem = reinterpret_cast<Element*>(shared_bytes + T::kVOffset);    // kStages x (kBlockN, kHeadDim)
  Element* ds_smem = reinterpret_cast<Element*>(shared_bytes + T::kDsOffset);  // (kBlockM, kBlockN)
  float* lse_smem = reinterpret_cast<float*>(shared_bytes + T::kLseOffset);    // (kBlockM)
  float* dsum_smem = reinterpret_cast<float*>(shared_bytes + T::kDsumOffset);  // (kBlockM)

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

  load_swizzled_tile<kBlockM, kHeadDim, T::kThreads>(
      q_smem, static_cast<const Element*>(params.q) + params.q_offset(b, h_q) + m0 * params.q_row_stride,
      params.q_row_stride, q_rows, head_dim, is_aligned, tid);
  load_swizzled_tile<kBlockM, kHeadDim, T::kThreads>(
      do_smem, static_cast<const Element*>(params.dout) + params.dout_offset(b, h_q) + m0 * params.dout_row_stride,
      params.dout_row_stride, q_rows, head_dim, is_aligned, tid);
  {
    // Whole padded tiles of LSE and D (workspace.hpp), 4 rows per 16-byte copy.
    const std::int64_t stats_row = h_q * workspace.stats_head_stride + Workspace::stats_start(params, b) + m0;
    constexpr int kStatChunks = kBlockM / 4;
    for (int index = tid; index < 2 * kStatChunks; index += T::kThreads) {
      const bool is_lse = index < kStatChunks;
      const int chunk = is_lse ? index : index - kStatChunks;
      const float* source = (is_lse ? workspace.lse_log2 : workspace.dsum) + stats_row + 4 * chunk;
      float* destination = (is_lse ? lse_smem : dsum_smem) + 4 * chunk;
      ptx::cp_async_16(ptx::shared_address(destination), source, true);
    }
  }

  // Steps: the key blocks this query block sees: the interval rule's column range, or
  // with a block mask / attn_mask (the masked variant) this query tile's list (the
  // interval rule folded in; src/core/mask_tables.hpp), in list order.
  const TileLists& key_lists = params.device_mask.by_query_tile;
  const bool is_listed = kIsMasked && key_lists.present();
  const std::int64_t list = is_listed ? key_lists.list(b, h_q, m_block) : 0;
  const MaskRule::ColumnRange columns = mask.columns_of_rows(m0, m0 + q_rows);
  const std::int64_t n_block_begin = columns.begin / kBlockN;
  const int interval_steps =
      columns.end > columns.begin ? static_cast<int>((columns.end + kBlockN - 1) / kBlockN - n_block_begin) : 0;
  const int steps = is_listed ? key_lists.count(list) : interval_steps;
  const Element* k_base = static_cast<const Element*>(params.k) + params.k_offset(b, h_kv);
  const Element* v_base = static_cast<const Element*>(params.v) + params.v_offset(b, h_kv);
  // A step's key block; partial: a listed tile that needs the element pass.
  auto step_block = [&](int step) -> TileEntry {
    if (is_listed) return key_lists.entry(list, step);
    return {static_cast<std::int32_t>(n_block_begin + step), false};
  };
  auto issue_step_loads = [&](int step, int stage) {
    const std::int64_t n0 = static_cast<std::int64_t>(step_block(step).tile) * kBlockN;
    load_swizzled_tile<kBlockN, kHeadDim, T::kThreads>(k_smem + stage * KvTile::kElements,
                                                        k_base + n0 * params.k_row_stride, params.k_row_stride,
                                                        seqlen_k - n0, head_dim, is_aligned, tid);
    load_swizzled_tile<kBlockN, kHeadDim, T::kThreads>(v_smem + stage * KvTile::kElements,
                                                        v_base + n0 * params.v_row_stride, params.v_row_stride,
                                                        seqlen_k - n0, head_dim, is_aligned, tid);
  };

  // Warp tiles of the two products.
  const int sdp_m0 = T::sdp_row0(warp), sdp_n0 = T::sdp_col0(warp);
  const int dq_m0 = T::dq_row0(warp), dq_d0 = T::dq_col0(warp);
  const LaneRow a_lane = plain_a_lane(lane), bn_lane = plain_b_pair_lane(lane), bk_lane = trans_b_pair_lane(lane);
  using ptx::shared_address;
  const FragmentAddress<QTile, 0> q_as_a(shared_address(q_smem), sdp_m0 + a_lane.row, 0, a_lane.chunk_bit);  // Q, dO
  const FragmentAddress<KvTile, 0> k_as_b(shared_address(k_smem), sdp_n0 + bn_lane.row, 0, bn_lane.chunk_bit);  // K, V
  const FragmentAddress<ScoreTile, 0> ds_as_a(shared_address(ds_smem), dq_m0 + a_lane.row, 0, a_lane.chunk_bit);
  const FragmentAddress<KvTile, T::kDqWarpChunks> k_as_bt(shared_address(k_smem), bk_lane.row, dq_d0 / 8,
                                                          bk_lane.chunk_bit);  // K in dQ
  constexpr std::uint32_t kDoMinusQ = T::kDoOffset - T::kQOffset;
  constexpr std::uint32_t kVMinusK = T::kVOffset - T::kKOffset;

  // ALiBi's affine form (write_p_and_ds): the key blocks whose S tile this warp sees on one
  // side of the diagonal, as 32-bit bounds on the tile's first key n0 + sdp_n0 (the rows are
  // fixed: ScoreRule::side_bounds, once per CTA; the defaults: none, the switch off).
  const bool has_alibi_sides = kVariant == KernelVariant::general && is_alibi_affine && params.has_alibi();
  fragment::ColumnBlockSides alibi_sides{};
  if (has_alibi_sides) {
    const ScoreRule geometry = params.score_of_slope(0.0f, mask);  // its diagonal
    const std::int64_t warp_row_first = m0 + sdp_m0;
    alibi_sides = fragment::ColumnBlockSides::of(
        geometry.side_bounds(warp_row_first, warp_row_first + T::kSdpWarpRows - 1, T::kSdpWarpCols, mask));
  }

  float dq[T::kDqMTiles][T::kDqNTiles][4] = {};  // (kDqWarpRows, kDqWarpCols) of dQ, unscaled

  if (steps > 0) issue_step_loads(0, 0);
  ptx::cp_async_commit_group();
  for (int step = 0; step < steps; ++step) {
    const int stage = kStages == 1 ? 0 : step % 2;
    // This step's K/V (and at step 0 Q, dO, LSE, D) have landed; every warp has
    // finished the previous step (its K/V stage and dS may be reused).
    ptx::cp_async_wait_group<0>();
    __syncthreads();
    if constexpr (kStages == 2) {
      if (step + 1 < steps) issue_step_loads(step + 1, stage ^ 1);
      ptx::cp_async_commit_group();
    }
    const TileEntry block = step_block(step);
    const std::int64_t n0 = static_cast<std::int64_t>(block.tile) * kBlockN;
    const std::uint32_t stage_bytes = stage * KvTile::kBytes;
    // Listed: the element pass on partial tiles and on the key tail (as in dkdv_kernel).
    const bool has_element_pass = is_listed && (block.partial || n0 + kBlockN > seqlen_k);

    // S = Q K^T, dP = dO V^T: (kSdpWarpRows, kSdpWarpCols) per warp
    float s[T::kSdpMTiles][T::kSdpNTiles][4] = {};
    float dp[T::kSdpMTiles][T::kSdpNTiles][4] = {};
    constexpr int kHeadSteps = kHeadDim / 16;
    warp_gemm<kHeadSteps, T::kSdpMTiles, T::kSdpNTiles, kInput, T::kPrefetch>(
        s, [&](int kk, int mi, auto& r) { load_fragment(r, q_as_a.at(16 * mi, 2 * kk)); },
        [&](int kk, int nj, auto& r) { load_fragment(r, k_as_b.at(16 * nj, 2 * kk) + stage_bytes); });
    if constexpr (kIsPlain) exponentiate<T>(s, params, lse_smem, sdp_m0, lane);
    warp_gemm<kHeadSteps, T::kSdpMTiles, T::kSdpNTiles, kInput, T::kPrefetch>(
        dp, [&](int kk, int mi, auto& r) { load_fragment(r, q_as_a.at(16 * mi, 2 * kk) + kDoMinusQ); },
        [&](int kk, int nj, auto& r) { load_fragment(r, k_as_b.at(16 * nj, 2 * kk) + stage_bytes + kVMinusK); });
    const bool needs_mask =
        !is_listed && (n0 + kBlockN > seqlen_k || !mask.tile_fully_allowed(m0, m0 + q_rows, n0, n0 + kBlockN));
    // No dBias here: the dK/dV kernel sums it.
    const std::int32_t tile_code = is_listed && block.partial ? key_lists.code(list, step) : kGeneralTile;
    write_p_and_ds<T, kVariant, false>(s, dp, params, b, h_q, mask, needs_mask, has_element_pass, tile_code, false, m0, n0,
                                       lse_smem, dsum_smem, sdp_m0, sdp_n0, lane, nullptr, ds_smem,
                                       has_alibi_sides ? alibi_sides.side(static_cast<std::int32_t>(n0) + sdp_n0)
                                                       : DiagonalSide::straddles);
    __syncthreads();

    // dQ += dS K: (kDqWarpRows, kDqWarpCols) per warp, depth kBlockN
    warp_gemm<kBlockN / 16, T::kDqMTiles, T::kDqNTiles, kInput, T::kPrefetch>(
        dq, [&](int kk, int mi, auto& r) { load_fragment(r, ds_as_a.at(16 * mi, 2 * kk)); },
        [&](int kk, int dj, auto& r) { load_fragment_trans(r, k_as_bt.at(16 * kk, 2 * dj) + stage_bytes); });
    if constexpr (kStages == 1) {
      // Single buffer: the next K/V may land only once every warp is past dQ.
      __syncthreads();
      if (step + 1 < steps) issue_step_loads(step + 1, 0);
      ptx::cp_async_commit_group();
    }
  }
  ptx::cp_async_wait_group<0>();

#pragma unroll
  for (int mi = 0; mi < T::kDqMTiles; ++mi)
    store_fragment_tile<Element, T::kDqNTiles>(
        dq[mi], params.softmax_scale,
        static_cast<Element*>(params.dq) + params.dq_offset(b, h_q) + m0 * params.dq_row_stride, params.dq_row_stride,
        dq_m0 + 16 * mi, dq_d0, q_rows, head_dim, is_aligned, lane);
}

}  // namespace flashattn::cuda::bwd
