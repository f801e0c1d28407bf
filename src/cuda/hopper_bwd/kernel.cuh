// src/cuda/hopper_bwd/kernel.cuh — the FlashAttention-3-style backward kernel for
// Hopper (sm_90a): TMA loads, wgmma, a producer warpgroup and two consumer warpgroups.
//
// The algorithm is the one of src/cuda/bwd/dkdv_kernel.cuh (same preprocess, same
// workspace, same MaskRule, same GQA summation order over the query heads); what
// changes is the mapping onto the hardware. For one (key block, kv head, sequence):
//   producer (warpgroup 0, one thread): K, V of the block once; then per step (query
//     head of the group x query block that sees the block) Q, dO (TMA tensor copies)
//     and the LSE and D rows (bulk copies) into a kStages ring of shared-memory
//     stages, each guarded by a "full" mbarrier (byte count) and an "empty" mbarrier
//     (every consumer warp is done with the stage).
//   consumer w (warpgroups 1, 2): owns keys [64 w, 64 w + 64) of the block. Per step
//     S^T  = K_w Q^T         wgmma m64n{block_m}, both operands K-major in shared memory
//     dP^T = V_w dO^T        wgmma m64n{block_m}
//     P^T  = exp2(S^T scale_log2 - LSE), element mask on boundary tiles
//            (softcap, ALiBi: exp2(ScoreRule's score - LSE), fragment::for_each_score)
//     dS^T = P^T ∘ (dP^T - D)   (softcap: ∘ (1 - tanh²), ScoreRule::gradient_factor)
//            dropout: P^T ∘ (Z ∘ dP^T / (1 - p) - D), and P^T ∘ Z for dV; Z is the
//            forward's mask, regenerated (fragment::dropout_keep_bits_transposed)
//     dV_w += P^T dO         wgmma m64n{d}, P^T from registers (the S^T accumulator
//     dK_w += dS^T Q         converted to 16 bits is the A fragment), dO/Q MN-major
//     dS^T -> shared memory; both consumers' halves meet at a named barrier
//     dQ = dS K, split over the consumers by rows (block_m 128: 64 each) or by
//                            columns (block_m 64: d/2 each); wgmma with dS^T read
//                            MN-major (transpose-A), K MN-major; fp32 into the staging
//                            tile, which one thread adds to dq_accum with one bulk
//                            TMA reduction per step.
//   That is the lockstep schedule (kSchedule, tile_config.hpp). The overlapped one
//   (FA3's order): dS^T goes to the buffer of the step's parity and dV is issued; one
//   barrier (both halves written); dQ, then dK; with dQ done (dK running) the consumer
//   stores its dQ part in 32-column fp32 panels (128-byte swizzle: conflict-free) once
//   the dQ writer (producer warpgroup, warp 1) has released them (kDqEmpty), signals
//   kDqFull, and the writer adds them with TMA tensor reductions (dq_accum_map); it
//   takes the deterministic turns too. The consumers never wait for each other over dQ.
//   deferred_dk (d128, default mode): as overlapped, but step s's dK is issued in step
//   s + 1 right after S^T and dP^T (from dS^T fragments kept in registers), so it runs
//   during step s + 1's dS^T math; step s's stage is released after it completes.
//   Computing S^T (keys as rows) rather than S keeps P^T and dS^T in the accumulator
//   layout the dV/dK products take from registers (FA3's SdP_swapAB): no shared-memory
//   round trip for P at all, and dS^T's round trip serves only the dQ product.
//   dK (scaled by softmax_scale) and dV (dropout: scaled by 1 / (1 - p)) are stored
//   from registers at the end, or (FLASHATTN_CUDA_HOPPER_BWD_EPILOGUE=tma, overlapped and
//   deferred_dk) staged in the tile's last stage (d128: and the dS^T buffers) and stored
//   with TMA stores by each consumer's first thread (see kTmaEpilogue).
//
// The grid (HopperBackwardParams::grid_ctas, launch.hpp): one CTA per tile, or persistent
// (FLASHATTN_CUDA_HOPPER_BWD_GRID=persistent or =dynamic: one CTA per SM). The static walk
// (persistent; the per-tile grid: tile b only): CTA b runs one tile of each round of
// gridDim.x consecutive tiles, b in even rounds and gridDim.x - 1 - b in odd ones (CtaTiles,
// dq_order.hpp). The dynamic claims (maybe_tile_counter): tile b first, then gridDim.x + the
// counter's next value (ClaimedTiles), in the L2-section order (heaviest key blocks first).
// Either way a CTA's tiles come in increasing index. The producer warpgroup's warp
// kSchedulerWarp (its lane 0, the scheduler) walks them and puts each into a two-slot tile
// queue (hopper/tile_queue.cuh, as the forward's), with what the loads need of it
// (TileLoads), and loads its K/V; the Q/dO loads thread and every consumer warp take them
// from there and skip the same ones (key_block_work), and the dQ writer takes each step
// from consumer 0. The producer's roles fit their 24 registers without a spill only so:
// the scheduler keeps its state in shared memory (SchedulerState) and claims after the K/V
// load, the loads thread reads the tile from its TileLoads at each step. What runs on across
// a CTA's tiles: the Q/dO/LSE/D ring (its stages and mbarrier phases count the CTA's
// steps, not the tile's, and so does the overlapped schedule's dS^T buffer parity), so the
// next tile's first steps load while the consumers finish the current one; and K/V: the
// loads wait on kv_empty, which every consumer warp arrives on once its tile's last dQ
// product (the last reader of K and V) is done, so the next K/V land while the consumers
// issue their last dK and store dK/dV. Per tile, balanced: kv_full and kv_empty complete
// one phase per tile with a step, the accumulators restart; the dQ handshake barriers
// once per step and once more at the end. Tiles with keys but no step load nothing and
// store dK = dV = 0; tiles past a varlen sequence's keys are skipped by every role.
//
// Shared-memory tiles: 64-column panels, 128-byte swizzle (see hopper/kernel.cuh).
// dS^T is one panel: row = key, 64 query columns.
// Rows past a sequence: Q/dO rows past the tensor arrive as zeros, rows of the next
// (varlen) sequence are finite, and their LSE is +inf (workspace padding), so P = 0
// and dS = 0 there; the dQ tile's rows past the sequence add exact zeros (the
// accumulator has block_m spare rows per head). Keys past the sequence are masked.
//
// Deterministic mode (kDeterministic): the bulk reductions of the CTAs into one
// (sequence, query head, query block) tile of dq_accum happen in a fixed order, by
// descending key block: before its reduction the issuer (lockstep: consumer 0's first
// thread; overlapped: the dQ writer, for both consumers' parts, whose reductions of one
// tile all fall in the turn) waits (acquire) until the
// tile's semaphore equals its turn = last visiting key block - its key block
// (dq_order.hpp gives the visitors of a query block, exactly those whose
// rows_of_columns range holds it), after it waits for the reduction to complete and
// publishes turn + 1 (release). Fp32 addition in a fixed order: dQ is bitwise
// repeatable. The key blocks are mapped onto the tile index t in reverse (highest first;
// within a sequence and kv head, in both CTA orders: pipeline.cuh's cta_key_block):
//   - deadlock freedom: a tile only waits for tiles of the same (sequence, kv head) with a
//     higher key block, which have a lower t. Per-tile grid (t = blockIdx.x): CTAs are
//     dispatched in blockIdx order, so those are resident or finished when it waits, and
//     by induction on t each of them completes its steps (the lowest waits for no one).
//     Persistent grids (at most one CTA per SM, so all CTAs are resident at once; each CTA
//     runs its tiles in increasing index and publishes a tile's last turn before it starts
//     the next tile): by induction on t, a tile t' < t that t waits for is run by a
//     resident CTA, which reaches t' after finishing its tiles below t' (complete by
//     induction), never after t: if it is t's own CTA, t' comes before t in its walk, so a
//     CTA never waits on a tile it runs later. The dynamic claims keep both premises: t' is
//     claimed by the time t is (the first gridDim.x tiles by blockIdx, the others by the
//     counter, whose values are handed out in increasing order: t' - gridDim.x was drawn
//     before t - gridDim.x), so it has a CTA, and each CTA's claims increase. A claim waits
//     only for the CTA's own consumers (the queue's slot, kv_empty), never for another CTA.
//     (tests/cuda/test_hopper_bwd_dq_order.cpp simulates it.) Nothing else a
//     CTA waits on (its own mbarriers and named barriers) depends on another CTA, and
//     whatever the order of the steps inside a tile (query heads of the group, then
//     ascending query blocks), no tile waits on a tile that waits on it.
//   - speed: under causal and sliding-window masks a higher key block starts at a later
//     query block, so it reaches a given query block after fewer steps than a lower one:
//     descending turns are (roughly) the order in which the CTAs arrive anyway (FA3
//     does the same for causal masks). Without a mask every CTA arrives at once and
//     the adds of a query block serialize either way.
// Tiles without a step (keys past the sequence, no query block) take no turn.
//
// Device masks (attn_mask, block masks: src/core/mask_tables.hpp). When
// params.device_mask.by_key_tile is present the steps are, per query head of the group,
// the query tiles the key tile's list names (ListedSteps, pipeline.cuh: the producer walks
// the lists and hands each step to the consumers through the stage's slot); a partial
// tile's S^T gets the element pass (fragment::mask_offset per element, in the score loop
// of softcap/ALiBi, which partial tiles always take) on the log2 scores before the
// exponential, a full one nothing (the lists hold the interval rule too). A partial tile
// with a tile code takes the fast pass instead (fragment::fragment_allowed_bits: its
// allowed bits before the products), or, under a block mask without bits (unless
// FLASHATTN_CUDA_MASKS_BWD_ROW_INTERVALS=0), the key-interval pass (each key row's
// allowed queries, one interval made once per tile: see the consumers' tile loop).
// Rows with LSE = -inf (they see no key) have +inf in the workspace (preprocess), so
// P = exp2(-inf or finite - inf) = 0, never NaN. dBias: dS^T before the softcap factor
// (natural-log units: S^T's gradient w.r.t. scale·q·k + bias) atomically added per
// element. dQ: only listed query tiles are reduced into. Deterministic: the turns come
// from the by_query_tile lists (listed_turn: the number of listed key tiles above this
// one, the same descending order, so the deadlock argument above holds unchanged).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cuda/ptx>
#include <string>
#include <type_traits>

#include "flashattn/error.hpp"
#include "flashattn/mask.hpp"
#include "src/core/params.hpp"
#include "src/cuda/bwd/workspace.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/common/fragment.cuh"
#include "src/cuda/common/named_barriers.hpp"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/common/swizzle.cuh"
#include "src/cuda/hopper/tile_queue.cuh"
#include "src/cuda/hopper_bwd/dq_order.hpp"
#include "src/cuda/hopper_bwd/launch.hpp"
#include "src/cuda/hopper_bwd/pipeline.cuh"
#include "src/cuda/hopper_bwd/tile_config.hpp"
#include "src/cuda/ptx/bulk_reduce.cuh"
#include "src/cuda/ptx/math.cuh"
#include "src/cuda/ptx/mbarrier.cuh"
#include "src/cuda/ptx/named_barrier.cuh"
#include "src/cuda/ptx/semaphore.cuh"
#include "src/cuda/ptx/stmatrix.cuh"
#include "src/cuda/ptx/warpgroup.cuh"
#include "src/cuda/ptx/wgmma.cuh"

