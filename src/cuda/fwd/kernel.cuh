// src/cuda/fwd/kernel.cuh — the FA2 forward kernel for sm_80 and newer (mma.sync).
//
// The algorithm of seed 004 (FlashAttention-2), for one CTA = one (query tile,
// head, batch item):
//   Q tile (kBlockM rows) -> shared memory once.
//   for each key block j (reverse order, see below), K_j/V_j streamed through a
//   kStages-deep cp.async ring in shared memory:
//     S   = Q K_j^T                       tensor cores, fp32 accumulators
//     (softcap/ALiBi: S = ScoreRule::log2_score(S, row, col), flashattn/score.hpp)
//     S   = -inf where MaskRule forbids   only on boundary blocks (tile_fully_allowed)
//     m   = max(m, rowmax S * c);  O *= 2^(m_old - m);  l = l * 2^(m_old - m) + rowsum P
//     P   = 2^(S * c - m), c = scale * log2(e)   one FFMA + one ex2 per score
//     (dropout: P = P ∘ Z, after l took the undropped sum; flashattn/dropout.hpp)
//     O  += P V_j                          P never leaves registers
//   O /= l (dropout: O /= (1 - p) too), LSE = (m + log2 l) ln 2   one normalisation at the end
// The running (m, l) per row is online_softmax::State (the shared rule, -inf safe).
//
// Work split: warp w owns query rows [w * 16 * kMTiles, (w + 1) * 16 * kMTiles) of
// the tile, so softmax statistics need only quad shuffles (the 4 lanes holding one
// row of an mma C fragment), never shared memory.
//
// Key blocks are visited from the last to the first: with causal/local masks the
// only blocks that need the element mask are at the ends of the row range, and
// visiting the diagonal block first means the running max is set by real scores
// early (as FA2 does); every other block takes the mask-free path.
//
// Masks beyond MaskRule (attn_mask, a block mask; src/core/mask_tables.hpp): when
// params.device_mask.by_query_tile is present, the key blocks are those of this query
// tile's list (descending, the interval rule folded in) instead of the interval
// range; the cp.async ring loads the same list in the same order. A partial entry
// gets fragment::apply_mask (sequence ends, interval rule, block mask, attn_mask) and
// nothing else; a full one no masking at all. The list-driven loop is its own
// instantiation (kIsListDriven): as a runtime branch, the element pass inlined or even
// called made the interval kernel spill (ptxas: 32 -> 256..712 bytes of stack at d128)
// and run 5-18% (d64) and 15-100% (d128) slower on H100 without any mask.
//
// Variable-length batches: sequence b's rows start at cu_seqlens_q[b] / cu_seqlens_k[b]
// (params' offset helpers). What the kernel assumes and cannot check on the device
// without a host synchronisation (validate.cpp checks it when cu_seqlens are host
// memory): int32 [batch + 1], entry 0 is 0, non-decreasing, every length <=
// max_seqlen_q/k (the grid covers max_seqlen_q rows per sequence: rows past it
// would stay unwritten), last entry <= the packed tensors' rows (else out-of-bounds
// reads). A zero-length query sequence's CTAs exit at once (it has no rows); a
// zero-length key sequence gives its rows output 0 and LSE -inf.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>

#include "flashattn/error.hpp"
#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/core/params.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/common/fragment.cuh"
#include "src/cuda/common/mask_fragment.cuh"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/common/swizzle.cuh"
#include "src/cuda/fwd/tile_config.hpp"
#include "src/cuda/masks/device_mask.hpp"
#include "src/cuda/ptx/cp_async.cuh"
#include "src/cuda/ptx/ldmatrix.cuh"
#include "src/cuda/ptx/math.cuh"
#include "src/cuda/ptx/mma_sync.cuh"

