// src/cuda/hopper_fp8/kernel.cuh — the FP8 (e4m3) forward kernel for Hopper (sm_90a):
// TMA loads, FP8 wgmma (m64nNk32), warp-specialised producer/consumer warpgroups.
//
// The algorithm and schedule are those of the bf16 kernel (src/cuda/hopper/kernel.cuh:
// same visit order, online_softmax::State, MaskRule, ScoreRule hooks, intra-warpgroup
// overlap of S_j = Q K_j^T with O += P_(j-1) V_(j-1)); what FP8 changes:
//
// 1. Both wgmma operands must be K-major (8-bit types have no transpose bit). Q and K
//    are (rows, d) with d contiguous: K-major for S = Q K^T as they arrive. For O += P V
//    the B operand is V^T (N = d, K = keys) and must have keys contiguous, but V arrives
//    (keys, d). So the producer warpgroup transposes every V tile in shared memory,
//    in one of two schedules (Fp8Schedule, tile_config.hpp; a template parameter, both
//    built, chosen per call):
//    transpose_copy
//      thread 0 of warpgroup 0  TMA: Q, then K_j and V_j into S-deep rings, up to S
//                               blocks ahead of the transpose, blocking on each stage;
//      all 128 threads          wait for V_j and for Vt_j's stage, write Vt_j (d, 128
//                               keys) = V_j^T into the Vt ring in the 128-byte swizzle,
//                               fence the writes to the async proxy (wgmma reads through
//                               it) and arrive on Vt_j's "full" barrier and V_j's "empty"
//                               barrier (one arrival per thread).
//    transpose_in_place
//      thread 0 of warpgroup 0  TMA: Q, then whichever K_j or V_j has a free stage (K
//                               ring kKStages deep, V ring kVStages), checked between
//                               transposes and while waiting for the next V;
//      all 128 threads          wait for V_j, write Vt_j over V_j in its stage (each warp
//                               a set of blocks closed under the transposition: all its
//                               loads before its stores), fence, arrive on Vt_j's "full"
//                               barrier. The consumers' release of Vt_j frees the stage
//                               for V_(j + kVStages): no Vt stage to wait for, and the
//                               ring is as deep as the V and Vt rings together (d256:
//                               4 stages instead of 2 + 2).
//    in_place_overlap runs transpose_in_place's producer; its consumers' loop is rotated
//    (below, "Rotated loop") so that the softmax really overlaps the PV GEMM.
//    The consumer warpgroups never touch V_j, only Vt_j. The transpose moves 16-bit
//    pairs of head-dim bytes with ldmatrix.trans, separates the bytes of two keys with
//    byte permutes, and writes rows of Vt with stmatrix (the producer below; FA3 does
//    the same with LDSM/STSM, into a ring of its own).
//
// 2. P (fp32 accumulator layout) must become the e4m3 A fragment of the k32 steps,
//    whose layout differs (wgmma.cuh; PTX ISA "Register Fragments", CuTe
//    GMMA::ALayout_64x32). Per thread (group = lane / 4, q = lane % 4), for one row:
//      accumulator, key block kp of 32 keys: n8 tiles j = 4kp..4kp+3, each holding
//        keys 8j' + 2q + {0, 1} (j' = j - 4kp)  →  keys 32kp + {2q, 2q+1, 8+2q, 9+2q,
//        16+2q, 17+2q, 24+2q, 25+2q}: 8 values;
//      A fragment of k32 step kp: a[0] (a[1] for row + 8) = k 4q + {0..3}, a[2] (a[3])
//        = k 16 + 4q + {0..3}: 8 values.
//    Same count, different k. Rather than exchanging values between lanes, we let A's
//    k index mean a permuted key: the thread packs its 8 values in order, so A position
//      k' = 16 h + 4 q + t   (h in {0,1}, q in 0..3, t in 0..3)
//    holds key
//      pi(k') = 16 h + 8 (t / 2) + 2 q + (t % 2)
//    (h = which pair of n8 tiles, t / 2 = which tile of the pair, t % 2 = the column
//    within the lane's pair; pi is a bijection of 0..31: every (h, t/2, q, t%2) once).
//    P V sums over k, so it is unchanged when B's row k' holds V's key pi(k') too: the
//    transpose writes key 32kp + pi(k') of V to byte 32kp + k' of each Vt row. The
//    register packing is then 4 conversions per register and no shuffles; the
//    accumulator keeps its usual layout, so the score/mask hooks (fragment.cuh) apply
//    unchanged. (FA3 reorders P's registers with byte permutes and shuffles instead and
//    keeps V's key order; our transpose's byte permutes produce pi's order for free.)
//
// 3. Scales (as FA3): scores = softmax_scale · q_descale · k_descale · q·k (the descales
//    of the tile's (batch, kv head) join the exponent scale, or the ScoreRule's scale
//    and softcap input scale); P is quantised as P' = 2^8 · P = exp2(s - m + 8) in
//    [0, 256] (e4m3 saturates at 448), which keeps probabilities down to 2^-17 (the
//    smallest e4m3 subnormal over 2^8) instead of flushing those below 2^-9; l sums the
//    fp32 P' (before quantisation), so 2^8 cancels in O = v_descale · (P' V) / l and the
//    LSE is ln l' + m ln 2 - 8 ln 2.
//
// Output: out in bfloat16 or float16 (params.dtype, a uniform runtime branch in the
// epilogue: one kernel per head dim serves both), stored straight from the
// accumulator registers (the Q tile in shared memory is 1 byte per element: too small
// to stage a 2-byte O tile through). One CTA per tile.
//
// Shared-memory tiles: Q, K, V as panels of P = min(d, 128) bytes per row with the P-byte
// swizzle (TMA and wgmma: 16-byte chunk c of row r at c ^ ((r * P / 128) % (P / 16)),
// i.e. byte address bits 4.. XOR bits 7..; swizzle_offset below); Vt as panels of
// 128-byte rows, one per 128 keys (block_n 128: one; the wide overlaps, d128 at 192 or 224
// keys and d64 at 160: two, each written in place over the part of the V stage that holds
// its keys: 16 KB at d128, 8 KB at d64).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cuda/ptx>
#include <string>
#include <type_traits>  // std::integral_constant

#include "flashattn/error.hpp"
#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "flashattn/score.hpp"
#include "src/core/params.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/common/named_barriers.hpp"
#include "src/cuda/common/fragment.cuh"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/hopper_fp8/launch.hpp"
#include "src/cuda/hopper_fp8/tile_config.hpp"
#include "src/cuda/ptx/bulk_reduce.cuh"  // fence_proxy_async_shared
#include "src/cuda/ptx/ldmatrix.cuh"
#include "src/cuda/ptx/math.cuh"
#include "src/cuda/ptx/mbarrier.cuh"
#include "src/cuda/ptx/named_barrier.cuh"
#include "src/cuda/ptx/stmatrix.cuh"
#include "src/cuda/ptx/warpgroup.cuh"
#include "src/cuda/ptx/wgmma.cuh"

namespace flashattn::cuda::hopper_fp8 {

// In-place schedule: how long the loader thread sleeps in one poll for V to land before
// it checks for free K/V stages again (performance only: a K stage frees about once per
// consumer round, ~1-2 us at d128/d256, and its copy has a round or more of slack).
inline constexpr std::uint32_t kLoaderPollNanoseconds = 200;
// P' = 2^kProbabilityLog2Offset · P: the exponent offset of the quantised probabilities.
inline constexpr int kProbabilityLog2Offset = 8;
// Every tile starts 1024-byte aligned: the largest swizzle atom (8 rows x 128 bytes).
inline constexpr int kTileAlignment = 1024;

// Byte offset, inside a panel of kRowBytes-byte rows (64 or 128) that starts at a multiple
// of 8 * kRowBytes, of the byte at unswizzled offset `offset` (row * kRowBytes + column):
// the TMA/wgmma swizzle XORs byte-address bits 4.. (the 16-byte chunk) with bits 7..
// (the row's position in its 8-row, 128-bytes-per-row period): 3 bits for 128-byte rows
// (chunk ^ row % 8), 2 bits for 64-byte rows (chunk ^ (row / 2) % 4).
template <int kRowBytes>
__device__ __forceinline__ int swizzle_offset(int offset) {
  static_assert(kRowBytes == 64 || kRowBytes == 128, "64- or 128-byte swizzle");
  return offset ^ ((offset >> 3) & ((kRowBytes / 16 - 1) << 4));
}

// Four floats as four e4m3 (round to nearest, saturating at ±448) in one register, `b0`
// in byte 0. cvt.rn.satfinite.e4m3x2.f32 d, a, b puts a in the upper byte of d and b in
// the lower (PTX ISA "cvt": for f8x2 destinations a goes to the upper half).
__device__ __forceinline__ std::uint32_t pack_e4m3x4(float b0, float b1, float b2, float b3) {
  std::uint32_t packed;
  asm("{\n"
      ".reg .b16 low, high;\n"
      "cvt.rn.satfinite.e4m3x2.f32 low, %2, %1;\n"
      "cvt.rn.satfinite.e4m3x2.f32 high, %4, %3;\n"
      "mov.b32 %0, {low, high};\n"
      "}\n"
      : "=r"(packed)
      : "f"(b0), "f"(b1), "f"(b2), "f"(b3));
  return packed;
}

// The TMA copy of a (kRows, kPanels x kPanelBytes) e4m3 tile of one head into panels of
// kRows rows, completing on `barrier` (whose expected bytes the caller has set).
template <int kPanels, int kPanelBytes, int kRows>
__device__ __forceinline__ void load_byte_panels(unsigned char* destination, const CUtensorMap* map, std::int32_t row,
                                                 std::int32_t head, std::int32_t batch_coordinate,
                                                 std::uint64_t* barrier) {
#if FLASHATTN_HOPPER_DEVICE_CODE
#pragma unroll
  for (int panel = 0; panel < kPanels; ++panel) {
    const std::int32_t coordinates[4] = {panel * kPanelBytes, row, head, batch_coordinate};
    ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global,
                                      destination + panel * kRows * kPanelBytes, map, coordinates, barrier);
  }
#endif
}