namespace flashattn::cuda::hopper_bwd {

#if FLASHATTN_HOPPER_DEVICE_CODE
// One tile of a CTA's loop: keys [n0, n0 + kv_rows) of kv head head_kv of sequence
// `batch`, and its steps: every query head of the group x every query block that sees
// the keys (query blocks [m_block_begin, + m_blocks); dq_order.hpp: the deterministic
// turns derive from the same ranges), or under a device mask the query tiles its lists
// name (ListedSteps). The producer, the dQ writer and the consumers compute it alike, so
// they skip the same tiles and walk the same steps.
struct KeyBlockWork {
  // 32-bit: tile coordinates, and key rows below 2^31 (why_unsupported); the producer
  // warpgroup's 24 registers hold them across its steps.
  std::int32_t n_block, head_kv, batch;
  std::int32_t n0, kv_rows;
  MaskRule mask;  // the sequence's lengths and window
  int m_block_begin, m_blocks, steps;
};

// The overlapped schedule's step as consumer 0 hands it to the dQ writer (kernel below),
// in the 256 bytes of mbarriers and slots from kDqStepSlotOffset.
struct DqStep {
  std::int32_t head_q, m_block, batch, n_block;
  std::int32_t flags;  // kDqStepLastOfTile, kDqStepEnd
};
inline constexpr std::int32_t kDqStepLastOfTile = 1;  // the tile's last step: publish its turn at once
inline constexpr std::int32_t kDqStepEnd = 2;         // no step: the consumers are done
inline constexpr int kDqStepSlotOffset = 192;

// The tile queue (hopper/tile_queue.cuh): the scheduler lane (the producer warpgroup's warp
// kSchedulerWarp) puts each tile of the CTA's walk, the loads thread and every consumer warp
// take it; its mbarriers full[2], empty[2] and slots[2] from this offset of the barrier bytes.
inline constexpr int kTileQueueOffset = 64;
inline constexpr int kSchedulerWarp = 2;
inline constexpr std::int32_t kNoTile = -1;  // the queue's end: every reader stops there

// What the Q/dO loads thread needs of a queued tile, decoded once by the scheduler lane
// (key_block_work) and written beside the queue's slot before the tile is put: the loads
// thread reads it from shared memory at each step and releases the slot after the tile's
// last loads (24 registers: decoding the tile itself, or holding the decoded tile across
// its steps, made it spill in every step).
struct TileLoads {
  std::int64_t stats_start;       // the sequence's first statistics row
  std::int64_t first_list;        // a device mask's list of (sequence, head_q0, key block)
  std::int32_t steps;             // -1: the queue's end; 0: nothing to load
  std::int32_t q_start;           // the sequence's first query row (a TMA coordinate)
  std::int32_t batch_coordinate;  // the tensor maps' batch (0 when varlen)
  std::int32_t head_q0;           // the group's first query head
  std::int32_t m_block_begin, m_blocks;
  // The interval's query blocks that need no element mask with these keys (MaskRule::
  // full_query_blocks: empty when the keys reach past the sequence's): [begin, + count).
  std::int32_t full_m_block_begin, full_m_blocks;
  std::int32_t list_head, list_index, list_count;  // the loads thread's walk of the lists
};
inline constexpr int kTileLoadsOffset = 256;  // [2], one per queue slot

// The scheduler lane's state between tiles (see the lane in the kernel).
struct SchedulerState {
  std::int32_t taken;     // tiles put so far
  std::int32_t tile;      // the next tile to put (kNoTile: the walk has ended)
  std::int32_t kv_loads;  // tiles whose K/V were loaded (kv_full's and kv_empty's phases)
  std::int32_t k_row, head_kv;  // the tile just put: its K/V coordinates
  // The walk's constants (read here, not hoisted into registers across the loop).
  std::uint32_t cta, ctas, num_tiles;
  std::int32_t is_dynamic;
};
inline constexpr int kSchedulerStateOffset = kTileLoadsOffset + 2 * static_cast<int>(sizeof(TileLoads));

// The work of tile `tile`; false when its keys lie past its sequence (varlen: no step and
// no dK/dV row), a tile every role skips. A tile with keys and no step (no query row sees
// them) only writes dK = dV = 0.
template <int kBlockM, int kBlockN, bool kDeterministic>
__device__ __forceinline__ bool key_block_work(const HopperBackwardParams& params, std::int32_t tile,
                                               KeyBlockWork& work) {
  const BackwardParams& attention = params.backward;
  const KeyBlockCoordinates cta = cta_key_block<kDeterministic>(params, tile);
  work.n_block = static_cast<std::int32_t>(cta.n_block);
  work.head_kv = static_cast<std::int32_t>(cta.head_kv);
  work.batch = static_cast<std::int32_t>(cta.batch);
  const std::int64_t seqlen_k = attention.seqlen_k_of(cta.batch);
  const std::int64_t n0 = cta.n_block * kBlockN;
  if (n0 >= seqlen_k) return false;
  work.n0 = static_cast<std::int32_t>(n0);
  work.kv_rows = static_cast<std::int32_t>(seqlen_k - n0 < kBlockN ? seqlen_k - n0 : kBlockN);
  work.mask = attention.mask_of(cta.batch);
  const QueryBlockRange query_blocks = query_blocks_of_key_block(work.mask, work.n0, work.kv_rows, kBlockM);
  work.m_block_begin = query_blocks.begin;
  work.m_blocks = query_blocks.count;
  const TileLists& key_tile_lists = attention.device_mask.by_key_tile;
  work.steps = key_tile_lists.present()
                   ? ListedSteps::total(key_tile_lists, cta.batch, cta.head_kv * attention.group_size,
                                        attention.group_size, cta.n_block)
                   : work.m_blocks * static_cast<int>(attention.group_size);
  return true;
}
#endif

template <class T, int kHeadDimArg, int kBlockMArg, int kBlockNArg, int kStagesArg, bool kDeterministic,
          BackwardSchedule kSchedule>
__global__ void __launch_bounds__(128 * (1 + kConsumerWarpgroups), 1)
    backward_kernel_sm90(const __grid_constant__ HopperBackwardParams params) {
#if FLASHATTN_HOPPER_DEVICE_CODE
  constexpr HopperBwdTileConfig kConfig =
      HopperBwdTileConfig{kHeadDimArg, kBlockMArg, kBlockNArg, kStagesArg}.for_schedule(kSchedule);
  constexpr bool kOverlapped = kSchedule != BackwardSchedule::lockstep;
  constexpr bool kDeferDk = kSchedule == BackwardSchedule::deferred_dk;
  constexpr int kDkPending = kDeferDk ? 1 : 0;
  constexpr int kHeadDim = kHeadDimArg, kBlockM = kBlockMArg, kBlockN = kBlockNArg, kStages = kStagesArg;
  constexpr int kPanels = kConfig.panels();
  constexpr int kKVBytes = kConfig.kv_tile_bytes();
  constexpr int kQBytes = kConfig.q_tile_bytes();
  constexpr int kStatsBytes = kConfig.stats_bytes();
  // dQ = dS K (kBlockM, kHeadDim) over the two consumers: by rows when there are 64 per
  // consumer (block_m 128), else by columns (block_m 64: one m64 wgmma each).
  constexpr bool kDqSplitsRows = kBlockM == 64 * kConsumerWarpgroups;
  constexpr int kDqColumns = kDqSplitsRows ? kHeadDim : kHeadDim / kConsumerWarpgroups;  // per consumer
  constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
  constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  // Overlapped schedule: a consumer's (64, kDqColumns) part of dQ as 32-column fp32 panels
  // (tile_config.hpp), and the handshake barriers' threads (the consumer and the dQ writer).
  constexpr int kDqPanelsPerConsumer = kDqColumns / kDqPanelColumns;
  constexpr int kDqPanelBytes = kDqPanelRows * kDqPanelColumns * 4;
  constexpr int kDqHandshakeThreads = 128 + 32;
  constexpr ptx::MmaInput kInput = Numeric<T>::kMmaInput;
  // The TMA epilogue (params.is_epilogue_tma; overlapped and deferred_dk): each consumer stages
  // its dK and dV, (64 keys, kHeadDim) 16-bit each, as 64-column panels with the 128-byte
  // swizzle, and its first thread stores them with TMA stores. Where: block_m 128 (d64) in the
  // tile's last stage, dK in its Q tile and dV in its dO tile at rows 64 c (consumer c); block_m
  // 64 (d128) a Q tile is one consumer's dK (consumer 0's the last stage's Q, consumer 1's its
  // dO), and dV goes to the two dS^T buffers read as one (kBlockN, kHeadDim) tile, at the rows
  // 64 c that consumer c writes dS^T to. The last stage is released after the stores read it.
  constexpr bool kEpilogueInStage = kBlockM == kKeysPerConsumer * kConsumerWarpgroups;
  constexpr bool kEpilogueUsesDs = !kEpilogueInStage;
  constexpr int kOutputBandBytes = kKeysPerConsumer * kHeadDim * static_cast<int>(sizeof(T));
  constexpr bool kTmaEpilogue =
      kOverlapped && (kEpilogueInStage ? kQBytes == kConsumerWarpgroups * kOutputBandBytes
                                       : kQBytes == kOutputBandBytes &&
                                             kConfig.ds_buffers * kConfig.ds_bytes() == kBlockN * kHeadDim * static_cast<int>(sizeof(T)));
  static_assert(kBlockN == kConsumerWarpgroups * kKeysPerConsumer, "each consumer owns 64 keys");
  static_assert(kBlockM == 64 || kBlockM == 64 * kConsumerWarpgroups, "dQ: one m64 wgmma per consumer");
  static_assert(kBlockM <= bwd::kMaxBlockM, "LSE/D rows and dq_accum rows are padded for kMaxBlockM-row tiles");
  static_assert(kHeadDim % kPanelColumns == 0 && kDqColumns % kPanelColumns == 0, "whole 64-column panels");
  static_assert(kPanelColumns == kSwizzlePanelColumns, "load_panels and the descriptors: the same panels");
  static_assert(kConfig.shared_bytes() <= kMaxSharedBytes, "tiles exceed 227 KB of shared memory");
  static_assert((kDqSplitsRows ? 64 : kBlockM) == kDqPanelRows && kDqColumns % kDqPanelColumns == 0,
                "a consumer's dQ part is whole 64-row, 32-column panels");
  static_assert(kConsumerWarpgroups * kDqPanelsPerConsumer * kDqPanelBytes == kConfig.dq_staging_bytes(),
                "the consumers' dQ panels fill the staging tile");
  static_assert(static_cast<int>(NamedBarrier::kDqFullFirst) >=
                    static_cast<int>(NamedBarrier::kDqEmptyFirst) + kConsumerWarpgroups,
                "one dQ handshake barrier of each kind per consumer");
  static_assert(static_cast<int>(NamedBarrier::kDrawPairFirst) + 2 * kConsumerWarpgroups <=
                        static_cast<int>(NamedBarrier::kEpilogueStageFree) &&
                    static_cast<int>(NamedBarrier::kEpilogueStagedFirst) + kConsumerWarpgroups <=
                        static_cast<int>(NamedBarrier::kEpilogueReadFirst) &&
                    static_cast<int>(NamedBarrier::kEpilogueReadFirst) + kConsumerWarpgroups <= 16,
                "the epilogue's named barriers: one of each kind per consumer, ids below 16");
  static_assert(128 * kConfig.producer_registers() + kConsumerThreads * kConfig.consumer_registers() <= 65536,
                "register file: 64K 32-bit registers per SM");
  static_assert(kSchedulerStateOffset + static_cast<int>(sizeof(SchedulerState)) <= HopperBwdTileConfig::kBarrierBytes,
                "tile slots exceed the barrier bytes");
  static_assert((2 + 2 * kStages) * 8 <= kTileQueueOffset && kTileQueueOffset + 4 * 8 + 2 * 4 <= kListedStepSlotsOffset &&
                    kListedStepSlotsOffset + kStages * static_cast<int>(sizeof(ListedStep)) <= kDqStepSlotOffset &&
                    kDqStepSlotOffset + static_cast<int>(sizeof(DqStep)) <= 256,
                "mbarriers and step slots exceed their 256 bytes");

  const BackwardParams& attention = params.backward;
  const bwd::Workspace& workspace = params.workspace;
  // The CTA's tiles: blockIdx.x, blockIdx.x + gridDim.x, ... below num_tiles (the per-tile
  // grid: its one tile), each a (key block, kv head, sequence) of params.key_block_order.
  // Flat: key block fastest, so under a causal mask the low key blocks (the most query
  // blocks) start first and the short ones fill the tail (as the FA2-class kernel); or in
  // L2 sections (launch.hpp). Deterministic: highest key block first (see the top of the file).
  // (Read where each role loops: computed once here it is live across the role split, in
  // the producer warpgroup's 24 registers too.)
  const auto num_tiles = [&]() {
    return params.key_block_order.num_m_blocks * params.key_block_order.num_heads_batches;
  };
  // Under a device mask the steps are the listed query tiles (see the top of the file).
  const TileLists& key_tile_lists = attention.device_mask.by_key_tile;
  const bool is_listed = key_tile_lists.present();

  // Tiles 1024-byte aligned (the swizzle atom; the descriptors' base offset is 0).
  extern __shared__ unsigned char shared_storage[];
  const std::uint32_t raw_address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_storage));
  unsigned char* shared_base =
      shared_storage + ((kSwizzleAtomBytes - raw_address % kSwizzleAtomBytes) % kSwizzleAtomBytes);
  T* shared_k = reinterpret_cast<T*>(shared_base + kConfig.k_offset());    // (kBlockN, kHeadDim)
  T* shared_v = reinterpret_cast<T*>(shared_base + kConfig.v_offset());    // (kBlockN, kHeadDim)
  T* shared_q = reinterpret_cast<T*>(shared_base + kConfig.q_offset());    // kStages x (kBlockM, kHeadDim)
  T* shared_do = reinterpret_cast<T*>(shared_base + kConfig.do_offset());  // kStages x (kBlockM, kHeadDim)
  // (kBlockN, kBlockM) x ds_buffers: dS^T, panels of 64 queries (overlapped: buffer step % 2)
  unsigned char* shared_ds = shared_base + kConfig.ds_offset();
  // (kBlockM, kHeadDim) fp32, row-major (lockstep); overlapped: consumer c's part at
  // c x kDqPanelsPerConsumer panels of (kDqPanelRows, kDqPanelColumns), 128-byte swizzle.
  float* shared_dq = reinterpret_cast<float*>(shared_base + kConfig.dq_offset());
  float* shared_lse = reinterpret_cast<float*>(shared_base + kConfig.lse_offset());    // kStages x kBlockM
  float* shared_dsum = reinterpret_cast<float*>(shared_base + kConfig.dsum_offset());  // kStages x kBlockM
  auto* barriers = reinterpret_cast<std::uint64_t*>(shared_base + kConfig.barrier_offset());
  std::uint64_t* kv_full = barriers;                // K and V of a tile landed
  std::uint64_t* kv_empty = barriers + 1;           // every consumer warp is done reading a tile's K and V
  std::uint64_t* full = barriers + 2;               // [kStages]: Q, dO, LSE, D of a step landed
  std::uint64_t* empty = barriers + 2 + kStages;    // [kStages]: every consumer warp is done with it
  // [kStages]: the step (query head, query block; under a device mask the listed step),
  // written by the producer before the stage's loads.
  auto* step_slots = reinterpret_cast<ListedStep*>(shared_base + kConfig.barrier_offset() + kListedStepSlotsOffset);
  // Overlapped schedule: the step whose dQ consumer 0 has staged, for the dQ writer.
  auto* dq_step_slot = reinterpret_cast<DqStep*>(shared_base + kConfig.barrier_offset() + kDqStepSlotOffset);
  // The CTA's tiles, from the scheduler lane to the loads thread and the consumer warps.
  std::uint64_t* queue_barriers =
      reinterpret_cast<std::uint64_t*>(shared_base + kConfig.barrier_offset() + kTileQueueOffset);
  const hopper::TileQueue<> tile_queue{queue_barriers, queue_barriers + 2,
                                     reinterpret_cast<std::int32_t*>(queue_barriers + 4)};
  constexpr int kTileReaders = 1 + kConsumerThreads;  // the loads thread, every consumer thread
  auto* tile_loads = reinterpret_cast<TileLoads*>(shared_base + kConfig.barrier_offset() + kTileLoadsOffset);

  if (threadIdx.x == 0) {
    ::cuda::ptx::mbarrier_init(kv_full, 1);
    ::cuda::ptx::mbarrier_init(kv_empty, kConsumerWarps);
    for (int stage = 0; stage < kStages; ++stage) {
      ::cuda::ptx::mbarrier_init(&full[stage], 1);
      ::cuda::ptx::mbarrier_init(&empty[stage], kConsumerWarps);
    }
    for (int slot = 0; slot < 2; ++slot) {
      ::cuda::ptx::mbarrier_init(&tile_queue.full[slot], 1);
      ::cuda::ptx::mbarrier_init(&tile_queue.empty[slot], kTileReaders);
    }
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;

  if (warpgroup == 0) {
    // ---- producer ----------------------------------------------------------------
    ptx::setmaxnreg_decrease<kConfig.producer_registers()>();
    if constexpr (kOverlapped) {
      // ---- dQ writer (overlapped schedule): warp 1 ----------------------------------
      // Per step, per consumer c: wait until c has staged its part (kDqFull), add its
      // panels to dq_accum (TMA tensor reductions), and once the TMA has read them hand
      // them back (kDqEmpty). The step (query head, query block, sequence, key block) comes
      // from consumer 0 through dq_step_slot, written before its kDqFull arrival; the
      // consumers end with a step marked kDqStepEnd. (A walk of the tiles of its own, beside
      // the loads' in the warpgroup's 24 registers, spilled both loops' state.) The
      // handshake balances: the writer arrives on kDqEmpty once first and after every step,
      // each consumer syncs on it before each step and once after its last.
      // Deterministic: the step's turn is taken before the first reduction and published
      // once they are performed, which the writer waits for only after the next step's
      // reductions are issued (FA3's next step: the completion's latency overlaps the next
      // turn; a CTA still waits only for higher key blocks, which never wait for it, so
      // holding a turn longer cannot deadlock); a tile's last turn is published before the
      // next tile's first is taken (see the top of the file).
      if (threadIdx.x / 32 == 1) {
        const int lane = threadIdx.x % 32;
        const std::uint32_t staging = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_dq));
#pragma unroll
        for (int consumer = 0; consumer < kConsumerWarpgroups; ++consumer)
          ptx::named_barrier_arrive(NamedBarrier::kDqEmptyFirst, kDqHandshakeThreads, consumer);
        DqTurn previous_turn{nullptr, 0};  // deterministic: taken, not yet published
        for (;;) {
          ptx::named_barrier_sync(NamedBarrier::kDqFullFirst, kDqHandshakeThreads, 0);
          const DqStep step = *dq_step_slot;
          if ((step.flags & kDqStepEnd) != 0) break;
          DqTurn turn{nullptr, 0};
          if constexpr (kDeterministic) {
            if (lane == 0) {
              turn = dq_turn_of<kBlockM, kBlockN, /*kTurnOutOfLine=*/false>(
                  attention, workspace, attention.mask_of(step.batch), step.batch, step.head_q,
                  static_cast<std::int64_t>(step.m_block) * kBlockM, step.n_block);
              acquire_dq_turn(turn);
            }
            __syncwarp();
          }
          // dq_accum rows (of a head) below total_q + kMaxBlockM < 2^31 (launch.cu): 32-bit.
          const auto packed_start = static_cast<std::int32_t>(attention.is_varlen() ? attention.q_start(step.batch)
                                                                                    : step.batch * attention.seqlen_q);
#pragma unroll
          for (int consumer = 0; consumer < kConsumerWarpgroups; ++consumer) {
            if (consumer > 0) ptx::named_barrier_sync(NamedBarrier::kDqFullFirst, kDqHandshakeThreads, consumer);
            if (lane == 0) {
              const std::int32_t row = packed_start + step.m_block * kBlockM + (kDqSplitsRows ? 64 * consumer : 0);
#pragma unroll
              for (int panel = 0; panel < kDqPanelsPerConsumer; ++panel)
                ptx::tensor_reduce_add_4d(
                    &params.dq_accum_map, staging + (consumer * kDqPanelsPerConsumer + panel) * kDqPanelBytes,
                    (kDqSplitsRows ? 0 : consumer * kDqColumns) + panel * kDqPanelColumns, row, step.head_q, 0);
              ptx::bulk_commit_group();
            }
            __syncwarp();
          }
#pragma unroll
          for (int consumer = 0; consumer < kConsumerWarpgroups; ++consumer) {
            // Consumer c's group is the (c + 1)-th of this step's two.
            static_assert(kConsumerWarpgroups == 2, "the read waits below count two groups per step");
            if (lane == 0) {
              if (consumer == 0) ptx::bulk_wait_group_read<kConsumerWarpgroups - 1>();
              else ptx::bulk_wait_group_read<0>();
            }
            __syncwarp();
            ptx::named_barrier_arrive(NamedBarrier::kDqEmptyFirst, kDqHandshakeThreads, consumer);
          }
          if constexpr (kDeterministic) {
            if (lane == 0) {
              // The previous step's reductions are performed (this step's kConsumerWarpgroups
              // groups may still run): publish its turn; a tile's last turn at once.
              if (previous_turn.semaphore != nullptr) release_dq_turn<kConsumerWarpgroups>(previous_turn);
              previous_turn = turn;
              if ((step.flags & kDqStepLastOfTile) != 0) {
                release_dq_turn(turn);
                previous_turn = DqTurn{nullptr, 0};
              }
            }
            __syncwarp();
          }
        }
        // The staging panels stay readable until the TMA is done with them.
        if (lane == 0) ptx::bulk_wait_group<0>();
        return;
      }
    }
    if (threadIdx.x / 32 == kSchedulerWarp) {
      if (threadIdx.x % 32 != 0) return;
      // ---- scheduler lane and K/V loads: warp kSchedulerWarp's lane 0 ---------------------
      // Puts the CTA's tiles into the queue in walk order (the static walk, CtaTiles, or the
      // counter's claims, ClaimedTiles: dq_order.hpp), each with its TileLoads, then kNoTile. After putting a tile it loads the
      // tile's K and V once every consumer warp is done reading the previous tile's
      // (kv_empty: after the dQ product of its last step, before its last dK and the dK/dV
      // stores, which the load overlaps), and only then takes the next tile: a claim runs
      // about one tile ahead of the consumers (the queue would allow two), so the counter's
      // last tiles go to the CTAs that finish first. Tiles without a step (or past their
      // sequence) load no K/V.
      // Its state lives in shared memory (SchedulerState, volatile: read where used), so
      // that no register is live across a tile's decode: with 24 registers the decode
      // (64-bit sequence bounds, the walk, the lists' total) needs them all, and in a loop
      // it spilled the walk, the counts and half of the decoded tile.
      volatile SchedulerState* state =
          reinterpret_cast<volatile SchedulerState*>(shared_base + kConfig.barrier_offset() + kSchedulerStateOffset);
      // K and V of the tile just put in `slot`, once the consumers are done with the previous.
      auto load_kv = [&](int slot) {
        const int kv_loads = state->kv_loads;
        if (kv_loads > 0) ptx::mbarrier_wait(kv_empty, (kv_loads - 1) & 1);
        state->kv_loads = kv_loads + 1;
        const std::int32_t k_row = state->k_row, head_kv = state->head_kv;
        const std::int32_t batch_coordinate = tile_loads[slot].batch_coordinate;
        ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                               ::cuda::ptx::space_shared, kv_full, 2 * kKVBytes);
        load_panels<kPanels, kBlockN>(shared_k, &params.k_map, k_row, head_kv, batch_coordinate, kv_full);
        load_panels<kPanels, kBlockN>(shared_v, &params.v_map, k_row, head_kv, batch_coordinate, kv_full);
      };
      state->taken = 0;
      state->kv_loads = 0;
      state->cta = blockIdx.x;
      state->ctas = gridDim.x;
      state->num_tiles = static_cast<std::uint32_t>(num_tiles());
      state->is_dynamic = params.maybe_tile_counter != nullptr ? 1 : 0;
      state->tile = static_cast<std::int32_t>(blockIdx.x);  // both walks' first (gridDim.x <= num_tiles)
      for (;;) {
        const int taken = state->taken;
        const auto tile = static_cast<std::uint32_t>(state->tile);
        if (tile == static_cast<std::uint32_t>(kNoTile)) break;
        const int slot = taken & 1;
        tile_queue.wait_free(taken);
        {
          KeyBlockWork work;
          const bool has_keys =
              key_block_work<kBlockM, kBlockN, kDeterministic>(params, static_cast<std::int32_t>(tile), work);
          const std::int32_t steps = has_keys ? work.steps : 0;
          volatile TileLoads& loads = tile_loads[slot];  // each field stored where computed
          loads.steps = steps;
          if (steps > 0) {
            loads.stats_start = bwd::Workspace::stats_start(attention, work.batch);
            loads.q_start = static_cast<std::int32_t>(attention.q_start(work.batch));
            loads.batch_coordinate = attention.is_varlen() ? 0 : work.batch;
            loads.head_q0 = static_cast<std::int32_t>(work.head_kv * attention.group_size);
            loads.m_block_begin = work.m_block_begin;
            loads.m_blocks = work.m_blocks;
            const BlockRange full_m_range = work.mask.full_query_blocks(work.n0, work.n0 + kBlockN, kBlockM);
            loads.full_m_block_begin = static_cast<std::int32_t>(full_m_range.begin);
            loads.full_m_blocks = static_cast<std::int32_t>(full_m_range.end - full_m_range.begin);
            if (is_listed)
              loads.first_list = key_tile_lists.list(work.batch, work.head_kv * attention.group_size, work.n_block);
            state->k_row = static_cast<std::int32_t>(attention.k_start(work.batch) + work.n0);
            state->head_kv = work.head_kv;
          }
        }
        tile_queue.put(taken, static_cast<std::int32_t>(tile));
        state->taken = taken + 1;
        // K and V (the tile's slot is not rewritten before the next put), then the next
        // tile: the claim comes after this tile's K/V load (its kv_empty wait), about one
        // tile ahead of the consumers. Both walks as functions of the take (dq_order.hpp).
        if (tile_loads[slot].steps > 0) load_kv(slot);
        const std::uint32_t next_tile =
            state->is_dynamic != 0
                ? ClaimedTiles::tile_of_take(state->cta, state->ctas, state->num_tiles, taken + 1,
                                             [&]() { return atomicAdd(params.maybe_tile_counter, 1); })
                : CtaTiles::tile_of_round(state->cta, state->ctas, static_cast<std::uint32_t>(taken + 1));
        state->tile = next_tile < state->num_tiles ? static_cast<std::int32_t>(next_tile) : kNoTile;
      }
      const int taken = state->taken;
      tile_queue.wait_free(taken);
      tile_loads[taken & 1].steps = -1;
      tile_queue.put(taken, kNoTile);
      return;
    }
    if (threadIdx.x != 0) return;
    // ---- Q/dO loads: thread 0 -----------------------------------------------------------
    // The tiles from the queue, each read from its TileLoads (shared memory) at every step;
    // the slot is released after the tile's last loads. The ring of stages runs on across
    // the CTA's tiles (step `ring` of the CTA: stage ring % kStages), so the next tile's first
    // steps load while the consumers finish this one.
    // One loop over the tiles per kind of walk (a device mask's lists or the interval), so
    // that the interval's loop state is not spilled for the lists' (which need more).
    auto load_tiles = [&](auto listed_walk) {
      constexpr bool kIsListed = decltype(listed_walk)::value;
      int ring = 0;
      for (int taken = 0;; ++taken) {
        const int slot = taken & 1;
        ptx::mbarrier_wait(&tile_queue.full[slot], (taken >> 1) & 1);
        const TileLoads& loads = tile_loads[slot];
        if (loads.steps < 0) break;
        const int ring_end = ring + loads.steps;  // the tile's steps are the ring's [ring, ring_end)
        // Step `ring`: its stage (once free), the step into the stage's slot (released to the
        // consumers by the "full" arrival), then Q, dO, LSE and D.
        auto load_step = [&](std::int32_t head_q, std::int32_t m_block, const ListedStep& listed) {
          const int stage = ring % kStages;
          if (ring >= kStages) ptx::mbarrier_wait(&empty[stage], ((ring / kStages) - 1) & 1);
          ++ring;
          step_slots[stage] = listed;
          ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                                 ::cuda::ptx::space_shared, &full[stage],
                                                 2 * kQBytes + 2 * kStatsBytes);
          const std::int32_t q_row = loads.q_start + m_block * kBlockM;
          const std::int32_t batch_coordinate = loads.batch_coordinate;
          const int offset = stage * kBlockM * kHeadDim;
          load_panels<kPanels, kBlockM>(shared_q + offset, &params.q_map, q_row, head_q, batch_coordinate,
                                        &full[stage]);
          load_panels<kPanels, kBlockM>(shared_do + offset, &params.dout_map, q_row, head_q, batch_coordinate,
                                        &full[stage]);
          load_statistics(shared_lse + stage * kBlockM, shared_dsum + stage * kBlockM, workspace,
                          head_q * workspace.stats_head_stride + loads.stats_start + m_block * kBlockM, kStatsBytes,
                          &full[stage]);
        };
        // A tile without a step loads nothing (its record holds no more than that).
        if (loads.steps > 0) {
          if constexpr (kIsListed) {
            // ListedSteps' walk (pipeline.cuh: the query heads of the group in turn, each its
            // list of query tiles) with 32-bit state: list(sequence, head_q0 + head, key block)
            // = first_list + head * head_stride. It runs exactly `steps` (the lists' total)
            // times, so skipping the finished lists first never passes the last.
            // The walk's state in the tile's record (the thread owns the slot until it releases
            // it): in registers it spilled beside the step's loads.
            volatile TileLoads& walk = tile_loads[slot];
            walk.list_head = 0;
            walk.list_index = 0;
            walk.list_count = key_tile_lists.count(loads.first_list);
            while (ring < ring_end) {
              std::int32_t head = walk.list_head, index = walk.list_index;
              while (index >= walk.list_count) {
                ++head;
                index = 0;
                walk.list_count = key_tile_lists.count(loads.first_list + head * key_tile_lists.head_stride);
              }
              walk.list_head = head;
              walk.list_index = index + 1;
              const std::int64_t list = loads.first_list + head * key_tile_lists.head_stride;
              const TileEntry entry = key_tile_lists.entry(list, index);
              const ListedStep listed{loads.head_q0 + head, entry.tile, entry.partial ? 1 : 0,
                                      entry.partial ? key_tile_lists.code(list, index) : kGeneralTile};
              load_step(listed.head_q, listed.m_block, listed);
            }
          } else {
            // The interval's steps, counted (32-bit, no division); the consumers read each
            // from its stage's slot (one LDS instead of a division by m_blocks per step), with
            // is_partial = a boundary tile (the element mask): outside the tile's fully allowed
            // query blocks, one unsigned compare instead of the consumers' 64-bit
            // tile_fully_allowed (and no register of theirs across the loop).
            std::int32_t head_q = loads.head_q0;
            std::int32_t m_block = loads.m_block_begin;
            while (ring < ring_end) {
              const bool is_boundary = static_cast<std::uint32_t>(m_block - loads.full_m_block_begin) >=
                                       static_cast<std::uint32_t>(loads.full_m_blocks);
              load_step(head_q, m_block, ListedStep{head_q, m_block, is_boundary ? 1 : 0, kGeneralTile});
              if (++m_block == loads.m_block_begin + loads.m_blocks) {
                m_block = loads.m_block_begin;
                ++head_q;
              }
            }
          }
        }
        // The tile's slot (and its TileLoads) may take the CTA's next tile but one.
        ::cuda::ptx::mbarrier_arrive(&tile_queue.empty[slot]);
      }
    };
    if (is_listed) {
      load_tiles(std::true_type{});
    } else {
      load_tiles(std::false_type{});
    }
    return;
  }
  // ---- consumers -------------------------------------------------------------------
  ptx::setmaxnreg_increase<kConfig.consumer_registers()>();
  const int consumer = warpgroup - 1;
  const int thread_in_warpgroup = threadIdx.x % 128;
  const int lane = threadIdx.x % 32;
  // The warp within the consumer, warp-uniform to ptxas (for branches around named barriers).
  const auto warp_of_consumer = [&]() { return __shfl_sync(0xffffffffu, thread_in_warpgroup / 32, 0); };
  const int group = lane / 4;      // accumulator row within an 8-row half
  const int quad_lane = lane % 4;  // accumulator column pair
  const int warp_row0 = (thread_in_warpgroup / 32) * 16 + group;  // + 8 * half: row within a warpgroup's 64
  const int key_row0 = consumer * kKeysPerConsumer + warp_row0;   // this thread's key rows in the block
  // Lockstep: issues the dQ bulk reductions (overlapped: the dQ writer warp does).
  const bool is_issuer = !kOverlapped && threadIdx.x == 128;

  // Descriptors (see ptx/wgmma.cuh). K-major: K, V as A of S^T/dP^T; Q, dO as B.
  // MN-major: dO, Q as B of dV/dK (rows = queries); dS^T as A and K as B of dQ.
  using ptx::make_smem_descriptor;
  using ptx::SwizzleMode;
  const auto address_of = [](const void* pointer) {
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
  };
  const std::uint32_t k_address = address_of(shared_k), v_address = address_of(shared_v);
  const std::uint32_t q_address = address_of(shared_q), do_address = address_of(shared_do);
  const std::uint32_t key_rows_offset = consumer * kKeysPerConsumer * 128;
  const std::uint64_t k_as_a = make_smem_descriptor(k_address + key_rows_offset, 16, 1024, SwizzleMode::bytes128);
  const std::uint64_t v_as_a = make_smem_descriptor(v_address + key_rows_offset, 16, 1024, SwizzleMode::bytes128);
  const std::uint64_t q_as_b = make_smem_descriptor(q_address, 16, 1024, SwizzleMode::bytes128);
  const std::uint64_t do_as_b = make_smem_descriptor(do_address, 16, 1024, SwizzleMode::bytes128);
  const std::uint64_t q_as_b_mn = make_smem_descriptor(q_address, kBlockM * 128, 1024, SwizzleMode::bytes128);
  const std::uint64_t do_as_b_mn = make_smem_descriptor(do_address, kBlockM * 128, 1024, SwizzleMode::bytes128);
  // dQ: this consumer's 64 query rows (a 64-query panel of dS^T) or kDqColumns head-dim columns (panels of K).
  const std::uint64_t ds_as_a_mn = make_smem_descriptor(
      address_of(shared_ds) + (kDqSplitsRows ? consumer * kBlockN * 128 : 0), kBlockN * 128, 1024,
      SwizzleMode::bytes128);
  const std::uint64_t k_as_b_mn = make_smem_descriptor(
      k_address + (kDqSplitsRows ? 0 : consumer * (kDqColumns / kPanelColumns) * kBlockN * 128), kBlockN * 128, 1024,
      SwizzleMode::bytes128);
  const int dq_row0 = kDqSplitsRows ? consumer * 64 : 0;           // of the staging tile
  const int dq_column0 = kDqSplitsRows ? 0 : consumer * kDqColumns;
  // Descriptor increments are byte offsets >> 4 in the start-address field.
  // K-major k16 step kk of a (rows, kHeadDim) panelled tile: panel kk / 4, 32 bytes per step inside it.
  auto k_step_offset = [](int kk, int tile_rows) { return ((kk / 4) * tile_rows * 128 + (kk % 4) * 32) >> 4; };
  // MN-major k16 step: 16 rows of 128 bytes.
  auto mn_step_offset = [](int kk) { return (kk * 16 * 128) >> 4; };

  const bool has_dropout = attention.has_dropout();
  const float scale_log2 = attention.softmax_scale_log2;
  // dBias needs a float attn_mask, hence lists (the interval path never accumulates it).
  const bool has_dbias = is_listed && attention.device_mask.maybe_dbias_sum != nullptr;
  // ALiBi's affine form: the query blocks this warp's 16 keys see on one side of the
  // diagonal (ScoreRule::row_side_bounds; the defaults: none, the switch off).
  // Only where S^T is 32 registers per thread (d128's block_m 64): at d64 (64) the
  // affine form's fast-path instance spilled 40 bytes (ptxas -v; as much with the
  // plain exponent in it, so it is the second instance), and ALiBi keeps the
  // per-element path there.
  constexpr bool kHasAffineAlibi = kBlockM / 2 <= 32;

  // The ring's steps of the CTA's earlier tiles (stages, their phases and the dS^T buffers
  // run on across tiles, as the producer's), and the K/V tiles consumed (kv_full's phase).
  int ring_base = 0;
  int kv_loads = 0;
  for (int taken = 0;; ++taken) {
    // The tile (every consumer thread arrives on the slot's "empty": no lane-0 branch here).
    ptx::mbarrier_wait(&tile_queue.full[taken & 1], (taken >> 1) & 1);
    const std::int32_t tile = tile_queue.slots[taken & 1];
    ::cuda::ptx::mbarrier_arrive(&tile_queue.empty[taken & 1]);
    if (tile == kNoTile) break;
    KeyBlockWork work;
    if (!key_block_work<kBlockM, kBlockN, kDeterministic>(params, tile, work)) continue;
    const std::int64_t n_block = work.n_block, head_kv = work.head_kv, batch = work.batch;
    const std::int64_t n0 = work.n0, kv_rows = work.kv_rows;
    const MaskRule mask = work.mask;
    const int steps = work.steps;
    fragment::RowBlockSides alibi_sides{};
    if (kHasAffineAlibi && params.is_alibi_affine && attention.has_alibi()) {
      const ScoreRule geometry = attention.score_of(batch, head_kv * attention.group_size, mask);  // its diagonal
      const std::int64_t warp_key_first = n0 + key_row0 - group;
      alibi_sides =
          fragment::RowBlockSides::of(geometry.row_side_bounds(warp_key_first, warp_key_first + 15, kBlockM, mask));
    }

    // The key-interval pass (launch.hpp's FLASHATTN_CUDA_MASKS_BWD_ROW_INTERVALS): under a
    // block mask without bits each key row's allowed queries are one interval for the
    // tile's whole life (fragment::key_row_query_interval), made here while K and V land,
    // into shared memory (kBlockN x 8 bytes after the mbarriers); a partial step of a
    // partial id turns its two rows' into its allowed bits (fragment::
    // allowed_bits_of_key_intervals: two LDS.64, a few integer operations a row) instead of
    // the fast pass's call (loads, 64-bit span arithmetic, two span tests per element).
    // Whether the pass applies is one host-made flag (launch.cu: asked for, lists, a block
    // mask without bits), and the intervals' address is found from the shared base where it
    // is read: with the mask's pointers (block mask, bits) tested per step and the address
    // held across the loop, the step loop spilled (deterministic d128 overlapped 24/24 ->
    // 32/44 bytes, a spill load per step on the unmasked path; ptxas -v). Compiled where
    // shared memory has room (not deferred_dk's three stages: tile_config.hpp).
    constexpr int kKeyIntervalOffset = kConfig.has_key_intervals() ? kConfig.key_interval_offset() : -1;
    if (kKeyIntervalOffset >= 0 && params.is_mask_key_intervals)
      store_key_intervals<kBlockN, kKeyIntervalOffset>(params, mask, batch, n0 + key_row0);

    float dv[kHeadDim / 2];  // (64 keys, kHeadDim) per consumer, fp32
    float dk[kHeadDim / 2];  // (64 keys, kHeadDim) per consumer, unscaled
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) dv[i] = dk[i] = 0.0f;

    // deferred_dk: the previous step's dS^T fragments (the A of its dK) and stage.
    std::uint32_t ds_previous[kBlockM / 16][4];
    int previous_stage = 0;

    if (steps > 0) ptx::mbarrier_wait(kv_full, kv_loads & 1);
    // The TMA epilogue at block_m 64 staged the previous tile's dV in this consumer's rows of
    // the dS^T buffers, which the first step rewrites: its storing warp arrives once its
    // stores have read them (that warp is needed for the first products anyway).
    if constexpr (kTmaEpilogue && kEpilogueUsesDs) {
      if (steps > 0 && ring_base > 0 && params.is_epilogue_tma && warp_of_consumer() != 0)
        ptx::named_barrier_sync(NamedBarrier::kEpilogueReadFirst, 128, consumer);
    }
    for (int step = 0; step < steps; ++step) {
      const int ring = ring_base + step;
      const int stage = ring % kStages;
      const std::uint64_t stage_offset = (stage * kQBytes) >> 4;
      ptx::mbarrier_wait(&full[stage], (ring / kStages) & 1);
      // The step, from its stage's slot (the producer walks the steps: the interval's with
      // counters, a device mask's lists; is_partial: the listed tile needs the element pass,
      // the interval's is a boundary tile).
      // Lockstep's interval steps from the step index instead: its deterministic issuer needs
      // them at the step's end, and held from the slot they spilled loop state (ptxas -v,
      // deterministic bf16 lockstep: d128 284/356 -> 456/496 bytes, d64 180/300 -> 844/924).
      std::int32_t m_block;
      std::int64_t head_q;
      if (kOverlapped || is_listed) {
        m_block = step_slots[stage].m_block;
        head_q = step_slots[stage].head_q;
      } else {
        m_block = work.m_block_begin + step % work.m_blocks;
        head_q = work.head_kv * attention.group_size + step / work.m_blocks;
      }
      const std::int64_t m0 = static_cast<std::int64_t>(m_block) * kBlockM;
      // A listed partial tile with a tile code: its allowed bits (fragment::
      // fragment_allowed_bits, outlined: a few loads, then register math), all ones on the
      // other listed tiles; applied (P = 0) beside the interval path's apply_mask. Before
      // the products are issued and as a call: inlined there it spilled 16 bytes of loop
      // state at d128, beside the products in flight 24, after the waits 52; as a call 12
      // (ptxas -v). The words are all it holds across the step.
      std::uint32_t allowed[fragment::kAllowedWords<kBlockM / 8>];
      if (is_listed) {
        const ListedStep listed = step_slots[stage];
        if (listed.is_partial != 0 && listed.code != kGeneralTile) {
          // The key-interval pass or the fast pass, chosen inside the call (pipeline.cuh).
          const fragment::AllowedBits<kBlockM / 8> bits = listed_allowed_bits_call<kBlockM / 8, kBlockN, kKeyIntervalOffset>(
              params, mask, listed.code, batch, n0 + key_row0, m0);
#pragma unroll
          for (int w = 0; w < fragment::kAllowedWords<kBlockM / 8>; ++w) allowed[w] = bits.words[w];
        } else {
#pragma unroll
          for (int w = 0; w < fragment::kAllowedWords<kBlockM / 8>; ++w) allowed[w] = ~0u;
        }
      }

      // S^T = K_w Q^T and dP^T = V_w dO^T: (64 keys, kBlockM queries) each.
      float s[kBlockM / 2];
      float dp[kBlockM / 2];
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk)
        ptx::wgmma_ss<kBlockM, kInput, 0>(s, k_as_a + k_step_offset(kk, kBlockN),
                                           q_as_b + stage_offset + k_step_offset(kk, kBlockM), kk > 0 ? 1 : 0);
      ptx::wgmma_commit_group();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk)
        ptx::wgmma_ss<kBlockM, kInput, 0>(dp, v_as_a + k_step_offset(kk, kBlockN),
                                           do_as_b + stage_offset + k_step_offset(kk, kBlockM), kk > 0 ? 1 : 0);
      ptx::wgmma_commit_group();
      if constexpr (kDeferDk) {
        // The previous step's dK_w += dS^T Q: it runs during this step's dS math.
        if (step > 0) {
          const std::uint64_t previous_offset = (previous_stage * kQBytes) >> 4;
#pragma unroll
          for (int kq = 0; kq < kBlockM / 16; ++kq)
            ptx::wgmma_rs<kHeadDim, kInput, 1>(dk, ds_previous[kq], q_as_b_mn + previous_offset + mn_step_offset(kq),
                                               1);
        }
        ptx::wgmma_commit_group();  // empty at step 0
      }
      if constexpr (kOverlapped) {
        // The late dQ hand-off (HopperBackwardParams::is_dq_handoff_late): the previous step's
        // staged dQ part goes to the writer only now, its stores long landed, so that the
        // fence no longer waits for them behind the wgmma operand reads. A tile's last step
        // hands off at once (below), so a step > 0 has its predecessor's pending.
        if (params.is_dq_handoff_late && step > 0) {
          ptx::fence_proxy_async_shared();
          ptx::named_barrier_arrive(NamedBarrier::kDqFullFirst, kDqHandshakeThreads, consumer);
        }
      }

      const float* lse = shared_lse + stage * kBlockM;
      const float* dsum = shared_dsum + stage * kBlockM;
      // The interval path's boundary tiles (listed tiles: is_partial below instead): the
      // producer's test, in the slot; lockstep's own 64-bit test (with the slot's it spilled:
      // ptxas -v, deterministic bf16 d64 lockstep 180/300 -> 840/944 bytes).
      bool needs_mask;
      if constexpr (kOverlapped) {
        needs_mask = !is_listed && step_slots[stage].is_partial != 0;
      } else {
        const std::int64_t q_rows_end = m0 + kBlockM < mask.seqlen_q ? m0 + kBlockM : mask.seqlen_q;
        needs_mask = !is_listed && (n0 + kBlockN > mask.seqlen_k ||
                                    !mask.tile_fully_allowed(m0, q_rows_end, n0, n0 + kBlockN));
      }
      // Element mask: key rows key_row0 (+8) against query column `column` of the tile.
      auto apply_mask = [&](float (&p)[kBlockM / 2]) {
#pragma unroll
        for (int j = 0; j < kBlockM / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const std::int64_t query = m0 + 8 * j + 2 * quad_lane + e;
            const std::int64_t begin = mask.col_begin(query), end = mask.col_end(query);
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const std::int64_t key = n0 + key_row0 + 8 * half;
              if (key < begin || key >= end) p[4 * j + 2 * half + e] = 0.0f;
            }
          }
      };
      // The score rule of this step's query head (ALiBi's slope is per head), and
      // dropout's keep decisions of this thread's elements: Philox runs while both
      // products are in flight. The rule's seed/offset are read here, per step, so that
      // they hold no registers across the loop (the default path is as tight as before).
      const ScoreRule rule = attention.score_of(batch, head_q, mask);
      constexpr int kKeepWords = kBlockM / 64;  // 64 queries' decisions per 32-bit word
      std::uint32_t keep[kKeepWords];
      float inverse_keep = 1.0f;
      if (has_dropout) {
        const DropoutRule dropout = attention.dropout();
        inverse_keep = dropout.inverse_keep;
        const std::uint32_t batch_head = attention.dropout_head(batch, head_q);
        // The draw exchange (params.is_dropout_draw_once; tile_config.hpp): the warps 2i,
        // 2i + 1 of a consumer need the same draws (dropout_fragment.hpp), so each makes
        // half of them and hands the other its decisions through shared memory, by step
        // parity (a pair's write of step s + 2 follows its barrier of step s + 1, which
        // follows the other warp's read of step s). Used where the exchange is in the
        // allocation: always unless it lives in the alignment slack (deferred_dk d128).
        using ExchangeWord = std::conditional_t<kKeepWords == 1, std::uint16_t, std::uint32_t>;
        const int base_padding = static_cast<int>(shared_base - shared_storage);
        if (params.is_dropout_draw_once &&
            kConfig.draw_exchange_offset() + kConfig.draw_exchange_bytes() + base_padding <= kConfig.shared_bytes()) {
          static_assert(kConfig.draw_exchange_bytes() == 2 * kConsumerThreads * static_cast<int>(sizeof(ExchangeWord)),
                        "one exchange word per consumer thread and step parity");
          const int warp = thread_in_warpgroup / 32;
          ExchangeWord* exchange = reinterpret_cast<ExchangeWord*>(shared_base + kConfig.draw_exchange_offset()) +
                                   (ring & 1) * kConsumerThreads + consumer * 128;
          std::uint32_t own[kKeepWords];
          std::uint32_t others = 0;
#pragma unroll
          for (int word = 0; word < kKeepWords; ++word) {
            const fragment::TransposedOrderedHalf half = fragment::dropout_ordered_half_transposed<8>(
                dropout, batch_head, n0 + key_row0, m0 + 64 * word, quad_lane);
            own[word] = half.own;
            others |= half.others << (16 * word);
          }
          exchange[thread_in_warpgroup] = static_cast<ExchangeWord>(others);
          ptx::named_barrier_sync(NamedBarrier::kDrawPairFirst, 64, 2 * consumer + warp / 2);
          const std::uint32_t from_other = exchange[32 * (warp ^ 1) + lane];
#pragma unroll
          for (int word = 0; word < kKeepWords; ++word) {
            const fragment::TransposedKeepHalves halves =
                fragment::transposed_keep_halves_of<8>(own[word], from_other >> (16 * word), n0 + key_row0);
            keep[word] = halves.mine | __shfl_xor_sync(0xffffffffu, halves.partners, 4);
          }
        } else {
#pragma unroll
          for (int word = 0; word < kKeepWords; ++word)
            keep[word] = fragment::dropout_keep_bits_transposed<8>(dropout, batch_head, n0 + key_row0, m0 + 64 * word);
        }
      } else {
#pragma unroll
        for (int word = 0; word < kKeepWords; ++word) keep[word] = ~0u;
      }
      auto is_kept = [&](int index) { return ((keep[index / 32] >> (index % 32)) & 1u) != 0; };
      // Z ∘ dP / (1 - p) (Algorithm 2: dS = P ∘ (Z ∘ dP / (1 - p) - D)).
      auto dropped_dp = [&](int index) { return is_kept(index) ? dp[index] * inverse_keep : 0.0f; };

      // A listed partial tile without a tile code takes the score loop below whatever the
      // rule: its element pass runs there, per element, after both products (beside dP^T's
      // accumulators in flight it spilled loop state in every step, masks or not: 72 bytes
      // at d128).
      const bool is_partial = is_listed && step_slots[stage].is_partial != 0 && step_slots[stage].code == kGeneralTile;
      // ALiBi on a step whose query block this warp's keys see on one side of the
      // diagonal: the fast path with the bias linear in the distance (below).
      const DiagonalSide side =
          rule.has_affine_bias() ? alibi_sides.side(static_cast<std::int32_t>(m0)) : DiagonalSide::straddles;
      // The fast path: P^T while dP^T is still being computed (compute_p: P^T = exp2(...)
      // of S^T in place), then the masks and dS^T. One instance per exponent form: both
      // forms behind a branch in one instance made the element mask after it spill 160
      // bytes at d128 (ptxas -v).
      auto fast_path = [&](auto&& compute_p) {
        ptx::wgmma_wait_group<1 + kDkPending>();
        ptx::fence_operands(s);
        compute_p();
        if (needs_mask) apply_mask(s);
        if (is_listed) fragment::apply_allowed_bits<kBlockM / 8>(s, allowed, 0.0f);
        ptx::wgmma_wait_group<kDkPending>();
        ptx::fence_operands(dp);
        // dS^T = P^T ∘ (dP^T - D), dropout: P^T ∘ (Z ∘ dP^T / (1 - p) - D) (two loops:
        // the default one stays free of the decisions).
        if (!has_dropout) {
#pragma unroll
          for (int j = 0; j < kBlockM / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float row_dsum = dsum[8 * j + 2 * quad_lane + e];
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                const int index = 4 * j + 2 * half + e;
                dp[index] = s[index] * (dp[index] - row_dsum);
              }
            }
        } else {
#pragma unroll
          for (int j = 0; j < kBlockM / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float row_dsum = dsum[8 * j + 2 * quad_lane + e];
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                const int index = 4 * j + 2 * half + e;
                dp[index] = s[index] * (dropped_dp(index) - row_dsum);
              }
            }
        }
        // dS^T is the gradient w.r.t. scale·q·k + bias here: natural-log units.
        if (has_dbias)
          fragment::accumulate_dbias<kBlockM / 8, true>(dp, attention, mask, batch, head_q, n0 + key_row0, m0, 1.0f);
      };
      if (rule.is_positive_scale() && !is_partial) {
        // P^T = exp2(S^T scale_log2 - LSE).
        fast_path([&]() {
#pragma unroll
          for (int j = 0; j < kBlockM / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float lse_log2 = lse[8 * j + 2 * quad_lane + e];
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                float& value = s[4 * j + 2 * half + e];
                value = ptx::exp2_approx_ftz(fmaf(value, scale_log2, -lse_log2));
              }
            }
        });
      } else if (kHasAffineAlibi && side != DiagonalSide::straddles && !is_partial) {
        // ALiBi on one side of the diagonal, where the bias is linear in the distance
        // q + diagonal - k (ScoreRule::bias_on_side): the exponent is the fast path's
        // fmaf(dot, scale_log2, c), c = bias(D0) - LSE + bias(8 j + e - 8 half) with D0 the
        // distance of the lane's (q0, key0), q0 = m0 + 2 quad: per query one add, per
        // element one FFMA with a compile-time distance.
        fast_path([&]() {
          const std::int32_t distance0 = static_cast<std::int32_t>(m0) + 2 * quad_lane +
                                         static_cast<std::int32_t>(rule.diagonal - n0) - key_row0;
          const float bias0 = rule.bias_on_side(side, static_cast<float>(distance0));
          const float bias_per_distance = rule.bias_on_side(side, 1.0f);
#pragma unroll
          for (int j = 0; j < kBlockM / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float bias0_minus_lse = bias0 - lse[8 * j + 2 * quad_lane + e];
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                float& value = s[4 * j + 2 * half + e];
                const float c = fmaf(bias_per_distance, static_cast<float>(8 * j + e - 8 * half), bias0_minus_lse);
                value = ptx::exp2_approx_ftz(fmaf(value, scale_log2, c));
              }
            }
        });
      } else {
        // Softcap and/or ALiBi (and listed partial tiles): P^T = exp2(score - LSE); dS^T
        // also needs the rule's gradient factor (softcap: 1 - tanh²), taken from the same
        // dot product.
        ptx::wgmma_wait_group<kDkPending>();
        ptx::fence_operands(s);
        ptx::fence_operands(dp);
        // A listed partial tile's element pass and dBias per element here: dBias takes dS
        // before the softcap factor (the bias is added after the softcap).
        fragment::for_each_score<kBlockM / 8, true>(s, rule, n0 + key_row0, m0, [&](int index, float score,
                                                                                    float factor) {
          const int query = 8 * (index / 4) + 2 * quad_lane + index % 2;  // of the block
          const std::int64_t key = n0 + key_row0 + 8 * ((index / 2) % 2);
          float log2_p = score - lse[query];
          if (is_partial) log2_p = masked_log2_probability(log2_p, attention, mask, batch, head_q, m0 + query, key);
          s[index] = ptx::exp2_approx_ftz(log2_p);
          const float dp_minus_d = (has_dropout ? dropped_dp(index) : dp[index]) - dsum[query];
          if (has_dbias) add_dbias(attention, mask, batch, head_q, m0 + query, key, s[index] * dp_minus_d);
          dp[index] = dp_minus_d * factor;
        });
        if (needs_mask) apply_mask(s);
        if (is_listed) fragment::apply_allowed_bits<kBlockM / 8>(s, allowed, 0.0f);
#pragma unroll
        for (int i = 0; i < kBlockM / 2; ++i) dp[i] *= s[i];
      }
      // dV takes P ∘ Z (its 1 / (1 - p) is applied once, when dV is stored).
      if (has_dropout) {
#pragma unroll
        for (int i = 0; i < kBlockM / 2; ++i)
          if (!is_kept(i)) s[i] = 0.0f;
      }

      // P^T and dS^T as 16-bit A fragments: two adjacent n8 column tiles of the
      // accumulator are one k16 step (the queries 16 kq .. 16 kq + 15).
      std::uint32_t p_fragment[kBlockM / 16][4];
      std::uint32_t ds_fragment[kBlockM / 16][4];