namespace flashattn::cuda::fwd {

// Asynchronously copies rows [0, rows_valid) x columns [0, head_dim) of a (kRows,
// kCols) tile from global memory (row stride in elements) into swizzled shared
// memory; everything outside — rows past the sequence end, the head-dim tail of a
// padded kernel — is zero-filled by cp.async, never read from global memory.
template <int kRows, int kCols, int kThreads, class T>
__device__ __forceinline__ void load_tile_async(T* shared_tile, const T* global_tile, std::int64_t row_stride,
                                                std::int64_t rows_valid, std::int64_t head_dim, int thread) {
  using Tile = SwizzledTile<kRows, kCols>;
  constexpr int kTotalChunks = kRows * Tile::kChunks;
  constexpr int kIterations = (kTotalChunks + kThreads - 1) / kThreads;
  if constexpr (kThreads % Tile::kChunks == 0) {
    // Each thread keeps one chunk column; its rows advance by a fixed step, so the
    // addresses are one base plus multiples of a stride (few live registers).
    constexpr int kRowStep = kThreads / Tile::kChunks;
    const int chunk = thread % Tile::kChunks;
    const int first_row = thread / Tile::kChunks;
    const bool is_column_valid = chunk * kChunkElements < head_dim;
    const T* source = global_tile + first_row * row_stride + chunk * kChunkElements;
    const std::int64_t step = kRowStep * row_stride;
    const std::uint32_t destination = ptx::shared_address(shared_tile + Tile::chunk_offset(first_row, chunk));
#pragma unroll
    for (int iteration = 0; iteration < kIterations; ++iteration) {
      const int row = first_row + iteration * kRowStep;
      if (kTotalChunks % kThreads != 0 && row >= kRows) break;
      const bool is_valid = is_column_valid && row < rows_valid;
      // The swizzle repeats every 8 rows: with such a step the destination is one
      // base plus immediates.
      const std::uint32_t shared_chunk = kRowStep % 8 == 0
                                             ? destination + iteration * kRowStep * kCols * 2
                                             : ptx::shared_address(shared_tile + Tile::chunk_offset(row, chunk));
      // One running pointer (not kIterations precomputed 64-bit addresses).
      ptx::cp_async_16(shared_chunk, is_valid ? source : global_tile, is_valid);
      source += step;
    }
  } else {
#pragma unroll
    for (int iteration = 0; iteration < kIterations; ++iteration) {
      const int index = iteration * kThreads + thread;
      if (kTotalChunks % kThreads != 0 && index >= kTotalChunks) break;
      const int row = index / Tile::kChunks;
      const int chunk = index % Tile::kChunks;
      const bool is_valid = row < rows_valid && chunk * kChunkElements < head_dim;
      const T* source = is_valid ? global_tile + row * row_stride + chunk * kChunkElements : global_tile;
      ptx::cp_async_16(ptx::shared_address(shared_tile + Tile::chunk_offset(row, chunk)), source, is_valid);
    }
  }
}

// The tile shape arrives as plain ints (nvcc's host stubs cannot spell class-type
// template arguments); kConfig rebuilds the TileConfig.
template <class T, int kHeadDimArg, int kBlockMArg, int kBlockNArg, int kWarpsArg, int kStagesArg, int kMinBlocksArg,
          bool kIsListDriven>
__global__ void __launch_bounds__(kWarpsArg * 32, kMinBlocksArg)
    forward_kernel(const __grid_constant__ AttentionParams params) {
  constexpr TileConfig kConfig{kHeadDimArg, kBlockMArg, kBlockNArg, kWarpsArg, kStagesArg, kMinBlocksArg};
  constexpr int kHeadDim = kConfig.kernel_head_dim;
  constexpr int kBlockM = kConfig.block_m;
  constexpr int kBlockN = kConfig.block_n;
  constexpr int kStages = kConfig.stages;
  constexpr int kThreads = kConfig.threads();
  constexpr int kMTiles = kConfig.m_tiles_per_warp();  // m16 tiles per warp
  constexpr int kNTiles = kBlockN / 8;                  // n8 tiles of S per row block
  constexpr int kDTiles = kHeadDim / 8;                 // n8 tiles of O
  constexpr ptx::MmaInput kInput = Numeric<T>::kMmaInput;
  static_assert(kBlockM == 16 * kConfig.warps * kMTiles, "block_m must be 16 * warps * m_tiles_per_warp");
  static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0, "mma k-steps are 16 wide");
  static_assert(kStages >= 2, "the pipeline needs at least two stages");
  using QTile = SwizzledTile<kBlockM, kHeadDim>;   // (kBlockM, kHeadDim)
  using KVTile = SwizzledTile<kBlockN, kHeadDim>;  // (kBlockN, kHeadDim)

