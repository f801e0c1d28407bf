// src/cuda/bwd/dkdv_kernel.cuh — the main backward kernel (FA2 structure, mma.sync).
//
// For one (sequence, head) with P = exp(S - LSE), S = ScoreRule(scale * Q K^T)
// (flashattn/score.hpp: softcap S = c * tanh(scale * Q K^T / c), ALiBi bias) and the
// dropout keep mask Z (flashattn/dropout.hpp; Z = 1 without dropout, 1/(1-p) = 1):
//   D  = rowsum(dO ∘ O)                  (preprocess, pre_post.cu; O already dropped)
//   dV = (P ∘ Z)^T dO / (1-p)            dP = dO V^T
//   dS = P ∘ (Z ∘ dP / (1-p) - D)        (softcap: ∘ (1 - tanh²), ScoreRule::gradient_factor)
//   dK = scale * dS^T Q                  dQ = scale * dS K
// S and dP are held as S (rows = queries, columns = keys) in m16n8 C fragments, so the
// score and dropout hooks see the same layout as the forward's (common/fragment.cuh).
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
//                                    op per tile) while the next step computes; or
//                                    vector atomics from registers (config dq_atomics).
// Q, dO, LSE and D of the next step stream in through cp.async during this one.
// With a block mask / attn_mask (KernelVariant::masked) the steps are the key block's
// tile lists (src/core/mask_tables.hpp), partial tiles get the element pass
// (common/mask_fragment.cuh) and dBias sums dS here.
// Every 16-bit tile is swizzled (common/swizzle.cuh): ldmatrix and cp.async without
// bank conflicts and without padding. Deterministic mode skips dQ here (dq_kernel).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/core/params.hpp"
#include "src/cuda/bwd/common.cuh"
#include "src/cuda/bwd/dkdv_traits.hpp"
#include "src/cuda/bwd/fragment_address.hpp"
#include "src/cuda/bwd/tile_config.hpp"
#include "src/cuda/bwd/workspace.hpp"
#include "src/cuda/common/fragment.cuh"
#include "src/cuda/common/mask_fragment.cuh"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/common/swizzle.cuh"
#include "src/cuda/ptx/bulk_reduce.cuh"
#include "src/cuda/ptx/arch.cuh"
#include "src/cuda/ptx/cp_async.cuh"
#include "src/cuda/ptx/ldmatrix.cuh"
#include "src/cuda/ptx/math.cuh"
#include "src/cuda/ptx/mma_sync.cuh"

namespace flashattn::cuda::bwd {

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

// One warp: acc (16 kMTiles, 8 kNTiles) += A (16 kMTiles, 16 kSteps) B (16 kSteps, 8 kNTiles),
// the fragments of k-step kk loaded from shared memory by load_a(kk, mi, a) (an m16k16
// A fragment) and load_b(kk, nj, b) (the B fragments of n8 tiles 2nj and 2nj+1).
// kPrefetch: the fragments of step kk+1 are loaded before the mma of step kk, so the
// shared-memory latency hides behind them (double the fragment registers).
template <int kSteps, int kMTiles, int kNTiles, ptx::MmaInput kInput, bool kPrefetch, class LoadA, class LoadB>
__device__ __forceinline__ void warp_gemm(float (&acc)[kMTiles][kNTiles][4], LoadA load_a, LoadB load_b) {
  static_assert(kNTiles % 2 == 0);
  if constexpr (kPrefetch) {
    std::uint32_t a[2][kMTiles][4];
    std::uint32_t b[2][kNTiles / 2][2][2];
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) load_a(0, mi, a[0][mi]);
#pragma unroll
    for (int nj = 0; nj < kNTiles / 2; ++nj) load_b(0, nj, b[0][nj]);
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      const int current = kk % 2;
      if (kk + 1 < kSteps) {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) load_a(kk + 1, mi, a[current ^ 1][mi]);
#pragma unroll
        for (int nj = 0; nj < kNTiles / 2; ++nj) load_b(kk + 1, nj, b[current ^ 1][nj]);
      }
#pragma unroll
      for (int nj = 0; nj < kNTiles / 2; ++nj)
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          ptx::mma_m16n8k16<kInput>(acc[mi][2 * nj], a[current][mi], b[current][nj][0]);
          ptx::mma_m16n8k16<kInput>(acc[mi][2 * nj + 1], a[current][mi], b[current][nj][1]);
        }
    }
  } else {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      std::uint32_t a[kMTiles][4];
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) load_a(kk, mi, a[mi]);
#pragma unroll
      for (int nj = 0; nj < kNTiles / 2; ++nj) {
        std::uint32_t b[2][2];
        load_b(kk, nj, b);
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          ptx::mma_m16n8k16<kInput>(acc[mi][2 * nj], a[mi], b[0]);
          ptx::mma_m16n8k16<kInput>(acc[mi][2 * nj + 1], a[mi], b[1]);
        }
      }
    }
  }
}