#pragma unroll
      for (int kq = 0; kq < kBlockM / 16; ++kq)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          p_fragment[kq][r] = pack_pair<T>(s[8 * kq + 2 * r], s[8 * kq + 2 * r + 1]);
          ds_fragment[kq][r] = pack_pair<T>(dp[8 * kq + 2 * r], dp[8 * kq + 2 * r + 1]);
        }
      // dS^T to shared memory: register r of step kq is row half r % 2, query chunk 2 kq + r / 2
      // (panel chunk / 8 of 64 queries, 16-byte chunk chunk % 8 of the row, swizzled).
      // Overlapped: the buffer of the step's parity (over the CTA's steps: a tile's first step
      // follows the previous tile's last, as within a tile).
      const int ds_buffer = kOverlapped ? ring % 2 : 0;
      unsigned char* step_ds = shared_ds + ds_buffer * kConfig.ds_bytes();
#pragma unroll
      for (int kq = 0; kq < kBlockM / 16; ++kq)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = key_row0 + 8 * (r % 2);
          const int chunk = 2 * kq + r / 2;
          *reinterpret_cast<std::uint32_t*>(step_ds + panels_chunk_offset<kBlockN>(row, chunk) + quad_lane * 4) =
              ds_fragment[kq][r];
        }

      if constexpr (!kOverlapped) {
        // dV_w += P^T dO, dK_w += dS^T Q (depth kBlockM queries).
        ptx::fence_operands(dv);
        ptx::fence_operands(dk);
        ptx::wgmma_fence();
#pragma unroll
        for (int kq = 0; kq < kBlockM / 16; ++kq)
          ptx::wgmma_rs<kHeadDim, kInput, 1>(dv, p_fragment[kq], do_as_b_mn + stage_offset + mn_step_offset(kq), 1);
#pragma unroll
        for (int kq = 0; kq < kBlockM / 16; ++kq)
          ptx::wgmma_rs<kHeadDim, kInput, 1>(dk, ds_fragment[kq], q_as_b_mn + stage_offset + mn_step_offset(kq), 1);
        ptx::wgmma_commit_group();

        // Both halves of dS^T written (visible to the async proxy, which wgmma reads
        // through), and the previous step's dQ staging tile read by the TMA.
        ptx::fence_proxy_async_shared();
        if (is_issuer) ptx::bulk_wait_group_read<0>();
        ptx::named_barrier_sync(NamedBarrier::kDsWritten, kConsumerThreads);

        // dQ[:, consumer's columns] = dS K (depth kBlockN keys).
        float dq[kDqColumns / 2];
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk)
          ptx::wgmma_ss<kDqColumns, kInput, 1, 1>(dq, ds_as_a_mn + mn_step_offset(kk), k_as_b_mn + mn_step_offset(kk),
                                                   kk > 0 ? 1 : 0);
        ptx::wgmma_commit_group();
        ptx::wgmma_wait_group<0>();
        ptx::fence_operands(dq);
        ptx::fence_operands(dv);
        ptx::fence_operands(dk);
        // Q, dO, LSE, D of this stage are no longer read by this warp (every lane's reads
        // ordered before lane 0's release).
        __syncwarp();
        if (lane == 0) ::cuda::ptx::mbarrier_arrive(&empty[stage]);
        // The tile's last step: K and V are no longer read either (the next tile's may load).
        if (lane == 0 && step == steps - 1) ::cuda::ptx::mbarrier_arrive(kv_empty);