  // Grid: one flat x dimension (never the 65535 limit of y/z), query tile fastest so
  // the CTAs of one head run together and share K/V in L2; the last query tiles
  // (the most keys under a causal mask) are launched first.
  const std::int64_t num_m_blocks = (params.seqlen_q + kBlockM - 1) / kBlockM;
  std::int64_t linear = blockIdx.x;
  const std::int64_t m_block = num_m_blocks - 1 - linear % num_m_blocks;
  linear /= num_m_blocks;
  const std::int64_t head = linear % params.heads_q;
  const std::int64_t batch = linear / params.heads_q;

  const std::int64_t seqlen_q = params.seqlen_q_of(batch);
  const std::int64_t m0 = m_block * kBlockM;
  if (m0 >= seqlen_q) return;  // varlen: this sequence is shorter than the longest; no rows here
  const std::int64_t seqlen_k = params.seqlen_k_of(batch);
  const std::int64_t row_end = m0 + kBlockM < seqlen_q ? m0 + kBlockM : seqlen_q;
  const MaskRule mask = params.mask_of(batch);
  const MaskRule::ColumnRange columns = mask.columns_of_rows(m0, row_end);
  const std::int64_t n_block_begin = columns.begin / kBlockN;
  const std::int64_t n_block_end = (columns.end + kBlockN - 1) / kBlockN;
  // List-driven (masks beyond MaskRule; launch_forward checks the lists are present)
  // or the interval range [n_block_begin, n_block_end).
  const TileLists& tile_lists = params.device_mask.by_query_tile;
  const std::int64_t tile_list = kIsListDriven ? tile_lists.list(batch, head, m_block) : 0;
  const int num_n_blocks = kIsListDriven ? tile_lists.count(tile_list)
                           : columns.end > columns.begin ? static_cast<int>(n_block_end - n_block_begin)
                                                         : 0;
  // First key of the `iteration`-th visited block (a list entry is an L2-resident load).
  auto key_block_start = [&](int iteration) -> std::int64_t {
    if constexpr (kIsListDriven) return std::int64_t{tile_lists.entry(tile_list, iteration).tile} * kBlockN;
    return (n_block_end - 1 - iteration) * kBlockN;
  };

  const std::int64_t head_kv = head / params.group_size;  // GQA/MQA: K/V shared, never copied
  const T* q = static_cast<const T*>(params.q) + params.q_offset(batch, head) + m0 * params.q_row_stride;
  const T* k = static_cast<const T*>(params.k) + params.k_offset(batch, head_kv);
  const T* v = static_cast<const T*>(params.v) + params.v_offset(batch, head_kv);

  extern __shared__ __align__(128) unsigned char shared_storage[];
  T* shared_q = reinterpret_cast<T*>(shared_storage);  // (kBlockM, kHeadDim)
  T* shared_k = shared_q + QTile::kElements;           // kStages x (kBlockN, kHeadDim)
  T* shared_v = shared_k + kStages * KVTile::kElements;  // kStages x (kBlockN, kHeadDim)

  const int thread = threadIdx.x;
  const int lane = thread % 32;
  const int group = lane / 4;      // mma fragment row within an 8-row half
  const int quad_lane = lane % 4;  // mma fragment column pair
  const int warp_row0 = (thread / 32) * 16 * kMTiles;