// The in-place V transpose (kernel below, producer): per 128-byte panel, a square of 4 x 4
// blocks of 32 keys x 32 head-dim bytes, V block (a, b) going where block (b, a) was.
// Each of the 4 transposing warps takes two items, each item two blocks (a1, b1),
// (a2, b2) whose images (b1, a1), (b2, a2) are the same two blocks: a diagonal pair or
// a block and its mirror. Packed one byte per item, a1 | b1 << 2 | a2 << 4 | b2 << 6,
// item k of warp w in byte 2w + k.
inline constexpr int kInPlaceItemsPerPanel = 2;
struct InPlaceItem {
  int a1, b1, a2, b2;
};
inline constexpr InPlaceItem kInPlaceItems[4][kInPlaceItemsPerPanel] = {
    {{0, 0, 1, 1}, {0, 1, 1, 0}},
    {{2, 2, 3, 3}, {2, 3, 3, 2}},
    {{0, 2, 2, 0}, {1, 3, 3, 1}},
    {{0, 3, 3, 0}, {1, 2, 2, 1}},
};
// Whether the items cover each of the 16 blocks once and each item is closed.
constexpr bool in_place_items_are_valid() {
  int seen[4][4] = {};
  for (const auto& warp_items : kInPlaceItems)
    for (const InPlaceItem& item : warp_items) {
      const bool is_closed = (item.a1 == item.b1 && item.a2 == item.b2) || (item.a1 == item.b2 && item.b1 == item.a2);
      if (!is_closed) return false;
      ++seen[item.a1][item.b1];
      ++seen[item.a2][item.b2];
    }
  for (const auto& row : seen)
    for (int count : row)
      if (count != 1) return false;
  return true;
}
static_assert(in_place_items_are_valid(), "in-place items: every block once, each item closed under transposition");
constexpr std::uint64_t pack_in_place_items() {
  std::uint64_t codes = 0;
  for (int warp = 0; warp < 4; ++warp)
    for (int k = 0; k < kInPlaceItemsPerPanel; ++k) {
      const InPlaceItem& item = kInPlaceItems[warp][k];
      const std::uint64_t code = item.a1 | item.b1 << 2 | item.a2 << 4 | item.b2 << 6;
      codes |= code << (8 * (kInPlaceItemsPerPanel * warp + k));
    }
  return codes;
}
inline constexpr std::uint64_t kInPlaceItemCodes = pack_in_place_items();