#pragma unroll
        for (int j = 0; j < kDqColumns / 8; ++j)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = dq_row0 + warp_row0 + 8 * half;
            const int column = dq_column0 + 8 * j + 2 * quad_lane;
            *reinterpret_cast<float2*>(shared_dq + row * kHeadDim + column) =
                make_float2(dq[4 * j + 2 * half], dq[4 * j + 2 * half + 1]);
          }
        ptx::fence_proxy_async_shared();
        // Also: every consumer's dQ product is done, so dS^T may be rewritten next step.
        ptx::named_barrier_sync(NamedBarrier::kDqStaged, kConsumerThreads);
        if constexpr (!kDeterministic) {
          if (is_issuer) {
            ptx::bulk_reduce_add_f32(workspace.dq_accum + workspace.dq_offset(attention, batch, m0, head_q),
                                     address_of(shared_dq), kBlockM * kHeadDim * 4);
            ptx::bulk_commit_group();
          }
        } else {
          if (is_issuer)
            ordered_reduce_add<kBlockM, kBlockN, /*kTurnOutOfLine=*/true>(attention, workspace, mask, batch, head_q, m0,
                                                                           n_block, address_of(shared_dq),
                                                                           kBlockM * kHeadDim * 4);
          // The issuer rejoins its warp before the next step's warpgroup-wide wgmma.
          __syncwarp();
        }
      } else {
        // dV_w += P^T dO: runs while the consumers meet.
        ptx::fence_operands(dv);
        if constexpr (!kDeferDk) ptx::fence_operands(dk);  // deferred_dk: the previous dK is in flight
        ptx::wgmma_fence();
#pragma unroll
        for (int kq = 0; kq < kBlockM / 16; ++kq)
          ptx::wgmma_rs<kHeadDim, kInput, 1>(dv, p_fragment[kq], do_as_b_mn + stage_offset + mn_step_offset(kq), 1);
        ptx::wgmma_commit_group();
        // Both halves of this step's dS^T written (visible to the async proxy, which wgmma
        // reads through). The one barrier of the step: the buffer was last read by the dQ
        // products of step - 2, which each consumer completed before arriving here at step - 1.
        ptx::fence_proxy_async_shared();
        ptx::named_barrier_sync(NamedBarrier::kDsWritten, kConsumerThreads);

        // dQ[consumer's part] = dS K (depth kBlockN keys), then dK_w += dS^T Q: dQ completes
        // while dK runs, so its staging stores overlap the dK product.
        float dq[kDqColumns / 2];
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk)
          ptx::wgmma_ss<kDqColumns, kInput, 1, 1>(
              dq, ds_as_a_mn + ((ds_buffer * kConfig.ds_bytes()) >> 4) + mn_step_offset(kk),
              k_as_b_mn + mn_step_offset(kk), kk > 0 ? 1 : 0);
        ptx::wgmma_commit_group();
        if constexpr (!kDeferDk) {
#pragma unroll
          for (int kq = 0; kq < kBlockM / 16; ++kq)
            ptx::wgmma_rs<kHeadDim, kInput, 1>(dk, ds_fragment[kq], q_as_b_mn + stage_offset + mn_step_offset(kq), 1);
          ptx::wgmma_commit_group();
          ptx::wgmma_wait_group<1>();  // dV and dQ (groups complete in order)
          // The tile's last step: K and V are no longer read (dK reads Q): the next tile's
          // may load during this step's dK and the dK/dV stores.
          if (step == steps - 1) {
            __syncwarp();
            if (lane == 0) ::cuda::ptx::mbarrier_arrive(kv_empty);
          }
        } else {
          ptx::wgmma_wait_group<0>();  // the previous dK, dV and dQ
          ptx::fence_operands(dk);
          // The previous step's Q, dO, LSE, D are no longer read by this warp; on the tile's
          // last step, K and V neither (the last dK reads Q).
          __syncwarp();
          if (step > 0 && lane == 0) ::cuda::ptx::mbarrier_arrive(&empty[previous_stage]);
          if (step == steps - 1 && lane == 0) ::cuda::ptx::mbarrier_arrive(kv_empty);
        }
        ptx::fence_operands(dq);
        ptx::fence_operands(dv);

        // This consumer's panels are free once the writer's previous reductions have read them.
        ptx::named_barrier_sync(NamedBarrier::kDqEmptyFirst, kDqHandshakeThreads, consumer);
        // dq[4 j + 2 half + e] = dQ part (warp_row0 + 8 half, 8 j + 2 quad_lane + e), in the
        // fp32 panels' swizzle (common/swizzle.cuh: a warp's float2 stores are conflict-free).
        static_assert(kDqPanelBytes == kDqPanelRows * kSwizzleRowBytes, "float_panels_offset's panels");
        unsigned char* staging =
            reinterpret_cast<unsigned char*>(shared_dq) + consumer * kDqPanelsPerConsumer * kDqPanelBytes;