  auto load_kv_block = [&](int iteration, int stage) {
    const std::int64_t n0 = key_block_start(iteration);
    const std::int64_t rows_valid = seqlen_k - n0;
    load_tile_async<kBlockN, kHeadDim, kThreads>(shared_k + stage * KVTile::kElements, k + n0 * params.k_row_stride,
                                                 params.k_row_stride, rows_valid, params.head_dim, thread);
    load_tile_async<kBlockN, kHeadDim, kThreads>(shared_v + stage * KVTile::kElements, v + n0 * params.v_row_stride,
                                                 params.v_row_stride, rows_valid, params.head_dim, thread);
  };

  // Prologue: Q joins the first group; stages 0 .. kStages-2 are filled ahead.
  load_tile_async<kBlockM, kHeadDim, kThreads>(shared_q, q, params.q_row_stride, row_end - m0, params.head_dim,
                                               thread);
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < num_n_blocks) load_kv_block(stage, stage);
    ptx::cp_async_commit_group();
  }

  // Per-lane ldmatrix row addresses (byte addresses in shared memory); the unrolled
  // loops add compile-time offsets (see SwizzledTile::xor_chunk_offset).
  //  Q (A operand): lanes 0-15 -> rows 0-15 at chunk 2kk, lanes 16-31 -> rows 0-15 at 2kk+1.
  const int q_row = warp_row0 + lane % 16;
  const int q_lane_xor = QTile::row_swizzle(q_row) ^ (lane / 16);
  const std::uint32_t q_fragment_address = ptx::shared_address(shared_q + q_row * kHeadDim);
  //  K (B operand of S): matrices keys 0-7 | chunk 2kk, keys 0-7 | 2kk+1, keys 8-15 | 2kk, keys 8-15 | 2kk+1.
  const int k_row = (lane & 7) + ((lane >> 4) << 3);
  const int k_lane_xor = KVTile::row_swizzle(k_row) ^ ((lane >> 3) & 1);
  const std::uint32_t k_fragment_address = ptx::shared_address(shared_k + k_row * kHeadDim);
  //  V (B operand of O, transposed): keys 0-7 | chunk 2dj, keys 8-15 | 2dj, keys 0-7 | 2dj+1, keys 8-15 | 2dj+1.
  const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3);
  const int v_lane_xor = KVTile::row_swizzle(v_row) ^ (lane >> 4);
  const std::uint32_t v_fragment_address = ptx::shared_address(shared_v + v_row * kHeadDim);
  static_assert(QTile::kSwizzleWidth >= 2 && KVTile::kSwizzleWidth >= 2, "lane chunk bit must stay inside the XOR");
  static_assert((16 / QTile::kRowsPerStep) % QTile::kSwizzleWidth == 0, "row_swizzle must repeat every 16 rows");

  // Scores stay raw q.k until the exponent: 2^(s * exp_scale - m) is one FFMA + one
  // MUFU per element (the scale is > 0, so the max commutes with it). Softcap and
  // ALiBi do not commute with the max: there the score rule maps the scores to log2
  // units first. Both features are runtime-uniform branches: no extra instantiations
  // (the backward needs a plain one; here ptxas shows no systematic cost, TUNING.md).
  const bool is_positive_scale = params.score_is_positive_scale();
  const float exp_scale = is_positive_scale ? params.softmax_scale_log2 : 1.0f;
  const bool has_dropout = params.has_dropout();

  float o[kMTiles][kDTiles][4] = {};                // (16 * kMTiles, kHeadDim) per warp, fp32
  online_softmax::State<float> row_state[kMTiles][2];  // rows group and group + 8 of each m16 tile;
                                                       // l is this thread's partial sum until the end

  for (int iteration = 0; iteration < num_n_blocks; ++iteration) {
    // Block `iteration` has landed (at most kStages-2 younger groups in flight), and
    // every warp has finished the previous iteration, so its stage may be refilled.
    ptx::cp_async_wait_group<kStages - 2>();
    __syncthreads();
    if (iteration + kStages - 1 < num_n_blocks)
      load_kv_block(iteration + kStages - 1, (iteration + kStages - 1) % kStages);
    ptx::cp_async_commit_group();

    const int stage = iteration % kStages;
    const std::uint32_t stage_k_address = k_fragment_address + stage * KVTile::kBytes;  // (kBlockN, kHeadDim)
    const std::uint32_t stage_v_address = v_fragment_address + stage * KVTile::kBytes;  // (kBlockN, kHeadDim)
    const std::int64_t n0 = key_block_start(iteration);

    // S = Q K^T: (16 * kMTiles, kBlockN) per warp.
    float s[kMTiles][kNTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      std::uint32_t a[kMTiles][4];
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
        ptx::ldmatrix_x4(a[mi][0], a[mi][1], a[mi][2], a[mi][3],
                         q_fragment_address + 2 * (mi * 16 * kHeadDim + QTile::xor_chunk_offset(2 * kk, q_lane_xor)));
      }
#pragma unroll
      for (int nj = 0; nj < kNTiles / 2; ++nj) {
        std::uint32_t b_even[2], b_odd[2];
        ptx::ldmatrix_x4(b_even[0], b_even[1], b_odd[0], b_odd[1],
                         stage_k_address + 2 * (nj * 16 * kHeadDim + KVTile::xor_chunk_offset(2 * kk, k_lane_xor)));
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          ptx::mma_m16n8k16<kInput>(s[mi][2 * nj], a[mi], b_even);
          ptx::mma_m16n8k16<kInput>(s[mi][2 * nj + 1], a[mi], b_odd);
        }
      }
    }

    if (!is_positive_scale) {
      // Built per block, not per CTA: nothing of it stays live across the loop (the
      // ALiBi slope is one cached load).
      const ScoreRule score_rule = params.score_of(batch, head, mask);
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
        fragment::apply_score_rule<kNTiles>(fragment::flat(s[mi]), score_rule, m0 + warp_row0 + mi * 16 + group, n0);
    }

    if constexpr (kIsListDriven) {
      // The list says whether this block needs the element pass (it includes the end of
      // the keys). Bias units: log2 scores after the score rule, else raw q.k, which the
      // exponent scales by softmax_scale * log2(e). Called, not inlined: the pass only
      // runs on partial tiles, and inlined it makes the whole loop spill. With a tile
      // code (mask_tables.hpp) the call takes the fast pass (spans and bits).
      if (tile_lists.entry(tile_list, iteration).partial) {
        const std::int32_t code = tile_lists.code(tile_list, iteration);
        const float bias_factor = is_positive_scale ? 1.0f / params.softmax_scale : static_cast<float>(online_softmax::kLog2e);
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
          fragment::apply_mask_outlined<kNTiles>(fragment::flat(s[mi]), params, mask, batch, head,
                                                 m0 + warp_row0 + mi * 16 + group, n0, bias_factor, code);
      }
    } else if (n0 + kBlockN > seqlen_k || !mask.tile_fully_allowed(m0, row_end, n0, n0 + kBlockN)) {
      // Element mask only where the block crosses a mask edge or the end of the keys.
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const std::int64_t row = m0 + warp_row0 + mi * 16 + group + 8 * half;
          // Allowed columns of this row, relative to n0 and clamped to the block: 32-bit
          // from here on (fewer registers, one compare per element).
          const int begin = static_cast<int>(MaskRule::clamp(mask.col_begin(row) - n0, 0, kBlockN));
          const int end = static_cast<int>(MaskRule::clamp(mask.col_end(row) - n0, 0, kBlockN));
#pragma unroll
          for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int col = ni * 8 + 2 * quad_lane + e;
              if (col < begin || col >= end) s[mi][ni][2 * half + e] = online_softmax::negative_infinity<float>();
            }
        }
    }

    // Online softmax per row: raise the max, rescale O and l, exponentiate in place.
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float block_max = online_softmax::negative_infinity<float>();
#pragma unroll
        for (int ni = 0; ni < kNTiles; ++ni)
          block_max = fmaxf(block_max, fmaxf(s[mi][ni][2 * half], s[mi][ni][2 * half + 1]));
        // The 4 lanes of a quad hold the row's columns: reduce across them.
        block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
        block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
        online_softmax::State<float>& state = row_state[mi][half];
        const float factor = state.raise_max(block_max * exp_scale);  // -inf stays -inf
        const float base = state.base();
        float block_sum = 0.0f;