template <int kHeadDimArg, Fp8Schedule kScheduleArg>
__global__ void __launch_bounds__(fp8_tile_config(kHeadDimArg, kScheduleArg).threads(), 1)
    forward_kernel_fp8_sm90(const __grid_constant__ Fp8ForwardParams params) {
#if FLASHATTN_HOPPER_DEVICE_CODE
  constexpr Fp8TileConfig kConfig = fp8_tile_config(kHeadDimArg, kScheduleArg);
  static_assert(kConfig.schedule == kScheduleArg, "instantiate the schedule that runs (kernel_schedule)");
  constexpr int kHeadDim = kConfig.kernel_head_dim;
  constexpr int kBlockM = kConfig.block_m;
  constexpr bool kIsInPlace = kConfig.is_in_place();
  constexpr int kKStages = kConfig.k_stages;    // K ring
  constexpr int kVStages = kConfig.v_stages;    // V ring (TMA)
  constexpr int kVtStages = kConfig.vt_stages;  // Vt ring (in place: the V ring itself)
  constexpr int kPanelBytes = kConfig.panel_bytes();
  constexpr int kPanels = kConfig.panels();
  constexpr int kBlockN = kConfig.block_n;
  constexpr int kQBytes = kConfig.q_bytes();
  constexpr int kKBytes = kConfig.k_tile_bytes();        // a K stage: (kBlockN, kHeadDim)
  constexpr int kVBytes = kConfig.v_tile_bytes();        // the TMA's V tile (kBlockN, kHeadDim)
  constexpr int kVStageBytes = kConfig.v_stage_bytes();  // a V stage (in place: also its Vt)
  constexpr int kVtBytes = kConfig.vt_tile_bytes();      // Vt (kHeadDim, kBlockN) in whole panels
  constexpr int kVtRowBytes = hopper::kSwizzleRowBytes;  // a Vt panel's rows: 128 keys per head-dim index
  constexpr int kVtPanels = kConfig.vt_panels();
  constexpr int kVtPanelBytes = kConfig.vt_panel_bytes();
  // The in-place transpose's 128 x 128-byte squares (d128, d256): V's head-dim panel p
  // holds Vt rows 128 p.. (d256), V's keys 128 P.. hold Vt panel P (the wide d128 tiles);
  // either way square i is the 16 KB at 16384 i, in V's and in Vt's layout. At d64 V's keys
  // 128 P.. (8 KB, 64-byte rows) hold Vt panel P (8 KB, 128-byte rows). In the wide tiles
  // the last panel's keys past block_n are none of this block's (stale bytes of the stage,
  // or never written): their images are Vt bytes past block_n, which no k32 step reads.
  constexpr int kSquares = kPanels * kVtPanels;
  constexpr int kConsumerWarpgroups = kConfig.consumer_warpgroups();
  static_assert(kBlockM % ptx::kWarpgroupRows == 0 && kConsumerWarpgroups >= 1 &&
                    kConsumerWarpgroups <= kMaxConsumerWarpgroups,
                "each consumer warpgroup owns 64 query rows");
  static_assert(kConfig.fits_register_file(),
                "setmaxnreg: the warpgroups' registers exceed those the CTA is launched with");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "FP8 kernel head dims: 64, 128, 256");
  static_assert(!kIsInPlace || kVtStages == kVStages, "in place, Vt_j lives in V_j's stage");
  static_assert(kBlockN % 32 == 0 && kBlockN <= 256, "key tiles: whole k32 steps of P V, TMA boxes of <= 256 rows");
  static_assert(kVtPanels == 1 || (kHeadDim <= 128 && kConfig.has_rotated_loop()),
                "Vt over several panels: d64/d128 (one V panel, split along the keys), the rotated loop's transpose");
  static_assert(kQBytes % kTileAlignment == 0 && kKBytes % kTileAlignment == 0 && kVStageBytes % kTileAlignment == 0 &&
                    kVtPanelBytes % kTileAlignment == 0 && (kBlockM * kPanelBytes) % kTileAlignment == 0 &&
                    (kBlockN * kPanelBytes) % kTileAlignment == 0,
                "every tile and panel starts at a swizzle atom");
  static_assert(kConfig.shared_bytes() <= kMaxSharedBytes, "tiles exceed 227 KB of shared memory");

  const AttentionParams& attention = params.attention;
  // Tiles: query tile fastest, the last query tiles (the most keys under a causal mask)
  // first, as the bf16 kernel. One tile per CTA.
  const std::int64_t num_m_blocks = (attention.seqlen_q + kBlockM - 1) / kBlockM;
  struct Tile {
    std::int64_t batch, head, m0, row_end, seqlen_q, seqlen_k, n_block_end;
    int num_n_blocks;  // key blocks visited, from n_block_end - 1 down
    MaskRule mask;
  };
  Tile tile{};
  {
    std::int64_t linear = blockIdx.x;
    const std::int64_t m_block = num_m_blocks - 1 - linear % num_m_blocks;
    linear /= num_m_blocks;
    tile.head = linear % attention.heads_q;
    tile.batch = linear / attention.heads_q;
    tile.seqlen_q = attention.seqlen_q_of(tile.batch);
    tile.m0 = m_block * kBlockM;
    // A tile past its (varlen) sequence's end has no rows: every role skips it.
    if (tile.m0 >= tile.seqlen_q) return;
    tile.seqlen_k = attention.seqlen_k_of(tile.batch);
    tile.row_end = tile.m0 + kBlockM < tile.seqlen_q ? tile.m0 + kBlockM : tile.seqlen_q;
    tile.mask = attention.mask_of(tile.batch);
    const MaskRule::ColumnRange columns = tile.mask.columns_of_rows(tile.m0, tile.row_end);
    tile.n_block_end = (columns.end + kBlockN - 1) / kBlockN;
    tile.num_n_blocks =
        columns.end > columns.begin ? static_cast<int>(tile.n_block_end - columns.begin / kBlockN) : 0;
  }
  const std::int64_t head_kv = tile.head / attention.group_size;
  const int num_n_blocks = tile.num_n_blocks;

  extern __shared__ unsigned char shared_storage[];
  const std::uint32_t raw_address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_storage));
  unsigned char* shared_q = shared_storage + ((kTileAlignment - raw_address % kTileAlignment) % kTileAlignment);
  unsigned char* shared_k = shared_q + kQBytes;             // kKStages x (kBlockN, kHeadDim) in panels
  unsigned char* shared_v = shared_k + kKStages * kKBytes;  // kVStages x (kBlockN, kHeadDim) in panels
  // kVtStages x (kHeadDim, kBlockN) in Vt panels: after the V ring, or in place over it.
  unsigned char* shared_vt = kIsInPlace ? shared_v : shared_v + kVStages * kVStageBytes;
  constexpr int kVtStageBytes = kIsInPlace ? kVStageBytes : kVtBytes;
  auto* barriers = reinterpret_cast<std::uint64_t*>(shared_q + kConfig.tiles_bytes());
  constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
  // Producer roles: thread 0 issues every TMA copy; all 4 warps (thread 0 between its
  // copies) transpose V. (A loader warp of its own, transposing with 3 warps, measured
  // slower in the copy schedule: the transpose set the pace, TUNING.md.)
  constexpr int kTransposeWarps = 4;
  constexpr int kTransposeThreads = 32 * kTransposeWarps;
  // Stage s of a ring holds blocks s, s + stages, ...: block `index`'s barriers are
  // [index % stages], its phase index / stages.
  std::uint64_t* q_full = barriers;                       // Q landed
  std::uint64_t* k_full = q_full + 1;                     // [kKStages]: K stage landed (TMA)
  std::uint64_t* k_empty = k_full + kKStages;             // [kKStages]: every consumer warp is done with K
  std::uint64_t* v_full = k_empty + kKStages;             // [kVStages]: V stage landed (TMA)
  std::uint64_t* vt_full = v_full + kVStages;             // [kVtStages]: Vt written by every transposing thread
  std::uint64_t* vt_empty = vt_full + kVtStages;          // [kVtStages]: every consumer warp is done with Vt
  std::uint64_t* v_empty = vt_empty + kVtStages;          // [kVStages], copy only: every transposing thread
                                                          // is done with V (in place: vt_empty frees the stage)
  constexpr int kBarriers = 1 + 2 * kKStages + kVStages + 2 * kVtStages + (kIsInPlace ? 0 : kVStages);
  static_assert(kBarriers * 8 <= 256, "mbarriers exceed their 256 bytes");

  if (threadIdx.x == 0) {
    ::cuda::ptx::mbarrier_init(q_full, 1);
    for (int stage = 0; stage < kKStages; ++stage) {
      ::cuda::ptx::mbarrier_init(&k_full[stage], 1);
      ::cuda::ptx::mbarrier_init(&k_empty[stage], kConsumerWarps);
    }
    for (int stage = 0; stage < kVStages; ++stage) {
      ::cuda::ptx::mbarrier_init(&v_full[stage], 1);
      if (!kIsInPlace) ::cuda::ptx::mbarrier_init(&v_empty[stage], kTransposeThreads);
    }
    for (int stage = 0; stage < kVtStages; ++stage) {
      ::cuda::ptx::mbarrier_init(&vt_full[stage], kTransposeThreads);
      ::cuda::ptx::mbarrier_init(&vt_empty[stage], kConsumerWarps);
    }
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / ptx::kWarpgroupThreads;
  const int lane = threadIdx.x % 32;
  // Varlen tensors are one batch entry whose sequences are row ranges.
  const bool is_varlen = attention.is_varlen();

  if (warpgroup == 0) {
    // ---- producer: TMA (thread 0) and the V transpose (all 128 threads) ---------------
    ptx::setmaxnreg_decrease<kConfig.producer_registers>();
    const bool is_loader = threadIdx.x == 0;
    const std::int32_t batch_coordinate = is_varlen ? 0 : static_cast<std::int32_t>(tile.batch);
    const std::int64_t k_start = attention.k_start(tile.batch);
    if (is_loader) {
      ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                             ::cuda::ptx::space_shared, q_full, kQBytes);
      load_byte_panels<kPanels, kPanelBytes, kBlockM>(
          shared_q, &params.q_map, static_cast<std::int32_t>(attention.q_start(tile.batch) + tile.m0),
          static_cast<std::int32_t>(tile.head), batch_coordinate, q_full);
    }
    // The TMA copy of block `index` of the visit order into its stage of a ring of
    // `stages` (thread 0; the stage's previous block must have been released).
    // Every K and V copy brings kBlockN rows (kKBytes = kVBytes; rows past the tensor's end
    // arrive as zeros and count too); `stage_bytes` is the ring's stride.
    static_assert(kKBytes == kVBytes, "K and V tiles: one byte count");
    auto issue_load = [&](const CUtensorMap* tensor_map, unsigned char* ring, std::uint64_t* full, int stages,
                          int stage_bytes, int index) {
      const int stage = index % stages;
      ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                             ::cuda::ptx::space_shared, &full[stage], kKBytes);
      const std::int32_t row = static_cast<std::int32_t>(k_start + (tile.n_block_end - 1 - index) * kBlockN);
      load_byte_panels<kPanels, kPanelBytes, kBlockN>(ring + stage * stage_bytes, tensor_map, row,
                                                      static_cast<std::int32_t>(head_kv), batch_coordinate,
                                                      &full[stage]);
    };
    // Whether the stage of block `index` of a ring has been released by its previous
    // block (index - stages), without waiting.
    auto is_stage_free = [&](std::uint64_t* empty, int stages, int index) {
      return index < stages || ptx::mbarrier_test_wait(&empty[index % stages], ((index / stages) - 1) & 1);
    };
    auto wait_stage_free = [&](std::uint64_t* empty, int stages, int index) {
      if (index >= stages) ptx::mbarrier_wait(&empty[index % stages], ((index / stages) - 1) & 1);
    };
    // Transpose steps (ldmatrix.trans / stmatrix on 16-bit elements, pairs of head-dim
    // bytes). Step (g, e) moves keys 16 g .. 16 g + 15 (g = 2 kp + h) x head-dim bytes
    // 32 e .. 32 e + 31 (16-byte chunks 2e, 2e+1) of V_index into Vt_index with keys
    // permuted by pi within each 32-key block (header, point 2):
    //   ldmatrix.x4.trans  matrices (keys 16g + 0..7 | 16g + 8..15) x (chunk 2e | 2e+1),
    //                      8 key rows of 16 bytes each; lane t = 4 c + q receives, per
    //                      matrix, b16 column c (head-dim bytes 2c, 2c+1 of the chunk) of
    //                      key rows 2q, 2q+1: bytes (key 2q: d 2c, 2c+1; key 2q+1: d 2c, 2c+1);
    //   byte permutes      from the two key halves, head-dim row 2c gets
    //                      (key 2q, 2q+1, 2q+8, 2q+9) at d 2c and row 2c+1 likewise: exactly
    //                      Vt bytes 16g + 4q + {0..3} (pi's order) of those two rows;
    //   stmatrix.x4        lane t's register goes to row c, bytes 4q..4q+3 of its matrix:
    //                      4 matrices of 8 head-dim rows x 16 key bytes (16g..16g+15).
    // A matrix's 8 rows should be distinct modulo 8 (the 128-byte swizzle then spreads
    // them over 8 chunks: no bank conflict), so the lanes with c >= 4 swap their even and
    // odd rows: matrix 2i' + j of a chunk holds rows 2c + (j xor [c >= 4]) (residues
    // 0,2,4,6,1,3,5,7). The ldmatrix rows (8 consecutive keys at one chunk) are conflict
    // free through the same swizzle (64- or 128-byte).
    const int transpose_warp = threadIdx.x / 32;
    const int matrix = lane / 8;      // ldmatrix / stmatrix: the matrix this lane addresses
    const int matrix_row = lane % 8;  // and its row
    constexpr int kKeyGroups = kBlockN / 16;              // g: 16 keys each
    constexpr int kSteps = kKeyGroups * (kHeadDim / 32);  // (g, e) per tile
    const bool is_swapped = lane / 4 >= 4;  // lane's c >= 4: its even/odd head-dim rows trade places
    // Offsets in the V tile (kBlockN, kHeadDim) in panels of this lane's ldmatrix row of
    // step (g, e): key 16g + 8 (matrix % 2) + row, chunk 2e + matrix / 2; and in the Vt
    // tile (kHeadDim, kBlockN) of its stmatrix row: head-dim row 32e + 16 (matrix / 2) +
    // 2 row + parity, key bytes 16g..16g+15.
    auto v_step_offset = [&](int g, int e) {
      const int key = 16 * g + 8 * (matrix % 2) + matrix_row;
      const int d_byte = 16 * (2 * e + matrix / 2);
      return static_cast<std::uint32_t>((d_byte / kPanelBytes) * (kBlockN * kPanelBytes) +
                                        swizzle_offset<kPanelBytes>(key * kPanelBytes + d_byte % kPanelBytes));
    };
    auto vt_step_offset = [&](int g, int e) {
      const int parity = (matrix % 2) ^ (matrix_row >= 4 ? 1 : 0);
      const int d_row = 32 * e + 16 * (matrix / 2) + 2 * matrix_row + parity;
      return static_cast<std::uint32_t>(swizzle_offset<kVtRowBytes>(d_row * kVtRowBytes + 16 * g));
    };
    // fragment: (keys 0..7 | 8..15) x (chunk 2e | 2e+1) of a step, as ldmatrix gave it;
    // written as the step's Vt rows at this lane's stmatrix row address.
    auto store_fragment = [&](std::uint32_t vt_row, const std::uint32_t (&fragment)[4]) {
      // Head-dim rows 2c (even) and 2c+1 (odd) of each chunk: bytes (2q, 2q+1, 2q+8, 2q+9).
      const std::uint32_t even_a = __byte_perm(fragment[0], fragment[1], 0x6420);
      const std::uint32_t odd_a = __byte_perm(fragment[0], fragment[1], 0x7531);
      const std::uint32_t even_b = __byte_perm(fragment[2], fragment[3], 0x6420);
      const std::uint32_t odd_b = __byte_perm(fragment[2], fragment[3], 0x7531);
      ptx::stmatrix_x4(vt_row, is_swapped ? odd_a : even_a, is_swapped ? even_a : odd_a,
                       is_swapped ? odd_b : even_b, is_swapped ? even_b : odd_b);
    };
    // 32-bit shared-window addresses (the producer has 24-40 registers).
    auto load_step = [&](std::uint32_t v_tile, int g, int e, std::uint32_t (&fragment)[4]) {
      ptx::ldmatrix_x4_trans(fragment[0], fragment[1], fragment[2], fragment[3], v_tile + v_step_offset(g, e));
    };
    auto store_step = [&](std::uint32_t vt_tile, int g, int e, const std::uint32_t (&fragment)[4]) {
      store_fragment(vt_tile + vt_step_offset(g, e), fragment);
    };

    if constexpr (!kIsInPlace) {
      // Block `index` into its stage (thread 0), waiting until the stage is released.
      auto load_block = [&](const CUtensorMap* tensor_map, unsigned char* ring, std::uint64_t* full,
                            std::uint64_t* empty, int stages, int stage_bytes, int index) {
        wait_stage_free(empty, stages, index);
        issue_load(tensor_map, ring, full, stages, stage_bytes, index);
      };
      // Vt_index = V_index^T into Vt's ring; all 4 warps (thread 0 between its copies),
      // one step at a time.
      auto transpose_v = [&](int index) {
        ptx::mbarrier_wait(&v_full[index % kVStages], (index / kVStages) & 1);
        wait_stage_free(vt_empty, kVtStages, index);
        __syncwarp();  // ldmatrix/stmatrix are .aligned: the whole warp, converged
        const std::uint32_t v_tile = ptx::shared_address(shared_v + (index % kVStages) * kVStageBytes);
        const std::uint32_t vt_tile = ptx::shared_address(shared_vt + (index % kVtStages) * kVtStageBytes);
#pragma unroll 1
        for (int step = transpose_warp; step < kSteps; step += kTransposeWarps) {
          std::uint32_t fragment[4];
          load_step(v_tile, step % kKeyGroups, step / kKeyGroups, fragment);
          store_step(vt_tile, step % kKeyGroups, step / kKeyGroups, fragment);
        }
        // The Vt writes before the consumers' wgmma (async proxy) reads them, and the V
        // reads before the next TMA write of the stage.
        ptx::fence_proxy_async_shared();
        ::cuda::ptx::mbarrier_arrive(&vt_full[index % kVtStages]);
        ::cuda::ptx::mbarrier_arrive(&v_empty[index % kVStages]);
      };
      // Before transposing V_i, thread 0 issues every K_j, V_j with j < i + S (S stages of
      // each; each waits for its stage). No cycle: V_j's stage waits for the transpose of
      // V_(j-S), j - S < i, done by this warpgroup already; K_j's for the consumers'
      // S_(j-S), which needs Vt only up to j - S - 1 < i.
      static_assert(kKStages == kVStages && kVStages == kVtStages, "the copy schedule: one depth");
      int loaded = 0;  // K/V blocks issued so far (thread 0)
      for (int index = 0; index < num_n_blocks; ++index) {
        if (is_loader) {
          for (; loaded < num_n_blocks && loaded < index + kVStages; ++loaded) {
            load_block(&params.k_map, shared_k, k_full, k_empty, kKStages, kKBytes, loaded);
            load_block(&params.v_map, shared_v, v_full, v_empty, kVStages, kVStageBytes, loaded);
          }
        }
        transpose_v(index);
      }
    } else {
      // In place: Vt_index is written over V_index in its stage. Each warp moves whole
      // sets of V's blocks that are closed under the transposition (every byte the set
      // writes, it has read), all loads of a set before any store: the set's registers
      // are its only buffer.
      //  d128, d256: a 128-byte panel (keys x head-dim bytes 128p..128p+127) is a square
      //   of 8 x 8 blocks of 16 keys x 16 bytes; V block (g, c) (keys 16g.., bytes 16c..)
      //   becomes Vt rows 16c.. x key bytes 16g.. (pi permutes keys within 16-key
      //   halves) — where V block (c, g) was: both tiles are 16 KB of 128-byte rows in
      //   the same swizzle. Blocks (g, c) and (c, g) form a closed pair, (g, g) alone.
      //   One ldmatrix.x2.trans reads a block (2 registers), one stmatrix.x2 writes its
      //   image. Each warp takes two items of two 32x32 blocks (kInPlaceItemCodes) per
      //   panel, each in two halves of 4 blocks of 16x16 (8 registers; the producer
      //   has 24 at d256), a __syncwarp between their loads and stores.
      //  d64: V (128 keys x 64 bytes, 64-byte swizzle) and Vt (64 x 128 bytes, 128-byte
      //   swizzle) have no closed set short of the tile: each warp loads 4 steps (keys
      //   32w..32w+31, all 64 bytes; 16 registers, the producer has 32), the warpgroup
      //   syncs, then each stores its 4.
      constexpr bool kIsWarpClosed = kPanelBytes == kVtRowBytes;
      static_assert(kIsWarpClosed || (128 / 16) * (kHeadDim / 32) == 4 * kTransposeWarps,
                    "d64: 4 steps per warp cover 128 keys (one Vt panel)");
      // Addresses with few registers, equal to v_step_offset / vt_step_offset's (the
      // model check_in_place_transpose.py checks them):
      //   d128/d256, block (g, c) (c counts 16-byte chunks over the panels):
      //     V   2048 g + 16384 (c / 8) + (lane_load_offset ^ 16 (c % 8))
      //     Vt  2048 c + (lane_store_offset ^ 16 g)
      //   d64, step (g, e):
      //     V   1024 g + (lane_load_offset ^ 32 e)
      //     Vt  4096 e + (lane_store_offset ^ 16 g)
      // where the lane terms are block / step (0, 0)'s offsets: the swizzles XOR offset
      // bits 4-6 with row bits that g, c, e do not change, and the bits g, c, e move are
      // zero in the lane terms.
      const int block_lane = lane % 16;  // ldmatrix/stmatrix.x2: lanes 0-15 address matrices 0, 1
      const int block_parity = (block_lane / 8) ^ (block_lane % 8 >= 4 ? 1 : 0);
      const int block_d_row = 2 * (block_lane % 8) + block_parity;  // Vt row of block (0, 0)
      const std::uint32_t lane_load_offset =
          kIsWarpClosed ? static_cast<std::uint32_t>(swizzle_offset<kPanelBytes>(block_lane * kPanelBytes))
                        : v_step_offset(0, 0);
      const std::uint32_t lane_store_offset =
          kIsWarpClosed ? static_cast<std::uint32_t>(swizzle_offset<kVtRowBytes>(block_d_row * kVtRowBytes))
                        : vt_step_offset(0, 0);
      const int warp_item_codes = static_cast<int>(
          (kInPlaceItemCodes >> (8 * kInPlaceItemsPerPanel * transpose_warp)) & ((1u << (8 * kInPlaceItemsPerPanel)) - 1));
      // Thread 0 issues every K or V copy whose stage is free, never waiting: K_j's stage
      // frees when the consumers' S_(j-kKStages) is done, V_j's when their
      // O += P V_(j-kVStages) is (the V/Vt stage is released by the consumers only).
      int k_issued = 0, v_issued = 0;  // thread 0: blocks whose copy was issued
      auto issue_free_loads = [&]() {
        while (k_issued < num_n_blocks && is_stage_free(k_empty, kKStages, k_issued))
          issue_load(&params.k_map, shared_k, k_full, kKStages, kKBytes, k_issued++);
        while (v_issued < num_n_blocks && is_stage_free(vt_empty, kVStages, v_issued))
          issue_load(&params.v_map, shared_v, v_full, kVStages, kVStageBytes, v_issued++);
      };
      for (int index = 0; index < num_n_blocks; ++index) {
        const int stage = index % kVStages;
        const std::uint32_t parity = (index / kVStages) & 1;
        // V_index lands after its copy is issued, which its stage's release by the
        // consumers allows (they need Vt only up to index - 1 before it): thread 0 keeps
        // issuing until it has landed, the others wait. No false positive: V_index's
        // phase of v_full cannot complete before its copy is issued. Thread 0 sleeps in
        // each poll until V lands or kLoaderPollNanoseconds pass (a spinning lane would
        // take issue slots from the consumer warps of its SM sub-partition).
        if (is_loader) {
          do {
            issue_free_loads();
          } while (!ptx::mbarrier_try_wait_for(&v_full[stage], parity, kLoaderPollNanoseconds));
        } else {
          ptx::mbarrier_wait(&v_full[stage], parity);
        }
        __syncwarp();  // ldmatrix/stmatrix are .aligned: the whole warp, converged
        const std::uint32_t tile_address = ptx::shared_address(shared_v + stage * kVStageBytes);
        if constexpr (kIsWarpClosed) {
          // Head-dim rows 2c' (even) and 2c'+1 (odd) of a chunk are bytes (2q, 2q+1, 2q+8,
          // 2q+9) of the two key halves: byte permute 0x6420 (even) and 0x7531 (odd); the
          // stmatrix.x2 takes the lane's row of matrix 0 first, odd for swapped lanes.
          const std::uint32_t first_row_selector = is_swapped ? 0x7531u : 0x6420u;
          // One 16x16 block: V block (g, c) read at `load`, its image written at `store`.
          // The 4 blocks of a half are read, the warp syncs, then written.
          auto move_blocks = [&](const std::uint32_t (&load)[4], const std::uint32_t (&store)[4]) {
            std::uint32_t fragments[4][2];  // block i: (keys 0..7 | 8..15) x its chunk
#pragma unroll
            for (int i = 0; i < 4; ++i) ptx::ldmatrix_x2_trans(fragments[i][0], fragments[i][1], load[i]);
            __syncwarp();  // every byte the stores below write, this warp has read
#pragma unroll
            for (int i = 0; i < 4; ++i)
              ptx::stmatrix_x2(store[i], __byte_perm(fragments[i][0], fragments[i][1], first_row_selector),
                               __byte_perm(fragments[i][0], fragments[i][1], first_row_selector ^ 0x1111));
          };
          if constexpr (kConfig.has_rotated_loop()) {
            // in_place_overlap: the same blocks and addresses as the loop below, each warp's
            // items resolved at compile time (a switch on the warp, the item loops
            // unrolled), so an address is one XOR of a lane base with a constant plus an
            // immediate. The V stage is 1024-byte aligned and every constant C below is
            // < 128, so for panel p and the multiples x of 2048 the loop adds
            //   tile_address + 16384 p + x + (lane_offset ^ C)
            //     = ((tile_address + lane_offset) ^ C) + 16384 p + x
            // (check_in_place_transpose.py checks it). The loop spends ~150 instructions per
            // item, most on addresses; these are issue slots the consumer warps of the
            // same sub-partitions need.
            const std::uint32_t load_base = tile_address + lane_load_offset;
            const std::uint32_t store_base = tile_address + lane_store_offset;
            auto move_warp_items = [&](auto warp_tag) {
              constexpr int kWarpCodes = static_cast<int>(
                  (kInPlaceItemCodes >> (8 * kInPlaceItemsPerPanel * decltype(warp_tag)::value)) & 0xFFFF);
#pragma unroll
              for (int item = 0; item < kInPlaceItemsPerPanel * kSquares; ++item) {
                const int code = (kWarpCodes >> (8 * (item % kInPlaceItemsPerPanel))) & 0xFF;
                const int a1 = code & 3, b1 = (code >> 2) & 3, a2 = (code >> 4) & 3;
                const std::uint32_t panel = 16384 * (item / kInPlaceItemsPerPanel);
                if (a1 == b1) {
#pragma unroll
                  for (int half = 0; half < 2; ++half) {
                    const int a = half == 0 ? a1 : a2;
                    const std::uint32_t offset = panel + 4096 * a;
                    const std::uint32_t load0 = (load_base ^ (32 * a)) + offset;
                    const std::uint32_t load1 = (load_base ^ (32 * a + 16)) + offset;
                    const std::uint32_t store0 = (store_base ^ (32 * a)) + offset;
                    const std::uint32_t store1 = (store_base ^ (32 * a + 16)) + offset;
                    move_blocks({load0, load1, load0 + 2048, load1 + 2048},
                                {store0, store0 + 2048, store1, store1 + 2048});
                  }
                } else {
#pragma unroll
                  for (int half = 0; half < 2; ++half) {
                    const std::uint32_t block_offset = panel + 4096 * a1 + 2048 * half;
                    const std::uint32_t image_offset = panel + 4096 * b1;
                    move_blocks({(load_base ^ (32 * b1)) + block_offset, (load_base ^ (32 * b1 + 16)) + block_offset,
                                 (load_base ^ (32 * a1 + 16 * half)) + image_offset,
                                 (load_base ^ (32 * a1 + 16 * half)) + image_offset + 2048},
                                {(store_base ^ (32 * a1 + 16 * half)) + image_offset,
                                 (store_base ^ (32 * a1 + 16 * half)) + image_offset + 2048,
                                 (store_base ^ (32 * b1)) + block_offset,
                                 (store_base ^ (32 * b1 + 16)) + block_offset});
                  }
                }
              }
            };
            static_assert(kTransposeWarps == 4, "one case per transposing warp");
            switch (transpose_warp) {
              case 0: move_warp_items(std::integral_constant<int, 0>{}); break;
              case 1: move_warp_items(std::integral_constant<int, 1>{}); break;
              case 2: move_warp_items(std::integral_constant<int, 2>{}); break;
              default: move_warp_items(std::integral_constant<int, 3>{}); break;
            }
          } else {
#pragma unroll 1
            for (int item = 0; item < kInPlaceItemsPerPanel * kSquares; ++item) {
              // 32x32 blocks (a1, b1), (a2, b2): bits 0-1, 2-3, 4-5, 6-7 of the item's code.
              const int code = (warp_item_codes >> (8 * (item % kInPlaceItemsPerPanel))) & 0xFF;
              const int a1 = code & 3, b1 = (code >> 2) & 3, a2 = (code >> 4) & 3;
              const std::uint32_t panel_address = tile_address + 16384 * (item / kInPlaceItemsPerPanel);
              // With the addresses above, 32x32 block (a, b)'s 16x16 block (2a + u, 2b + v):
              //   V   panel + 4096 a + 2048 u + (lane_load_offset ^ 32 b ^ 16 v)
              //   Vt  panel + 4096 b + 2048 v + (lane_store_offset ^ 32 a ^ 16 u)
              if (a1 == b1) {
                // Two diagonal 32x32 blocks, one per half: their 16x16 blocks (u, v) for
                // u, v = 0, 1, (0, 1) and (1, 0) each other's image.
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                  const int a = half == 0 ? a1 : a2;
                  const std::uint32_t load0 = panel_address + 4096 * a + (lane_load_offset ^ (32 * a));
                  const std::uint32_t load1 = panel_address + 4096 * a + (lane_load_offset ^ (32 * a) ^ 16);
                  const std::uint32_t store0 = panel_address + 4096 * a + (lane_store_offset ^ (32 * a));
                  const std::uint32_t store1 = panel_address + 4096 * a + (lane_store_offset ^ (32 * a) ^ 16);
                  // (u, v) = (0, 0), (0, 1), (1, 0), (1, 1)
                  move_blocks({load0, load1, load0 + 2048, load1 + 2048},
                              {store0, store0 + 2048, store1, store1 + 2048});
                }
              } else {
                // A block and its image (a2, b2) = (b1, a1): half h moves 16x16 blocks
                // (2 a1 + h, 2 b1 + j) and their images (2 b1 + j, 2 a1 + h), j = 0, 1.
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                  const std::uint32_t block_load =
                      panel_address + 4096 * a1 + 2048 * half + (lane_load_offset ^ (32 * b1));
                  const std::uint32_t image_load =
                      panel_address + 4096 * b1 + (lane_load_offset ^ (32 * a1) ^ (16 * half));
                  const std::uint32_t block_store =
                      panel_address + 4096 * b1 + (lane_store_offset ^ (32 * a1) ^ (16 * half));
                  const std::uint32_t image_store =
                      panel_address + 4096 * a1 + 2048 * half + (lane_store_offset ^ (32 * b1));
                  move_blocks({block_load, block_load ^ 16, image_load, image_load + 2048},
                              {block_store, block_store + 2048, image_store, image_store ^ 16});
                }
              }
            }
          }
        } else {
          // One Vt panel (128 keys, 8 KB of V and of Vt) at a time: the wide tile's second
          // panel is the same transpose 8 KB further (its keys from 128, rows of V and Vt
          // keep their swizzle phase), after the first's stores (disjoint bytes: no sync).
#pragma unroll
          for (int panel = 0; panel < kVtPanels; ++panel) {
            const std::uint32_t panel_address = tile_address + panel * kVtPanelBytes;
            std::uint32_t fragments[4][4];  // step i: (keys 0..7 | 8..15) x (chunk 2e | 2e+1)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int g = 2 * transpose_warp + i % 2, e = i / 2;
              ptx::ldmatrix_x4_trans(fragments[i][0], fragments[i][1], fragments[i][2], fragments[i][3],
                                     panel_address + 16 * kPanelBytes * g + (lane_load_offset ^ (32 * e)));
            }
            ptx::named_barrier_sync(NamedBarrier::kVTileRead, kTransposeThreads);  // the whole panel read
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int g = 2 * transpose_warp + i % 2, e = i / 2;
              store_fragment(panel_address + 32 * kVtRowBytes * e + (lane_store_offset ^ (16 * g)), fragments[i]);
            }
          }
        }
        // The Vt writes before the consumers' wgmma (async proxy) reads them and before
        // the next TMA write of the stage (after the consumers release it).
        ptx::fence_proxy_async_shared();
        ::cuda::ptx::mbarrier_arrive(&vt_full[stage]);
      }
      // The remaining K copies (every V copy was issued before the last transpose).
      if (is_loader) {
        for (; k_issued < num_n_blocks; ++k_issued) {
          wait_stage_free(k_empty, kKStages, k_issued);
          issue_load(&params.k_map, shared_k, k_full, kKStages, kKBytes, k_issued);
        }
      }
    }
    return;
  }

  // ---- consumers -------------------------------------------------------------------
  ptx::setmaxnreg_increase<kConfig.consumer_registers>();
  const int consumer = warpgroup - 1;
  const int thread_in_warpgroup = threadIdx.x % ptx::kWarpgroupThreads;
  const int group = lane / 4;      // accumulator row within an 8-row half
  const int quad_lane = lane % 4;  // accumulator column pair
  const int warpgroup_row0 = consumer * ptx::kWarpgroupRows;
  const int thread_row0 = warpgroup_row0 + (thread_in_warpgroup / 32) * 16 + group;  // + 8 * half

  // Descriptors (wgmma.cuh), all K-major with the swizzle of their row width: the
  // stride offset is one 8-row atom (8 x row bytes), the leading offset unused (16).
  constexpr ptx::SwizzleMode kQkvSwizzle = kPanelBytes == 128 ? ptx::SwizzleMode::bytes128 : ptx::SwizzleMode::bytes64;
  const std::uint32_t q_address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_q));
  const std::uint32_t k_address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_k));
  const std::uint32_t vt_address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_vt));
  const std::uint64_t q_descriptor =
      ptx::make_smem_descriptor(q_address + warpgroup_row0 * kPanelBytes, 16, 8 * kPanelBytes, kQkvSwizzle);
  const std::uint64_t k_descriptor = ptx::make_smem_descriptor(k_address, 16, 8 * kPanelBytes, kQkvSwizzle);
  const std::uint64_t vt_descriptor =
      ptx::make_smem_descriptor(vt_address, 16, 8 * kVtRowBytes, ptx::SwizzleMode::bytes128);
  // k32 step kk of a (rows, d) tile in panels: byte 32 kk of the row = panel 32 kk / P,
  // byte (32 kk) % P in it; the hardware applies the swizzle to the final address, so
  // advancing the start address inside the row stays valid. Descriptor units: bytes >> 4.
  auto k_step_offset = [](int kk, int rows) {
    return (((32 * kk) / kPanelBytes) * rows * kPanelBytes + (32 * kk) % kPanelBytes) >> 4;
  };

  // Descales of the tile's (batch, kv head); null = 1.
  auto descale_of = [&](const float* maybe_descale, const std::int64_t (&strides)[2]) {
    return maybe_descale == nullptr ? 1.0f : maybe_descale[tile.batch * strides[0] + head_kv * strides[1]];
  };
  const float qk_descale = descale_of(attention.maybe_q_descale, attention.q_descale_strides) *
                           descale_of(attention.maybe_k_descale, attention.k_descale_strides);
  const float v_descale = descale_of(attention.maybe_v_descale, attention.v_descale_strides);
  // Fast path (no softcap, no ALiBi, a positive descale product): scores stay raw q.k
  // until the exponent, one FFMA + one MUFU per element. Otherwise the ScoreRule, its
  // scale and softcap input scale multiplied by the descales, maps them to log2 units
  // first (a zero or negative product would not commute with the row max).
  const bool is_positive_scale = attention.score_is_positive_scale() && qk_descale > 0.0f;
  const float exp_scale = is_positive_scale ? attention.softmax_scale_log2 * qk_descale : 1.0f;
  ScoreRule score_rule{};
  if (!is_positive_scale) {
    score_rule = attention.score_of(tile.batch, tile.head, tile.mask);
    score_rule.scale_log2 *= qk_descale;
    if (score_rule.has_softcap()) score_rule.softcap_input_scale *= qk_descale;
  }

  float o[kHeadDim / 2];                      // (64, kHeadDim) per warpgroup, fp32 accumulator
  float s[kBlockN / 2];                       // (64, kBlockN) per warpgroup: S, then P' in fp32
  std::uint32_t p[kBlockN / 32][4];           // (64, kBlockN) per warpgroup: P' as e4m3 A fragments
  online_softmax::State<float> row_state[2];  // rows thread_row0 and thread_row0 + 8; l is this
                                              // thread's partial sum until the end
  float row_factor[2];                        // rescale of O for the block just exponentiated
  constexpr int kNTiles = kBlockN / 8;        // n8 tiles of S per warp (the fragment.cuh hooks' unit)

  // S = Q K^T for block `index` (issued and committed, not waited for).
  auto issue_qk = [&](int index) {
    const std::uint64_t stage_k_descriptor = k_descriptor + (((index % kKStages) * kKBytes) >> 4);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 32; ++kk) {
      ptx::wgmma_ss_e4m3<kBlockN>(s, q_descriptor + k_step_offset(kk, kBlockM),
                                  stage_k_descriptor + k_step_offset(kk, kBlockN), kk > 0 ? 1 : 0);
    }
    ptx::wgmma_commit_group();
  };
  // O += P' V for block `index`: k32 step kp reads keys 32 kp + pi(0..31), bytes
  // [32 kp, 32 kp + 32) of every Vt row: 32 (kp % 4) .. of Vt panel kp / 4.
  auto issue_pv = [&](int index) {
    const std::uint64_t stage_vt_descriptor = vt_descriptor + (((index % kVtStages) * kVtStageBytes) >> 4);
    ptx::fence_operands(o);
    ptx::wgmma_fence();
#pragma unroll
    for (int kp = 0; kp < kBlockN / 32; ++kp) {
      const int vt_offset = (kp / 4) * kVtPanelBytes + 32 * (kp % 4);
      ptx::wgmma_rs_e4m3<kHeadDim>(o, p[kp], stage_vt_descriptor + (vt_offset >> 4), 1);
    }
    ptx::wgmma_commit_group();
  };
  // Score rule, element mask, online softmax of block `index` (S complete in registers):
  // S becomes P' = 2^8 P (fp32) and row_factor the rescale O still needs.
  auto softmax_block = [&](int index) {
    ptx::fence_operands(s);
    const std::int64_t n0 = (tile.n_block_end - 1 - index) * kBlockN;
    if (!is_positive_scale) fragment::apply_score_rule<kNTiles>(s, score_rule, tile.m0 + thread_row0, n0);
    // Element mask only where the block crosses a mask edge or the end of the keys.
    const bool needs_mask =
        n0 + kBlockN > tile.seqlen_k || !tile.mask.tile_fully_allowed(tile.m0, tile.row_end, n0, n0 + kBlockN);
    if (needs_mask) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const std::int64_t row = tile.m0 + thread_row0 + 8 * half;
        const int begin = static_cast<int>(MaskRule::clamp(tile.mask.col_begin(row) - n0, 0, kBlockN));
        const int end = static_cast<int>(MaskRule::clamp(tile.mask.col_end(row) - n0, 0, kBlockN));
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = j * 8 + 2 * quad_lane + e;
            if (col < begin || col >= end) s[4 * j + 2 * half + e] = online_softmax::negative_infinity<float>();
          }
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float block_max = online_softmax::negative_infinity<float>();
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
        block_max = fmaxf(block_max, fmaxf(s[4 * j + 2 * half], s[4 * j + 2 * half + 1]));
      // The 4 lanes of a quad hold the row's columns: reduce across them.
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
      online_softmax::State<float>& state = row_state[half];
      row_factor[half] = state.raise_max(block_max * exp_scale);  // -inf stays -inf
      // exp2(s - m + 8): the base is 0 while the row has seen no key (masked scores are
      // -inf, their P' 0), as State::base() guarantees.
      const float shifted_base = state.base() - static_cast<float>(kProbabilityLog2Offset);
      float block_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float probability = ptx::exp2_approx_ftz(fmaf(s[4 * j + 2 * half + e], exp_scale, -shifted_base));
          s[4 * j + 2 * half + e] = probability;
          block_sum += probability;
        }
      state.add(block_sum);
    }
  };
  auto rescale_o = [&]() {
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        o[4 * j + 2 * half] *= row_factor[half];
        o[4 * j + 2 * half + 1] *= row_factor[half];
      }
  };
  // in_place_overlap with Fp8Rescale::when_max_moves: a warp whose 16 rows' maxima all
  // stayed put (factor exactly 1) skips the multiply (a warp-uniform vote; FA4 goes
  // further and skips while the max moved less than a threshold). At 16k keys of
  // N(0, 1) scores a warp's rows raise their max in about 50 of 128 blocks; the multiply
  // is 64 (d128) or 128 (d256) FMULs per thread and block.
  const bool rescales_every_block = !kConfig.has_rotated_loop() || params.rescale == Fp8Rescale::every_block;
  auto rescale_o_if_needed = [&]() {
    const bool is_unit = row_factor[0] == 1.0f && row_factor[1] == 1.0f;
    if (rescales_every_block || __any_sync(0xffffffffu, !is_unit)) rescale_o();
  };
  // P' to the e4m3 A fragments in the key order pi (header, point 2): for k32 step kp,
  // n8 tiles 4kp, 4kp+1 give a[0] (row) and a[1] (row + 8), tiles 4kp+2, 4kp+3 give a[2]
  // and a[3]; within a register, tile by tile, the lane's two columns in order.
  auto convert_p = [&]() {
#pragma unroll
    for (int kp = 0; kp < kBlockN / 32; ++kp) {
      const float* tiles = s + 16 * kp;  // s[4j + 2 half + e] for j = 4kp..4kp+3
      p[kp][0] = pack_e4m3x4(tiles[0], tiles[1], tiles[4], tiles[5]);
      p[kp][1] = pack_e4m3x4(tiles[2], tiles[3], tiles[6], tiles[7]);
      p[kp][2] = pack_e4m3x4(tiles[8], tiles[9], tiles[12], tiles[13]);
      p[kp][3] = pack_e4m3x4(tiles[10], tiles[11], tiles[14], tiles[15]);
    }
  };
  // This warp no longer reads the stage of block `index` of a ring of `stages`: the
  // producer may refill it.
  auto release = [&](std::uint64_t* empty, int stages, int index) {
    if (lane == 0) ::cuda::ptx::mbarrier_arrive(&empty[index % stages]);
  };
  auto wait_full = [&](std::uint64_t* full, int stages, int index) {
    ptx::mbarrier_wait(&full[index % stages], (index / stages) & 1);
  };

  // Ping-pong (in_place_ping_pong; FA3 section 3.1, as the bf16 kernel): the two consumer
  // warpgroups take turns issuing their GEMMs, so one's softmax runs while the other's
  // GEMMs occupy the tensor cores. Turn barrier of warpgroup c: its 128 threads sync, the
  // other's 128 arrive. Consumer 1 opens consumer 0's first turn and skips its own last
  // hand-over (the last PV), so every barrier completes exactly as often as it is waited
  // on: n + 1 turns each for n key blocks.
  // in_place_ping_pong takes turns always; the rotated-loop kernels (in_place_overlap and
  // the wide ones) when params.schedule is in_place_overlap_ping_pong (a uniform run-time
  // branch; run_forward_fp8 also sets it for in_place_overlap_n224_ping_pong) and they
  // have two consumer warpgroups.
  constexpr bool kIsPingPong = kConfig.is_ping_pong;
  static_assert(!kIsPingPong || kConsumerWarpgroups == 2, "ping-pong: two consumer warpgroups");
  constexpr bool kHasRotatedLoop = kConfig.has_rotated_loop();
  constexpr bool kMayTakeTurns = kIsPingPong || (kHasRotatedLoop && kConsumerWarpgroups == 2);
  const bool takes_turns =
      kIsPingPong || (kMayTakeTurns && params.schedule == Fp8Schedule::in_place_overlap_ping_pong);
  // (Barrier ids as constants in each branch: no registers held for them at d256.)
  auto begin_turn = [&]() {
    if constexpr (kMayTakeTurns) {
      if (takes_turns) {
        if (consumer == 0)
          ptx::named_barrier_sync(NamedBarrier::kTurnFirst, 2 * ptx::kWarpgroupThreads, 0);
        else
          ptx::named_barrier_sync(NamedBarrier::kTurnFirst, 2 * ptx::kWarpgroupThreads, 1);
      }
    }
  };
  auto end_turn = [&](bool is_last_turn) {
    if constexpr (kMayTakeTurns) {
      if (takes_turns) {
        if (consumer == 0)
          ptx::named_barrier_arrive(NamedBarrier::kTurnFirst, 2 * ptx::kWarpgroupThreads, 1);
        else if (!is_last_turn)
          ptx::named_barrier_arrive(NamedBarrier::kTurnFirst, 2 * ptx::kWarpgroupThreads, 0);
      }
    }
  };