#pragma unroll
        for (int j = 0; j < kDqColumns / 8; ++j)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            *reinterpret_cast<float2*>(staging + float_panels_offset<kDqPanelRows>(warp_row0 + 8 * half,
                                                                                   8 * j + 2 * quad_lane)) =
                make_float2(dq[4 * j + 2 * half], dq[4 * j + 2 * half + 1]);
        // The step, for the writer (which read the previous one before releasing the panels).
        if (consumer == 0 && thread_in_warpgroup == 0)
          *dq_step_slot = DqStep{static_cast<std::int32_t>(head_q), m_block,
                                 static_cast<std::int32_t>(batch), static_cast<std::int32_t>(n_block),
                                 step == steps - 1 ? kDqStepLastOfTile : 0};
        // Staged: visible to the async proxy (the writer's TMA reads), then the writer's turn;
        // with the late hand-off after the next step's S^T and dP^T issue (above), but at once
        // on a tile's last step (its turn is published before the next tile's first: the top
        // of the file), so that nothing is pending across tiles or at the end. The panels are
        // not rewritten before the writer releases them (kDqEmpty), which follows this arrival.
        if (!params.is_dq_handoff_late || step == steps - 1) {
          ptx::fence_proxy_async_shared();
          ptx::named_barrier_arrive(NamedBarrier::kDqFullFirst, kDqHandshakeThreads, consumer);
        }

        if constexpr (!kDeferDk) {
          ptx::wgmma_wait_group<0>();  // dK: Q and dO of the stage are no longer read
          ptx::fence_operands(dk);
          // Q, dO, LSE, D of this stage are no longer read by this warp (the tile's last
          // stage is released after the loop: the TMA epilogue stages dK/dV in it).
          __syncwarp();
          if (lane == 0 && step != steps - 1) ::cuda::ptx::mbarrier_arrive(&empty[stage]);
        } else {
#pragma unroll
          for (int kq = 0; kq < kBlockM / 16; ++kq)
#pragma unroll
            for (int r = 0; r < 4; ++r) ds_previous[kq][r] = ds_fragment[kq][r];
          previous_stage = stage;
        }
      }
    }
    if constexpr (kDeferDk) {
      // The last step's dK.
      if (steps > 0) {
        const std::uint64_t previous_offset = (previous_stage * kQBytes) >> 4;
        ptx::fence_operands(dk);
        ptx::wgmma_fence();
#pragma unroll
        for (int kq = 0; kq < kBlockM / 16; ++kq)
          ptx::wgmma_rs<kHeadDim, kInput, 1>(dk, ds_previous[kq], q_as_b_mn + previous_offset + mn_step_offset(kq), 1);
        ptx::wgmma_commit_group();
        ptx::wgmma_wait_group<0>();
        ptx::fence_operands(dk);
        // Its stage is released after the loop (the TMA epilogue stages dK/dV in it).
      }
    }
    ring_base += steps;
    if (steps > 0) ++kv_loads;

    // dK = scale * dS^T Q and dV (/ (1 - p) under dropout; 1 otherwise).
    const float scale = attention.softmax_scale;
    const float dv_scale = attention.dropout_inverse_keep;
    // Straight from the accumulators: rows < kv_rows.
    auto store_from_registers = [&]() {
      T* dk_out = static_cast<T*>(attention.dk) + attention.dk_offset(batch, head_kv) + n0 * attention.dk_row_stride;
      T* dv_out = static_cast<T*>(attention.dv) + attention.dv_offset(batch, head_kv) + n0 * attention.dv_row_stride;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = key_row0 + 8 * half;
        if (row >= kv_rows) continue;
#pragma unroll
        for (int j = 0; j < kHeadDim / 8; ++j) {
          const int column = 8 * j + 2 * quad_lane;
          *reinterpret_cast<std::uint32_t*>(dk_out + row * attention.dk_row_stride + column) =
              pack_pair<T>(dk[4 * j + 2 * half] * scale, dk[4 * j + 2 * half + 1] * scale);
          *reinterpret_cast<std::uint32_t*>(dv_out + row * attention.dv_row_stride + column) =
              pack_pair<T>(dv[4 * j + 2 * half] * dv_scale, dv[4 * j + 2 * half + 1] * dv_scale);
        }
      }
    };
    // Through shared memory (see kTmaEpilogue): the tile's last stage, not yet released.
    const bool is_tile_staged = kTmaEpilogue && params.is_epilogue_tma && steps > 0;
    // A varlen tile that passes its sequence's end keeps the register stores: a box would
    // write into the next sequence (a dense tensor's map clips rows past seqlen_k). Decided
    // per tile, not per consumer: a branch around stmatrix on `consumer`, which ptxas does not
    // see as warp-uniform at d64 (kUniformConsumer), spilled the tile loop (bf16 d64
    // overlapped 0/0 -> 184/304 bytes; with `consumer` broadcast by a shuffle 12/28).
    const bool is_band_staged = is_tile_staged && (!attention.is_varlen() || kv_rows == kBlockN);
    const int last_stage = (ring_base - 1) % kStages;
    constexpr int kDkTileRows = kBlockM;  // a Q tile
    constexpr int kDvTileRows = kEpilogueInStage ? kBlockM : kBlockN;
    // Byte offsets of this consumer's dK and dV bands from the shared base.
    const int dk_band_offset =
        kEpilogueInStage ? kConfig.q_offset() + last_stage * kQBytes + consumer * kKeysPerConsumer * kSwizzleRowBytes
                         : (consumer == 0 ? kConfig.q_offset() : kConfig.do_offset()) + last_stage * kQBytes;
    const int dv_band_offset =
        kEpilogueInStage ? kConfig.do_offset() + last_stage * kQBytes + consumer * kKeysPerConsumer * kSwizzleRowBytes
                         : kConfig.ds_offset() + consumer * kKeysPerConsumer * kSwizzleRowBytes;
    if constexpr (kOverlapped) {
      // The tile's last stage, free unless dK/dV are staged in it (the ring runs on into the
      // next tile; the storing thread releases it then).
      if (steps > 0 && !is_tile_staged) {
        __syncwarp();
        if (lane == 0) ::cuda::ptx::mbarrier_arrive(&empty[last_stage]);
      }
    }
    // Both consumers' last products are complete (wgmma_wait<0> above): nobody reads the
    // stage's Q and dO or the dS^T buffers any more.
    if (is_tile_staged) ptx::named_barrier_sync(NamedBarrier::kEpilogueStageFree, kConsumerThreads);
    if (is_band_staged) {
      // stmatrix x4 per two n8 column tiles, as the forward's epilogue (hopper/epilogue.cuh):
      // matrices (tile j, rows 0-7 | 8-15 of the warp's 16), (tile j + 1, ...); lane 8 i + r
      // gives row r of matrix i.
      const int matrix = lane / 8;
      const int band_row = (thread_in_warpgroup / 32) * 16 + 8 * (matrix % 2) + lane % 8;
      const std::uint32_t base = address_of(shared_base);
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; j += 2) {
        ptx::stmatrix_x4(base + dk_band_offset + panels_chunk_offset<kDkTileRows>(band_row, j + matrix / 2),
                         pack_pair<T>(dk[4 * j] * scale, dk[4 * j + 1] * scale),
                         pack_pair<T>(dk[4 * j + 2] * scale, dk[4 * j + 3] * scale),
                         pack_pair<T>(dk[4 * j + 4] * scale, dk[4 * j + 5] * scale),
                         pack_pair<T>(dk[4 * j + 6] * scale, dk[4 * j + 7] * scale));
        ptx::stmatrix_x4(base + dv_band_offset + panels_chunk_offset<kDvTileRows>(band_row, j + matrix / 2),
                         pack_pair<T>(dv[4 * j] * dv_scale, dv[4 * j + 1] * dv_scale),
                         pack_pair<T>(dv[4 * j + 2] * dv_scale, dv[4 * j + 3] * dv_scale),
                         pack_pair<T>(dv[4 * j + 4] * dv_scale, dv[4 * j + 5] * dv_scale),
                         pack_pair<T>(dv[4 * j + 6] * dv_scale, dv[4 * j + 7] * dv_scale));
      }
      ptx::fence_proxy_async_shared();  // the staged dK/dV visible to the TMA (async proxy)
    } else {
      store_from_registers();
    }
    if (is_tile_staged) {
      ptx::named_barrier_sync(NamedBarrier::kEpilogueStagedFirst, 128, consumer);
      // The storing thread: the consumer's first.
      if (thread_in_warpgroup == 0) {
        if (is_band_staged) {
          const auto row = static_cast<std::int32_t>(attention.k_start(batch) + n0) + consumer * kKeysPerConsumer;
          const std::int32_t batch_coordinate = attention.is_varlen() ? 0 : static_cast<std::int32_t>(batch);
          store_panels<kPanels, kDkTileRows>(reinterpret_cast<const T*>(shared_base + dk_band_offset), &params.dk_map,
                                             row, static_cast<std::int32_t>(head_kv), batch_coordinate, kHeadDim);
          store_panels<kPanels, kDvTileRows>(reinterpret_cast<const T*>(shared_base + dv_band_offset), &params.dv_map,
                                             row, static_cast<std::int32_t>(head_kv), batch_coordinate, kHeadDim);
          ptx::bulk_commit_group();
          ptx::bulk_wait_group_read<0>();
        }
        // The stage for the next tile's loads: this consumer's four warp arrivals.
        ::cuda::ptx::mbarrier_arrive(&empty[last_stage], kConsumerWarps / kConsumerWarpgroups);
      }
      if constexpr (kEpilogueUsesDs) {
        // The staged dV read: the other warps may write dS^T rows again (next tile's first
        // step). The warp's test warp-uniform: a named barrier under a branch on threadIdx.x
        // made ptxas take the whole tile loop as divergent (bf16 d128 overlapped spills
        // 20/24 -> 444/548 bytes).
        if (warp_of_consumer() == 0) {
          __syncwarp();
          ptx::named_barrier_arrive(NamedBarrier::kEpilogueReadFirst, 128, consumer);
        }
      }
    }
  }
  if constexpr (kTmaEpilogue) {
    // The last tile's pairing of kEpilogueReadFirst (see the dS^T stores), and its stores
    // complete before the CTA's shared memory goes.
    if (kEpilogueUsesDs && params.is_epilogue_tma && ring_base > 0 && warp_of_consumer() != 0)
      ptx::named_barrier_sync(NamedBarrier::kEpilogueReadFirst, 128, consumer);
    if (thread_in_warpgroup == 0) ptx::bulk_wait_group<0>();
  }
  if constexpr (kOverlapped) {
    // The end for the dQ writer: its last arrival on kDqEmpty (after the last step), then
    // consumer 0's step marked kDqStepEnd.
    ptx::named_barrier_sync(NamedBarrier::kDqEmptyFirst, kDqHandshakeThreads, consumer);
    if (consumer == 0) {
      if (thread_in_warpgroup == 0) *dq_step_slot = DqStep{0, 0, 0, 0, kDqStepEnd};
      ptx::named_barrier_arrive(NamedBarrier::kDqFullFirst, kDqHandshakeThreads, consumer);
    }
  }
  // The staging tile must stay readable until the TMA has added it.
  if (is_issuer) ptx::bulk_wait_group<0>();