#pragma unroll
        for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = ptx::exp2_approx_ftz(fmaf(s[mi][ni][2 * half + e], exp_scale, -base));
            s[mi][ni][2 * half + e] = p;
            block_sum += p;
          }
        state.add(block_sum);
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o[mi][dt][2 * half] *= factor;
          o[mi][dt][2 * half + 1] *= factor;
        }
      }

    // Dropout on P: after l took the sum of the undropped P (the softmax normaliser),
    // before P is packed for P V; 1/(1 - p) is folded into the final normalisation.
    if (has_dropout) {
      const DropoutRule dropout = params.dropout();  // per block, as the score rule
      const std::uint32_t batch_head = params.dropout_head(batch, head);
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
        fragment::apply_dropout<kNTiles, kBlockN % 32 == 0>(fragment::flat(s[mi]), dropout, batch_head,
                                                            m0 + warp_row0 + mi * 16 + group, n0);
    }

    // O += P V: the C fragments of P (two n8 tiles) are the A fragment of a k16 step;
    // packed to 16 bits right away, which also halves P's registers.
    std::uint32_t p[kMTiles][kBlockN / 16][4];  // (16 * kMTiles, kBlockN) per warp, A fragments
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int kp = 0; kp < kBlockN / 16; ++kp) {
        p[mi][kp][0] = pack_pair<T>(s[mi][2 * kp][0], s[mi][2 * kp][1]);
        p[mi][kp][1] = pack_pair<T>(s[mi][2 * kp][2], s[mi][2 * kp][3]);
        p[mi][kp][2] = pack_pair<T>(s[mi][2 * kp + 1][0], s[mi][2 * kp + 1][1]);
        p[mi][kp][3] = pack_pair<T>(s[mi][2 * kp + 1][2], s[mi][2 * kp + 1][3]);
      }