// ldmatrix wrappers for warp_gemm's loaders: an A fragment, or the B fragments of two n8 tiles.
__device__ __forceinline__ void load_fragment(std::uint32_t (&r)[4], std::uint32_t address) {
  ptx::ldmatrix_x4(r[0], r[1], r[2], r[3], address);
}
__device__ __forceinline__ void load_fragment_trans(std::uint32_t (&r)[4], std::uint32_t address) {
  ptx::ldmatrix_x4_trans(r[0], r[1], r[2], r[3], address);
}
__device__ __forceinline__ void load_fragment(std::uint32_t (&r)[2][2], std::uint32_t address) {
  ptx::ldmatrix_x4(r[0][0], r[0][1], r[1][0], r[1][1], address);
}
__device__ __forceinline__ void load_fragment_trans(std::uint32_t (&r)[2][2], std::uint32_t address) {
  ptx::ldmatrix_x4_trans(r[0][0], r[0][1], r[1][0], r[1][1], address);
}

// P = exp2(S * scale_log2 - LSE) in place, before the element mask, on the plain path
// (the exponentials then overlap the dP product). Rows past the sequence have
// LSE = +inf: P = 0.
template <class T>
__device__ __forceinline__ void exponentiate(float (&s)[T::kSdpMTiles][T::kSdpNTiles][4], const BackwardParams& params,
                                             const float* lse_tile, int warp_m0, int lane) {
  const float scale_log2 = params.softmax_scale_log2;
#pragma unroll
  for (int mi = 0; mi < T::kSdpMTiles; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float lse_log2 = lse_tile[warp_m0 + mi * 16 + lane / 4 + 8 * half];
#pragma unroll
      for (int j = 0; j < T::kSdpNTiles; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          s[mi][j][2 * half + e] = ptx::exp2_approx_ftz(fmaf(s[mi][j][2 * half + e], scale_log2, -lse_log2));
    }
}

// dBias += dS (w.r.t. the score, natural-log units) of a warp's fragments: write_p_and_ds
// with keeps_ds left it in dp.
template <class T>
__device__ __forceinline__ void accumulate_warp_dbias(float (&ds)[T::kSdpMTiles][T::kSdpNTiles][4],
                                                      const BackwardParams& params, const MaskRule& mask,
                                                      std::int64_t b, std::int64_t h_q, std::int64_t m0,
                                                      std::int64_t n0, int warp_m0, int warp_n0, int lane) {
#pragma unroll
  for (int mi = 0; mi < T::kSdpMTiles; ++mi)
    fragment::accumulate_dbias<T::kSdpNTiles>(fragment::flat(ds[mi]), params, mask, b, h_q,
                                              m0 + warp_m0 + 16 * mi + lane / 4, n0 + warp_n0, 1.0f);
}

// The instantiations of each backward kernel (launch_main.cuh: kernel_variant):
//  - plain: no softcap, no ALiBi, no dropout, no masks; the exponentials and the dP
//    product share one basic block (the compiler interleaves them) and no feature code
//    competes for the registers (the kernels sit at 255);
//  - general: the score rule per element, dropout as a uniform runtime branch;
//  - masked: general + a block mask / attn_mask: the steps from the tile lists
//    (src/core/mask_tables.hpp), the element pass on partial tiles, dBias. Its own
//    instantiation: inlined into the general one, the element pass (per-element offsets
//    and loads) raised ptxas' spills of the d128 sm_80 64 x 128 kernel from 100/164 to
//    164/300 bytes (444/692 with 64-bit divisions: spill stores in the loop of every
//    step). Called out of line instead (masked_fragment) it spilled more than inlined.
enum class KernelVariant { plain, general, masked };

// From a warp's S (kIsPlain: P from exponentiate; else raw Q K^T, mapped here by the
// score rule of (sequence b, query head h_q)) and dP = dO V^T fragments: P with the
// element mask and dropout, dS = P ∘ (Z ∘ dP / (1-p) - D) ∘ gradient factor, both written
// to shared memory as Element (P only if kWritesP: the dQ kernel needs dS alone). The
// written P is P ∘ Z, unscaled: dV takes the 1/(1-p) at its store.
// needs_mask: the interval rule's columns (MaskRule). Masked variant only: has_element_pass,
// a partial tile of a list-driven step: the element pass, its attn_mask bias joining the
// log2 score after the score rule — or, with a tile code (tile_code != kGeneralTile,
// src/core/mask_tables.hpp), the fast pass: per row spans and bits in registers
// (fragment::make_row_mask), -inf where masked; keeps_ds: dp is overwritten with dS w.r.t. the score
// (before the gradient factor; natural-log units) for the dBias accumulation.
// alibi_side: where the warp's (rows, columns) tile lies relative to the diagonal (the
// caller's fragment::RowBlockSides / ColumnBlockSides; straddles where ALiBi's affine form,
// common/alibi_path.hpp, is off): the general variant takes the affine form on a side.
template <class T, KernelVariant kVariant, bool kWritesP = true>
__device__ __forceinline__ void write_p_and_ds(const float (&s)[T::kSdpMTiles][T::kSdpNTiles][4],
                                               float (&dp)[T::kSdpMTiles][T::kSdpNTiles][4],
                                               const BackwardParams& params, std::int64_t b, std::int64_t h_q,
                                               const MaskRule& mask, bool needs_mask, bool has_element_pass,
                                               std::int32_t tile_code, bool keeps_ds, std::int64_t m0, std::int64_t n0,
                                               const float* lse_tile, const float* dsum_tile, int warp_m0, int warp_n0,
                                               int lane, typename T::Element* p_tile, typename T::Element* ds_tile,
                                               DiagonalSide alibi_side) {
  using Element = typename T::Element;
  using ScoreTile = typename T::ScoreTile;
  constexpr bool kIsPlain = kVariant == KernelVariant::plain, kIsMasked = kVariant == KernelVariant::masked;
  const int group = lane / 4, quad_lane = lane % 4;
  // Built per tile (the ALiBi slope and the dropout seed may be loads): nothing of
  // them stays live across the kernel's loop.
  ScoreRule score_rule;
  if constexpr (!kIsPlain) score_rule = params.score_of(b, h_q, mask);
  // ALiBi's affine form: on a warp tile whose elements lie on one side of the diagonal
  // the bias is linear in the distance q + diagonal - k (ScoreRule::bias_on_side), so
  // with the LSE known (no max to take) log2 P = dot scale_log2 + bias(D0) - LSE -
  // bias(1) (8 j + e), D0 the distance of the lane's (row, first column): per row one
  // add, per element two FFMAs with a compile-time offset, instead of the per-element
  // |distance| (the Hopper backward's form, hopper_bwd/kernel.cuh). The general variant
  // only: in the masked one the form's copy of the row loop raised ptxas' spills of the
  // sm_80 d128 64 x 128 kernel from 132/136 to 180/356 bytes (store/load), without ALiBi too.
  DiagonalSide side = DiagonalSide::straddles;
  if constexpr (kVariant == KernelVariant::general)
    if (score_rule.has_affine_bias()) side = alibi_side;  // the query head's slope allows it
  // One body, compiled with and without dropout (has_dropout: std::true_type or
  // std::false_type, a uniform branch between the copies), or once with dropout as a
  // runtime flag (a bool: the masked variant, whose element pass would double the code);
  // and once with ALiBi's affine form (is_affine = std::true_type, general variant), dropout
  // a runtime flag there (one copy per dropout case spilled more: sm_90a d64 128 x 128
  // staged dQ 180/488 bytes against 180/412).
  auto write_rows = [&](auto has_dropout, auto is_affine) {
    constexpr bool kHasDropout = !std::is_same_v<decltype(has_dropout), std::false_type>;
    const bool is_dropout = has_dropout;  // a constant but in the masked variant
    constexpr bool kIsAffine = !std::is_same_v<decltype(is_affine), std::false_type>;
    [[maybe_unused]] DropoutRule dropout;
    [[maybe_unused]] std::uint32_t batch_head = 0;
    if constexpr (kHasDropout)
      if (is_dropout) dropout = params.dropout(), batch_head = params.dropout_head(b, h_q);
#pragma unroll
    for (int mi = 0; mi < T::kSdpMTiles; ++mi) {
      // Keep bits of this lane's elements of the (16, kSdpWarpCols) block at sequence
      // row m0 + warp_m0 + 16 mi (+ group, half 0), bit 4j + 2 half + e.
      [[maybe_unused]] std::uint32_t keep = 0;
      if (kHasDropout && is_dropout)
        keep = fragment::dropout_keep_bits<T::kSdpNTiles>(dropout, batch_head, m0 + warp_m0 + mi * 16 + group,
                                                          n0 + warp_n0);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp_m0 + mi * 16 + group + 8 * half;
        const float dsum = dsum_tile[row];
        int begin = 0, end = T::kBlockN;
        if (needs_mask) {
          // Allowed columns of this row relative to n0 (col_end <= seqlen_k covers the key tail).
          begin = static_cast<int>(MaskRule::clamp(mask.col_begin(m0 + row) - n0, 0, T::kBlockN));
          end = static_cast<int>(MaskRule::clamp(mask.col_end(m0 + row) - n0, 0, T::kBlockN));
        }
        // The score rule's row inputs: the LSE and the ALiBi distance of (row, column n0),
        // 32-bit from here on (one subtract per element).
        [[maybe_unused]] float lse_log2 = 0.0f;
        [[maybe_unused]] float distance0 = 0.0f;  // less the lane's 2·quad: per element a constant offset
        // The affine form's row inputs: bias(D0) - LSE and bias(1).
        [[maybe_unused]] float bias0_minus_lse = 0.0f, bias_per_distance = 0.0f;
        // The fast element pass of this row (a partial tile with a tile code).
        [[maybe_unused]] const bool is_fast_pass = kIsMasked && has_element_pass && tile_code != kGeneralTile;
        [[maybe_unused]] fragment::RowMask<T::kSdpNTiles> row_mask;
        if constexpr (kIsMasked)
          if (is_fast_pass)
            row_mask = fragment::make_row_mask<T::kSdpNTiles, false>(params, mask, tile_code, b, m0 + row, n0 + warp_n0);
        if constexpr (!kIsPlain)
          lse_log2 = lse_tile[row],
          distance0 = static_cast<float>(score_rule.distance(m0 + row, n0) - warp_n0 - 2 * quad_lane);
        if constexpr (kIsAffine)
          bias0_minus_lse = score_rule.bias_on_side(side, distance0) - lse_log2,
          bias_per_distance = score_rule.bias_on_side(side, 1.0f);
#pragma unroll
        for (int j = 0; j < T::kSdpNTiles; ++j) {
          const int col = warp_n0 + 8 * j + 2 * quad_lane;
          float p[2], ds[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            [[maybe_unused]] float gradient_factor = 1.0f;
            if constexpr (kIsPlain) {
              p[e] = s[mi][j][2 * half + e];
            } else if constexpr (kIsAffine) {
              const float bias_minus_lse =
                  fmaf(bias_per_distance, -static_cast<float>(8 * j + e), bias0_minus_lse);
              p[e] = ptx::exp2_approx_ftz(fmaf(s[mi][j][2 * half + e], score_rule.scale_log2, bias_minus_lse));
            } else {
              const ScoreRule::ScoreAndGradient score =
                  score_rule.log2_score_and_gradient_at_distance(s[mi][j][2 * half + e],
                                                                 distance0 - static_cast<float>(8 * j + e));
              float log2_score = score.log2_score;
              if (kIsMasked && has_element_pass) {
                if (is_fast_pass) log2_score = row_mask.allows(j, e) ? log2_score : -INFINITY;
                else log2_score += static_cast<float>(online_softmax::kLog2e) *
                                   fragment::mask_offset(params, mask, b, h_q, m0 + row, n0 + col + e);
              }
              p[e] = ptx::exp2_approx_ftz(log2_score - lse_log2);
              gradient_factor = score.gradient_factor;
            }
            if (col + e < begin || col + e >= end) p[e] = 0.0f;
            float dp_kept = dp[mi][j][2 * half + e];
            if (kHasDropout && is_dropout) {
              const bool is_kept = (keep >> (4 * j + 2 * half + e)) & 1u;
              dp_kept = is_kept ? dp_kept * dropout.inverse_keep : 0.0f;
              ds[e] = p[e] * (dp_kept - dsum);
              if (!is_kept) p[e] = 0.0f;  // P ∘ Z for dV
            } else {
              ds[e] = p[e] * (dp_kept - dsum);
            }
            if (kIsMasked && keeps_ds) dp[mi][j][2 * half + e] = ds[e];
            if constexpr (!kIsPlain) ds[e] *= gradient_factor;
          }
          const int offset = ScoreTile::offset(row, col);
          if constexpr (kWritesP) *reinterpret_cast<std::uint32_t*>(p_tile + offset) = pack_pair<Element>(p[0], p[1]);
          *reinterpret_cast<std::uint32_t*>(ds_tile + offset) = pack_pair<Element>(ds[0], ds[1]);
        }
      }
    }
  };
  if constexpr (kIsPlain) {
    write_rows(std::false_type{}, std::false_type{});
  } else if constexpr (kIsMasked) {
    write_rows(params.has_dropout(), std::false_type{});
  } else if (side != DiagonalSide::straddles) {
    write_rows(params.has_dropout(), std::true_type{});
  } else if (params.has_dropout()) {
    write_rows(std::true_type{}, std::false_type{});
  } else {
    write_rows(std::false_type{}, std::false_type{});
  }
}