#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.0f;
  ptx::mbarrier_wait(q_full, 0);
  if constexpr (kMayTakeTurns)
    if (takes_turns && consumer == 1 && num_n_blocks > 0)
      ptx::named_barrier_arrive(NamedBarrier::kTurnFirst, 2 * ptx::kWarpgroupThreads, 0);
  if constexpr (kHasRotatedLoop) {
    // Rotated loop (in_place_overlap). The operations and their order are those of the
    // loop below; only the loop's back edge moves, from after rescale_o/convert_p to
    // between the softmax and the wait for the PV GEMM. In the loop below the PTX has
    // softmax_j before `wgmma.wait_group 0`, but ptxas places the wait (WARPGROUP.DEPBAR)
    // at the top of the softmax's basic block, so the softmax runs after O += P'_(j-1)
    // V_(j-1) instead of under it (TUNING.md, "FA3's FP8 d256 path vs ours"); ptxas does
    // not move the wait across the back edge. One `if` around prologue, loop and tail: a
    // wgmma pending on a path ptxas cannot rule out would make it inject its own wait
    // (C7517) before the epilogue.
    if (num_n_blocks > 0) {
      wait_full(k_full, kKStages, 0);
      begin_turn();
      issue_qk(0);
      end_turn(false);
      ptx::wgmma_wait_group<0>();
      release(k_empty, kKStages, 0);
      softmax_block(0);
      for (int index = 1; index < num_n_blocks; ++index) {
        // O += P'_(index-2) V_(index-2) done (nothing pending when index = 1).
        ptx::wgmma_wait_group<0>();
        ptx::fence_operands(o);
        if (index >= 2) release(vt_empty, kVtStages, index - 2);
        rescale_o_if_needed();
        convert_p();  // P'_(index-1)
        wait_full(k_full, kKStages, index);
        wait_full(vt_full, kVtStages, index - 1);
        begin_turn();
        issue_qk(index);
        issue_pv(index - 1);
        end_turn(false);
        ptx::wgmma_wait_group<1>();  // S_index done, O += P'_(index-1) V_(index-1) still running
        release(k_empty, kKStages, index);
        softmax_block(index);  // under that PV GEMM
      }
      ptx::wgmma_wait_group<0>();
      ptx::fence_operands(o);
      if (num_n_blocks >= 2) release(vt_empty, kVtStages, num_n_blocks - 2);
      rescale_o_if_needed();
      convert_p();
      wait_full(vt_full, kVtStages, num_n_blocks - 1);
      begin_turn();
      issue_pv(num_n_blocks - 1);
      end_turn(true);
      ptx::wgmma_wait_group<0>();
      ptx::fence_operands(o);
      release(vt_empty, kVtStages, num_n_blocks - 1);
    }
  } else {
    // Software pipeline (FA3 section 3.2), as the bf16 kernel: S_j = Q K_j^T is issued
    // with O += P'_(j-1) V_(j-1), and the softmax of block j is meant to run while that PV
    // GEMM does; in the SASS it does not (ptxas hoists the wait_group 0 above it: see the
    // rotated loop above).
    if (num_n_blocks > 0) {
      wait_full(k_full, kKStages, 0);
      begin_turn();
      issue_qk(0);
      end_turn(false);
      ptx::wgmma_wait_group<0>();
      release(k_empty, kKStages, 0);
      softmax_block(0);
      rescale_o();
      convert_p();
    }
    for (int index = 1; index < num_n_blocks; ++index) {
      wait_full(k_full, kKStages, index);
      wait_full(vt_full, kVtStages, index - 1);
      begin_turn();
      issue_qk(index);
      issue_pv(index - 1);
      end_turn(false);
      ptx::wgmma_wait_group<1>();  // S_index done, O += P' V still running
      release(k_empty, kKStages, index);
      softmax_block(index);
      ptx::wgmma_wait_group<0>();
      ptx::fence_operands(o);
      release(vt_empty, kVtStages, index - 1);
      rescale_o();
      convert_p();
    }
    if (num_n_blocks > 0) {
      wait_full(vt_full, kVtStages, num_n_blocks - 1);
      begin_turn();
      issue_pv(num_n_blocks - 1);
      end_turn(true);
      ptx::wgmma_wait_group<0>();
      ptx::fence_operands(o);
      release(vt_empty, kVtStages, num_n_blocks - 1);
    }
  }

  // ---- epilogue: normalise once (v_descale / l'), LSE, O straight from registers -------
  const bool is_bf16_out = attention.dtype == DType::bfloat16;
  unsigned char* out = static_cast<unsigned char*>(attention.out) +
                       2 * (attention.out_offset(tile.batch, tile.head) + tile.m0 * attention.out_row_stride);
  float* maybe_lse = attention.maybe_lse;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    online_softmax::State<float> state = row_state[half];
    state.l += __shfl_xor_sync(0xffffffffu, state.l, 1);
    state.l += __shfl_xor_sync(0xffffffffu, state.l, 2);
    const int tile_row = thread_row0 + 8 * half;
    if (tile_row >= tile.row_end - tile.m0) continue;
    const float output_scale = state.inverse_sum(v_descale);
    if (maybe_lse != nullptr && quad_lane == 0)
      maybe_lse[attention.lse_offset(tile.batch, tile.head) + (tile.m0 + tile_row) * attention.lse_row_stride] =
          state.lse() - static_cast<float>(kProbabilityLog2Offset * online_softmax::kLn2);
    unsigned char* out_row = out + 2 * tile_row * attention.out_row_stride;
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const int column = 8 * j + 2 * quad_lane;
      if (column < attention.head_dim) {
        const float low = o[4 * j + 2 * half] * output_scale;
        const float high = o[4 * j + 2 * half + 1] * output_scale;
        *reinterpret_cast<std::uint32_t*>(out_row + 2 * column) =
            is_bf16_out ? pack_pair<__nv_bfloat16>(low, high) : pack_pair<__half>(low, high);
      }
    }
  }