#pragma unroll
    for (int kp = 0; kp < kBlockN / 16; ++kp) {
#pragma unroll
      for (int dj = 0; dj < kDTiles / 2; ++dj) {
        std::uint32_t b_even[2], b_odd[2];
        ptx::ldmatrix_x4_trans(b_even[0], b_even[1], b_odd[0], b_odd[1],
                               stage_v_address + 2 * (kp * 16 * kHeadDim + KVTile::xor_chunk_offset(2 * dj, v_lane_xor)));
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          ptx::mma_m16n8k16<kInput>(o[mi][2 * dj], p[mi][kp], b_even);
          ptx::mma_m16n8k16<kInput>(o[mi][2 * dj + 1], p[mi][kp], b_odd);
        }
      }
    }
  }

  // Epilogue: complete each row's sum across its quad, normalise once, write LSE.
  ptx::cp_async_wait_group<0>();
  __syncthreads();  // every warp is done with shared memory: the Q tile becomes the O staging tile
  float* maybe_lse = params.maybe_lse;
  const float dropout_scale = has_dropout ? params.dropout_inverse_keep : 1.0f;  // 1 / (1 - p)
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      online_softmax::State<float> state = row_state[mi][half];
      state.l += __shfl_xor_sync(0xffffffffu, state.l, 1);
      state.l += __shfl_xor_sync(0xffffffffu, state.l, 2);
      const float output_scale = state.inverse_sum() * dropout_scale;  // O only: the LSE is that of P
      const int tile_row = warp_row0 + mi * 16 + group + 8 * half;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const std::uint32_t packed =
            pack_pair<T>(o[mi][dt][2 * half] * output_scale, o[mi][dt][2 * half + 1] * output_scale);
        *reinterpret_cast<std::uint32_t*>(shared_q + QTile::offset(tile_row, dt * 8 + 2 * quad_lane)) = packed;
      }
      if (maybe_lse != nullptr && quad_lane == 0 && m0 + tile_row < seqlen_q)
        maybe_lse[params.lse_offset(batch, head) + (m0 + tile_row) * params.lse_row_stride] = state.lse();
    }
  __syncthreads();

  // Coalesced 16-byte stores of the valid rows and head-dim columns.
  T* out = static_cast<T*>(params.out) + params.out_offset(batch, head) + m0 * params.out_row_stride;
  constexpr int kTotalChunks = kBlockM * QTile::kChunks;