// One CTA's work (dkdv_kernel below).
template <class T, KernelVariant kVariant>
__device__ __forceinline__ void dkdv_block(const BackwardParams& params, const Workspace& workspace, int num_n_blocks,
                                           bool is_aligned, bool is_alibi_affine) {
  using Element = typename T::Element;
  using QTile = typename T::QTile;
  using KvTile = typename T::KvTile;
  using ScoreTile = typename T::ScoreTile;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kHeadDim = T::kHeadDim, kStages = T::kStages;
  constexpr ptx::MmaInput kInput = Numeric<Element>::kMmaInput;
  constexpr bool kIsPlain = kVariant == KernelVariant::plain, kIsMasked = kVariant == KernelVariant::masked;
  extern __shared__ __align__(128) unsigned char shared_bytes[];
  Element* k_smem = reinterpret_cast<Element*>(shared_bytes + T::kKOffset);    // (kBlockN, kHeadDim)
  Element* v_smem = reinterpret_cast<Element*>(shared_bytes + T::kVOffset);    // (kBlockN, kHeadDim)
  Element* q_smem = reinterpret_cast<Element*>(shared_bytes + T::kQOffset);    // kStages x (kBlockM, kHeadDim)
  Element* do_smem = reinterpret_cast<Element*>(shared_bytes + T::kDoOffset);  // kStages x (kBlockM, kHeadDim)
  Element* p_smem = reinterpret_cast<Element*>(shared_bytes + T::kPOffset);    // (kBlockM, kBlockN)
  Element* ds_smem = reinterpret_cast<Element*>(shared_bytes + T::kDsOffset);  // (kBlockM, kBlockN)
  float* dq_staging = reinterpret_cast<float*>(shared_bytes + T::kDqOffset);   // (kBlockM, kHeadDim) unless kDqAtomics
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

  // Steps: every query head of the group x every query block that sees this key block:
  // the interval rule's row range, or with a block mask / attn_mask (the masked variant)
  // each head's list of this key tile (the interval rule folded in;
  // src/core/mask_tables.hpp), in list order.
  const TileLists& query_lists = params.device_mask.by_key_tile;
  const bool is_listed = kIsMasked && query_lists.present();
  const bool accumulates_dbias = kIsMasked && params.device_mask.maybe_dbias_sum != nullptr;
  const std::int64_t h_q_begin = h_kv * params.group_size, h_q_end = h_q_begin + params.group_size;
  const MaskRule::RowRange rows = mask.rows_of_columns(n0, n0 + kv_rows);
  const int m_block_begin = static_cast<int>(rows.begin / kBlockM);
  const int m_blocks = rows.end > rows.begin ? static_cast<int>((rows.end + kBlockM - 1) / kBlockM) - m_block_begin : 0;
  int steps = m_blocks * static_cast<int>(params.group_size);
  if (is_listed) {
    steps = 0;
    for (std::int64_t h_q = h_q_begin; h_q < h_q_end; ++h_q)
      steps += query_lists.count(query_lists.list(b, h_q, n_block));
  }
  const std::int64_t stats_start = Workspace::stats_start(params, b);

  // A step's query head and first query row; is_partial: a listed tile that needs the
  // element pass.
  struct StepTile {
    std::int64_t h_q, m0;
    bool is_partial;
    std::int32_t code;  // a partial tile's tile code (mask_tables.hpp), else kGeneralTile
  };
  auto step_tile = [&](int step) -> StepTile {
    if (!is_listed)
      return {h_q_begin + step / m_blocks, static_cast<std::int64_t>(m_block_begin + step % m_blocks) * kBlockM, false,
              kGeneralTile};
    // The group's lists one after another (step < steps: one of them holds it).
    std::int64_t h_q = h_q_begin;
    int index = step;
    for (;;) {
      const int count = query_lists.count(query_lists.list(b, h_q, n_block));
      if (index < count || h_q + 1 >= h_q_end) break;
      index -= count;
      ++h_q;
    }
    const std::int64_t list = query_lists.list(b, h_q, n_block);
    const TileEntry entry = query_lists.entry(list, index);
    return {h_q, static_cast<std::int64_t>(entry.tile) * kBlockM, entry.partial,
            entry.partial ? query_lists.code(list, index) : kGeneralTile};
  };
  auto issue_step_loads = [&](int step, int stage) {
    const StepTile tile = step_tile(step);
    const std::int64_t h_q = tile.h_q, m0 = tile.m0;
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
    const StepTile tile = step_tile(step);
    const std::int64_t h_q = tile.h_q, m0 = tile.m0;
    float* dq_rows = workspace.dq_accum + workspace.dq_offset(params, b, m0, h_q);
#if FLASHATTN_SM90_DEVICE_CODE
    if (head_dim == kHeadDim) {
      // The tile is contiguous in the accumulator (rows past the sequence add zeros).
      if (tid == 0) {
        ptx::bulk_reduce_add_f32(dq_rows, ptx::shared_address(dq_staging), kBlockM * kHeadDim * 4);
        ptx::bulk_commit_group();
      }
    } else if (warp == 0) {
      // Padded head dim: the accumulator's rows are head_dim long, one copy per row.
      for (int row = lane; row < kBlockM; row += 32)
        ptx::bulk_reduce_add_f32(dq_rows + row * params.head_dim, ptx::shared_address(dq_staging + row * kHeadDim),
                                 static_cast<std::uint32_t>(head_dim) * 4);
      ptx::bulk_commit_group();
    }
#else
    (void)dq_rows;  // staged configs are compiled for sm_90 only (dkdv_kernel)
#endif
  };
  constexpr bool kUsesStaging = !T::kDqAtomics;

  // Warp tiles of the three products.
  const int sdp_m0 = T::sdp_row0(warp), sdp_n0 = T::sdp_col0(warp);
  const int kv_n0 = T::kv_row0(warp), kv_d0 = T::kv_col0(warp);
  const int dq_m0 = T::dq_row0(warp), dq_d0 = T::dq_col0(warp);
  const LaneRow a_lane = plain_a_lane(lane), bn_lane = plain_b_pair_lane(lane), bk_lane = trans_b_pair_lane(lane);
  const int a_row = a_lane.row, a_bit = a_lane.chunk_bit, bn_row = bn_lane.row, bn_bit = bn_lane.chunk_bit;
  const int bk_row = bk_lane.row, bk_bit = bk_lane.chunk_bit;
  constexpr int kKvChunks = T::kKvWarpChunks, kPChunks = T::kPWarpChunks, kDqChunks = T::kDqWarpChunks;
  using ptx::shared_address;
  const FragmentAddress<QTile, 0> q_as_a(shared_address(q_smem), sdp_m0 + a_row, 0, a_bit);     // Q, dO in S, dP
  const FragmentAddress<KvTile, 0> k_as_b(shared_address(k_smem), sdp_n0 + bn_row, 0, bn_bit);  // K, V in S, dP
  const FragmentAddress<ScoreTile, kPChunks> p_as_a(shared_address(p_smem), bn_row, kv_n0 / 8, bn_bit);  // P^T, dS^T
  const FragmentAddress<QTile, kKvChunks> q_as_b(shared_address(q_smem), bk_row, kv_d0 / 8, bk_bit);  // dO, Q in dV, dK
  const FragmentAddress<ScoreTile, 0> ds_as_a(shared_address(ds_smem), dq_m0 + a_row, 0, a_bit);      // dS in dQ
  const FragmentAddress<KvTile, kDqChunks> k_as_bt(shared_address(k_smem), bk_row, dq_d0 / 8, bk_bit);  // K in dQ
  constexpr std::uint32_t kDoMinusQ = T::kDoOffset - T::kQOffset;
  constexpr std::uint32_t kVMinusK = T::kVOffset - T::kKOffset;
  constexpr std::uint32_t kDsMinusP = T::kDsOffset - T::kPOffset;

  // ALiBi's affine form (write_p_and_ds): the query blocks whose S tile this warp sees on one
  // side of the diagonal, as 32-bit bounds on the tile's first row m0 + sdp_m0 (the keys are
  // fixed: ScoreRule::row_side_bounds, once per CTA; the defaults: none, the switch off).
  const bool has_alibi_sides = kVariant == KernelVariant::general && is_alibi_affine && params.has_alibi();
  fragment::RowBlockSides alibi_sides{};
  if (has_alibi_sides) {
    const ScoreRule geometry = params.score_of_slope(0.0f, mask);  // its diagonal
    const std::int64_t warp_key_first = n0 + sdp_n0;
    alibi_sides = fragment::RowBlockSides::of(
        geometry.row_side_bounds(warp_key_first, warp_key_first + T::kSdpWarpCols - 1, T::kSdpWarpRows, mask));
  }

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
    if (kUsesStaging && has_dq && step > 0) flush_dq(step - 1);
    if constexpr (kStages == 2) {
      if (step + 1 < steps) issue_step_loads(step + 1, stage ^ 1);
      ptx::cp_async_commit_group();
    }
    const StepTile tile = step_tile(step);
    const std::int64_t h_q = tile.h_q, m0 = tile.m0;
    const std::uint32_t stage_bytes = stage * QTile::kBytes;
    // Listed: the element pass on partial tiles and on the key tail (its zero K rows
    // must give P = 0: exp2(0 - LSE) may overflow and 0 · inf in dQ is NaN).
    const bool has_element_pass = is_listed && (tile.is_partial || n0 + kBlockN > seqlen_k);

    // S = Q K^T, dP = dO V^T: (kSdpWarpRows, kSdpWarpCols) per warp
    float s[T::kSdpMTiles][T::kSdpNTiles][4] = {};
    float dp[T::kSdpMTiles][T::kSdpNTiles][4] = {};
    constexpr int kHeadSteps = kHeadDim / 16;
    warp_gemm<kHeadSteps, T::kSdpMTiles, T::kSdpNTiles, kInput, T::kPrefetch>(
        s, [&](int kk, int mi, auto& r) { load_fragment(r, q_as_a.at(16 * mi, 2 * kk) + stage_bytes); },
        [&](int kk, int nj, auto& r) { load_fragment(r, k_as_b.at(16 * nj, 2 * kk)); });
    const float* lse_tile = lse_smem + stage * kBlockM;
    const float* dsum_tile = dsum_smem + stage * kBlockM;
    if constexpr (kIsPlain) exponentiate<T>(s, params, lse_tile, sdp_m0, lane);
    warp_gemm<kHeadSteps, T::kSdpMTiles, T::kSdpNTiles, kInput, T::kPrefetch>(
        dp, [&](int kk, int mi, auto& r) { load_fragment(r, q_as_a.at(16 * mi, 2 * kk) + stage_bytes + kDoMinusQ); },
        [&](int kk, int nj, auto& r) { load_fragment(r, k_as_b.at(16 * nj, 2 * kk) + kVMinusK); });

    const std::int64_t q_rows_end = m0 + kBlockM < seqlen_q ? m0 + kBlockM : seqlen_q;
    const bool needs_mask =
        !is_listed && (n0 + kBlockN > seqlen_k || !mask.tile_fully_allowed(m0, q_rows_end, n0, n0 + kBlockN));
    write_p_and_ds<T, kVariant>(s, dp, params, b, h_q, mask, needs_mask, has_element_pass, tile.code, accumulates_dbias, m0, n0,
                                lse_tile, dsum_tile, sdp_m0, sdp_n0, lane, p_smem, ds_smem,
                                has_alibi_sides ? alibi_sides.side(static_cast<std::int32_t>(m0) + sdp_m0)
                                                : DiagonalSide::straddles);
    // dBias here only (the deterministic dQ kernel recomputes the same dS).
    if (accumulates_dbias) accumulate_warp_dbias<T>(dp, params, mask, b, h_q, m0, n0, sdp_m0, sdp_n0, lane);
#if FLASHATTN_SM90_DEVICE_CODE
    // The TMA has read the previous step's staging tile before anyone rewrites it.
    if (kUsesStaging && has_dq && warp == 0) ptx::bulk_wait_group_read<0>();
#endif
    __syncthreads();

    // dV += P^T dO, dK += dS^T Q: (kKvWarpRows, kKvWarpCols) per warp, depth kBlockM
    warp_gemm<kBlockM / 16, T::kKvMTiles, T::kKvNTiles, kInput, T::kPrefetch>(
        dv, [&](int kk, int mi, auto& r) { load_fragment_trans(r, p_as_a.at(16 * kk, 2 * mi)); },
        [&](int kk, int dj, auto& r) { load_fragment_trans(r, q_as_b.at(16 * kk, 2 * dj) + stage_bytes + kDoMinusQ); });
    warp_gemm<kBlockM / 16, T::kKvMTiles, T::kKvNTiles, kInput, T::kPrefetch>(
        dk, [&](int kk, int mi, auto& r) { load_fragment_trans(r, p_as_a.at(16 * kk, 2 * mi) + kDsMinusP); },
        [&](int kk, int dj, auto& r) { load_fragment_trans(r, q_as_b.at(16 * kk, 2 * dj) + stage_bytes); });
    if constexpr (kStages == 1) {
      // Single buffer: the next Q/dO may land only once every warp is past dK, dV.
      __syncthreads();
      if (step + 1 < steps) issue_step_loads(step + 1, 0);
      ptx::cp_async_commit_group();
    }

    if (has_dq) {
      // dQ_step = dS K: (kDqWarpRows, kDqWarpCols) per warp, depth kBlockN
      float dq[T::kDqMTiles][T::kDqNTiles][4] = {};
      warp_gemm<kBlockN / 16, T::kDqMTiles, T::kDqNTiles, kInput, T::kPrefetch>(
          dq, [&](int kk, int mi, auto& r) { load_fragment(r, ds_as_a.at(16 * mi, 2 * kk)); },
          [&](int kk, int dj, auto& r) { load_fragment_trans(r, k_as_bt.at(16 * kk, 2 * dj)); });
      const int group = lane / 4, quad_lane = lane % 4;
      if constexpr (kUsesStaging) {
#pragma unroll
        for (int mi = 0; mi < T::kDqMTiles; ++mi)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            float* staging_row =
                dq_staging + (dq_m0 + 16 * mi + group + 8 * half) * T::kDqStagingLd + dq_d0 + 2 * quad_lane;
#pragma unroll
            for (int j = 0; j < T::kDqNTiles; ++j)
              *reinterpret_cast<float2*>(staging_row + 8 * j) = make_float2(dq[mi][j][2 * half], dq[mi][j][2 * half + 1]);
          }
#if FLASHATTN_SM90_DEVICE_CODE
        ptx::fence_proxy_async_shared();
#endif
      } else {
        // Rows past the sequence hold zeros and stay inside the head's accumulator rows.
        float* dq_rows = workspace.dq_accum + workspace.dq_offset(params, b, m0, h_q);
#pragma unroll
        for (int mi = 0; mi < T::kDqMTiles; ++mi)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            float* row = dq_rows + (dq_m0 + 16 * mi + group + 8 * half) * params.head_dim;
#pragma unroll
            for (int j = 0; j < T::kDqNTiles; ++j) {
              const int col = dq_d0 + 8 * j + 2 * quad_lane;
              if (col >= head_dim) continue;
#if FLASHATTN_SM90_DEVICE_CODE
              atomicAdd(reinterpret_cast<float2*>(row + col), make_float2(dq[mi][j][2 * half], dq[mi][j][2 * half + 1]));
#else
              atomicAdd(row + col, dq[mi][j][2 * half]);
              atomicAdd(row + col + 1, dq[mi][j][2 * half + 1]);
#endif
            }
          }
      }
    }
  }
  ptx::cp_async_wait_group<0>();
  if (kUsesStaging && has_dq && steps > 0) {
    __syncthreads();
    flush_dq(steps - 1);
#if FLASHATTN_SM90_DEVICE_CODE
    if (warp == 0) ptx::bulk_wait_group<0>();
#endif
  }

  // P was written as P ∘ Z: dV = (P ∘ Z)^T dO / (1 - p).
  const float dv_scale = !kIsPlain && params.has_dropout() ? params.dropout_inverse_keep : 1.0f;