#endif
}

// Launches backward_kernel_sm90 with kConfig's tiles (ds_buffers: the schedule's) in
// kSchedule for already checked params (why_unsupported empty; overlapped: made by
// make_backward_params for that schedule, so with the dq_accum map). No allocation, no
// synchronisation. kDeterministic must equal params.backward.deterministic (it needs the
// workspace's dq_semaphore, zeroed).
template <class T, HopperBwdTileConfig kConfig, bool kDeterministic = false,
          BackwardSchedule kSchedule = BackwardSchedule::lockstep>
void launch_backward_sm90(const HopperBackwardParams& params, cudaStream_t stream) {
  if (params.backward.deterministic != kDeterministic || (kDeterministic && params.workspace.dq_semaphore == nullptr))
    throw Error("flashattn: cuda backward: Hopper kernel instantiated for the other deterministic mode");
  if constexpr (kSchedule != BackwardSchedule::lockstep) {
    const auto* map_bytes = reinterpret_cast<const unsigned char*>(&params.dq_accum_map);
    bool has_map = false;
    for (std::size_t i = 0; i < sizeof(params.dq_accum_map); ++i) has_map = has_map || map_bytes[i] != 0;
    const std::int64_t rows_q = params.backward.is_varlen() ? params.backward.total_q : params.backward.seqlen_q;
    if (!has_map && rows_q > 0)
      throw Error("flashattn: cuda backward: the overlapped Hopper schedule needs the dq_accum tensor map");
  }
  static std::atomic<std::uint64_t> opted_in_devices{0};
  launch_per_key_block(backward_kernel_sm90<T, kConfig.kernel_head_dim, kConfig.block_m, kConfig.block_n, kConfig.stages,
                                            kDeterministic, kSchedule>,
                       opted_in_devices, params, kConfig.block_n, kConfig.threads(),
                       kConfig.for_schedule(kSchedule).shared_bytes(), stream, params.grid_ctas);
}