#pragma unroll
  for (int index = thread; index < kTotalChunks; index += kThreads) {
    const int row = index / QTile::kChunks;
    const int chunk = index % QTile::kChunks;
    if (row < row_end - m0 && chunk * kChunkElements < params.head_dim)
      *reinterpret_cast<uint4*>(out + row * params.out_row_stride + chunk * kChunkElements) =
          *reinterpret_cast<const uint4*>(shared_q + QTile::chunk_offset(row, chunk));
  }
}

// One launch of forward_kernel (the interval or the list-driven instantiation).
template <class T, TileConfig kConfig, bool kIsListDriven>
void launch_forward_kernel(const AttentionParams& params, std::int64_t num_ctas, cudaStream_t stream) {
  constexpr int kSharedBytes = kConfig.shared_bytes();
  auto* kernel = forward_kernel<T, kConfig.kernel_head_dim, kConfig.block_m, kConfig.block_n, kConfig.warps,
                                kConfig.stages, kConfig.min_blocks_per_sm, kIsListDriven>;
  // Above 48 KB of dynamic shared memory a kernel must opt in, once per device.
  static std::atomic<std::uint64_t> opted_in_devices{0};
  int device = 0;
  FLASHATTN_CUDA_CHECK(cudaGetDevice(&device));
  const std::uint64_t device_bit = device < 64 ? (std::uint64_t{1} << device) : 0;
  if (device_bit == 0 || (opted_in_devices.load(std::memory_order_acquire) & device_bit) == 0) {
    FLASHATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
    opted_in_devices.fetch_or(device_bit, std::memory_order_release);
  }
  kernel<<<static_cast<unsigned>(num_ctas), kConfig.threads(), kSharedBytes, stream>>>(params);
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

// Launches forward_kernel with kConfig's tile shape for already validated params on `stream`.
// No synchronisation; launch errors throw CudaError. No allocation without masks; with
// masks beyond MaskRule, first builds this kernel's tile lists on `stream` (src/cuda/masks:
// stream-ordered scratch, freed on the stream after the launch).
template <class T, TileConfig kConfig>
void launch_forward(const AttentionParams& params, cudaStream_t stream) {
  const std::int64_t num_m_blocks = (params.seqlen_q + kConfig.block_m - 1) / kConfig.block_m;
  const std::int64_t num_ctas = num_m_blocks * params.heads_q * params.batch;
  if (num_ctas == 0) return;
  if (num_ctas > INT_MAX)
    throw NotSupported("flashattn: q: too many query tiles x heads x batch for one launch (" +
                       std::to_string(num_ctas) + " > 2^31 - 1)");
  const masks::MaskTables tables =
      masks::prepare(params, masks::KernelTiles{kConfig.block_m, kConfig.block_n, /*by_query_tile=*/true, false}, stream);
  AttentionParams launch_params = params;
  tables.bind(launch_params);
  if (launch_params.device_mask.by_query_tile.present()) return launch_forward_kernel<T, kConfig, true>(launch_params, num_ctas, stream);
  launch_forward_kernel<T, kConfig, false>(launch_params, num_ctas, stream);
}

// What a generated translation unit instantiates (see src/cuda/generate_instantiations.py).
template <class T, int kHeadDim>
void run_forward(const AttentionParams& params, cudaStream_t stream) {
  static_assert(tile_config_for(kHeadDim).kernel_head_dim == kHeadDim, "no tile config for this head dim");
  launch_forward<T, tile_config_for(kHeadDim)>(params, stream);
}

}  // namespace flashattn::cuda::fwd