#pragma unroll
  for (int mi = 0; mi < T::kKvMTiles; ++mi) {
    store_fragment_tile<Element, T::kKvNTiles>(
        dk[mi], params.softmax_scale,
        static_cast<Element*>(params.dk) + params.dk_offset(b, h_kv) + n0 * params.dk_row_stride,
        params.dk_row_stride, kv_n0 + 16 * mi, kv_d0, kv_rows, head_dim, is_aligned, lane);
    store_fragment_tile<Element, T::kKvNTiles>(
        dv[mi], dv_scale, static_cast<Element*>(params.dv) + params.dv_offset(b, h_kv) + n0 * params.dv_row_stride,
        params.dv_row_stride, kv_n0 + 16 * mi, kv_d0, kv_rows, head_dim, is_aligned, lane);
  }
}

// kVariant: see KernelVariant.
// Staged dQ (config dq_atomics = false) needs the sm_90 bulk reductions: for older
// targets its body is not compiled and traps; select.hpp never picks it there.
template <class T, KernelVariant kVariant>
__global__ void __launch_bounds__(T::kThreads, 1)
    dkdv_kernel(const __grid_constant__ BackwardParams params, const Workspace workspace, int num_n_blocks,
                bool is_aligned, bool is_alibi_affine) {
#if defined(__CUDA_ARCH__) && !FLASHATTN_SM90_DEVICE_CODE
  constexpr bool kIsCompiled = T::kDqAtomics;
#else
  constexpr bool kIsCompiled = true;
#endif
  if constexpr (kIsCompiled) {
    dkdv_block<T, kVariant>(params, workspace, num_n_blocks, is_aligned, is_alibi_affine);
  } else {
    __trap();
  }
}

}  // namespace flashattn::cuda::bwd