// What a generated translation unit instantiates (see src/cuda/generate_instantiations.py).
template <class T, int kHeadDim, bool kDeterministic>
void run_backward_sm90(const HopperBackwardParams& params, cudaStream_t stream, BackwardSchedule schedule) {
  constexpr HopperBwdTileConfig kConfig = hopper_bwd_tile_config(kHeadDim);
  static_assert(kConfig.kernel_head_dim == kHeadDim, "no Hopper backward tile config for this head dim");
  if constexpr (kHeadDim == 128 && !kDeterministic) {
    if (schedule == BackwardSchedule::deferred_dk) {
      // A step's stage stays until its dK is done, in the next step: a third stage, so the
      // producer still loads a step and a half ahead (d128: 226.8 KB).
      constexpr HopperBwdTileConfig kThreeStages{kConfig.kernel_head_dim, kConfig.block_m, kConfig.block_n, 3};
      launch_backward_sm90<T, kThreeStages, kDeterministic, BackwardSchedule::deferred_dk>(params, stream);
      return;
    }
  }
  if (schedule != BackwardSchedule::lockstep)  // deferred_dk elsewhere: overlapped
    launch_backward_sm90<T, kConfig, kDeterministic, BackwardSchedule::overlapped>(params, stream);
  else
    launch_backward_sm90<T, kConfig, kDeterministic, BackwardSchedule::lockstep>(params, stream);
}

}  // namespace flashattn::cuda::hopper_bwd