#endif
}

// Launches forward_kernel_fp8_sm90 for already validated params: one CTA per (query
// tile, head, batch). No allocation, no synchronisation; launch errors throw CudaError.
template <int kHeadDim, Fp8Schedule kSchedule>
void launch_forward_fp8(const Fp8ForwardParams& params, cudaStream_t stream) {
  constexpr Fp8TileConfig kConfig = fp8_tile_config(kHeadDim, kSchedule);
  static_assert(kConfig.kernel_head_dim == kHeadDim, "no FP8 tile config for this head dim and schedule");
  const AttentionParams& attention = params.attention;
  const std::int64_t num_m_blocks = (attention.seqlen_q + kConfig.block_m - 1) / kConfig.block_m;
  const std::int64_t num_tiles = num_m_blocks * attention.heads_q * attention.batch;
  if (num_tiles == 0) return;
  if (num_tiles > INT_MAX)
    throw NotSupported("flashattn: q: too many query tiles x heads x batch for one launch (" +
                       std::to_string(num_tiles) + " > 2^31 - 1)");
  int device = 0;
  FLASHATTN_CUDA_CHECK(cudaGetDevice(&device));
  constexpr int kSharedBytes = kConfig.shared_bytes();
  auto* kernel = forward_kernel_fp8_sm90<kHeadDim, kSchedule>;
  // Above 48 KB of dynamic shared memory a kernel must opt in, once per device (and kernel).
  static std::atomic<std::uint64_t> opted_in_devices{0};
  const std::uint64_t device_bit = device < 64 ? (std::uint64_t{1} << device) : 0;
  if (device_bit == 0 || (opted_in_devices.load(std::memory_order_acquire) & device_bit) == 0) {
    FLASHATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
    opted_in_devices.fetch_or(device_bit, std::memory_order_release);
  }
  kernel<<<static_cast<unsigned>(num_tiles), kConfig.threads(), kSharedBytes, stream>>>(params);
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

// One kernel per schedule the head dim has (tile_config.hpp), chosen per call by
// params.schedule.
template <int kHeadDim>
void run_forward_fp8(const Fp8ForwardParams& params, cudaStream_t stream) {
  switch (params.schedule) {
    case Fp8Schedule::transpose_copy:
      return launch_forward_fp8<kHeadDim, Fp8Schedule::transpose_copy>(params, stream);
    case Fp8Schedule::transpose_in_place:
      return launch_forward_fp8<kHeadDim, Fp8Schedule::transpose_in_place>(params, stream);
    case Fp8Schedule::in_place_ping_pong:
      return launch_forward_fp8<kHeadDim, kernel_schedule(kHeadDim, Fp8Schedule::in_place_ping_pong)>(params, stream);
    case Fp8Schedule::in_place_overlap:
    case Fp8Schedule::in_place_overlap_ping_pong:
      return launch_forward_fp8<kHeadDim, Fp8Schedule::in_place_overlap>(params, stream);
    case Fp8Schedule::in_place_overlap_n192:
      return launch_forward_fp8<kHeadDim, kernel_schedule(kHeadDim, Fp8Schedule::in_place_overlap_n192)>(params,
                                                                                                        stream);
    case Fp8Schedule::in_place_overlap_n224:
      return launch_forward_fp8<kHeadDim, kernel_schedule(kHeadDim, Fp8Schedule::in_place_overlap_n224)>(params,
                                                                                                        stream);
    case Fp8Schedule::in_place_overlap_n160:
      return launch_forward_fp8<kHeadDim, kernel_schedule(kHeadDim, Fp8Schedule::in_place_overlap_n160)>(params,
                                                                                                        stream);
    case Fp8Schedule::in_place_overlap_n224_ping_pong: {
      // The rotated-loop kernels take turns when params.schedule is
      // in_place_overlap_ping_pong (takes_turns above): the n224 kernel (no kernel of its
      // own; where there is none, in_place_overlap's) told so.
      Fp8ForwardParams taking_turns = params;
      taking_turns.schedule = Fp8Schedule::in_place_overlap_ping_pong;
      return launch_forward_fp8<kHeadDim, kernel_schedule(kHeadDim, Fp8Schedule::in_place_overlap_n224_ping_pong)>(
          taking_turns, stream);
    }
  }
  throw NotSupported("flashattn: FP8 forward: unknown schedule " + std::to_string(static_cast<int>(params.schedule)));
}

}  // namespace flashattn::cuda::hopper_fp8
