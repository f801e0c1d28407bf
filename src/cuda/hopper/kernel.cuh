// src/cuda/hopper/kernel.cuh — the FlashAttention-3 forward kernel for Hopper (sm_90a):
// TMA loads, wgmma, warp-specialised producer/consumer warpgroups.
//
// Roles (FA3's split, without CuTe): the kernel wires role types from their own headers,
//   tile_scheduler.cuh  Tile, KeyBlock; the schedulers behind one interface (initial_tile,
//                       next_tile, is_valid: SingleTileScheduler, Static/Dynamic
//                       PersistentScheduler, PersistentScheduler = the launch's choice of
//                       the two) and the tile queue's readers (TileDistribution);
//   mainloop.cuh        the loader's K/V block loads (MainloopLoader), the consumers'
//                       GEMMs (WarpgroupGemms) and ping-pong turns (PingPongTurns);
//   epilogue.cuh        normalise once, LSE, store O (Epilogue; OutputStorer: the storer
//                       lane's TMA stores of the tile overlap);
//   cta_state.cuh       KernelSpec (the kernel a role belongs to), ConsumerThread.
// Swapping the persistent kernels' scheduler is the scheduler lane's `using Scheduler`.
// Still lambdas of this kernel: decode_tile, key_block, the score/mask/softmax/dropout
// hooks, the K/V rings' waits and consume_tile; the scheduler lane's loop is kernel code.
// Each of those, moved into a role type, changed the generated code of some kernel, and
// the code of these kernels is pinned: hopper/TUNING.md ("Role files") says what moved
// it and how scripts/sass_fingerprint.py checks a change.
//
// The algorithm is the FA2 forward of src/cuda/fwd/kernel.cuh (same visit order,
// same online softmax through online_softmax::State, same MaskRule); what changes is
// how it is mapped onto the hardware (seed 004, FA3 paper section 3):
//   CTA = warpgroup 0, the producer: one thread issues TMA copies — the Q tile, then
//         K_j and V_j into kStages-deep rings of shared-memory stages (one ring for K,
//         one for V), each stage guarded by a "full" mbarrier (TMA completes its byte
//         count) and an "empty" mbarrier (every consumer warp has finished reading it);
//         warpgroups 1..block_m/64, the consumers: 64 query rows each, per key block
//           S = Q K_j^T      wgmma m64n{kBlockN}k16, both operands in shared memory
//           online softmax   in registers (the accumulator is the mma.sync C layout
//                            repeated, so rows reduce over the 4 lanes of a quad)
//           O += P V_j       wgmma m64n{kHeadDim}k16, P from registers (16-bit),
//                            V read MN-major (the transpose-B bit)
//         then O /= l once, LSE, O to global memory.
//   Variants (one hook each, src/cuda/common/fragment.cuh): the ScoreRule (softcap, ALiBi)
//   maps S to log2 units before the mask; dropout zeroes entries of P after the row sum
//   (l sums the undropped P), on the packed 16-bit pairs, and 1/(1 − p) joins 1/l at the
//   end. The dropout keep flags of block j depend only on coordinates: they are drawn while
//   S_j = Q K_j^T runs on the tensor cores, before the wait for it (ptxas then spreads
//   the integer work over the softmax); with the intra-warpgroup overlap, before O +=
//   P_(j-1) V_(j-1) is issued. Dropout is a template flag (kHasDropout, its own
//   tile entries where registers are short: tile_config.hpp): as a runtime branch its
//   draws would cost the default kernel registers. The score rule is a runtime branch
//   beside the fast path, as softcap was.
//   setmaxnreg moves registers from the producer (24-32) to the consumers (240 with two
//   consumer warpgroups, 160 with three).
// Schedules (HopperTileConfig flags; TUNING.md has the measurements):
//   intra-warpgroup overlap  S_j = Q K_j^T is issued with O += P_(j-1) V_(j-1), and the
//                            softmax of block j runs while that PV GEMM does (FA3 3.2);
//   ping-pong                the consumer warpgroups take turns issuing GEMMs (FA3 3.1);
//   persistent grid          one CTA per SM loops over tiles; Q is released after the
//                            mainloop and O stored straight from registers while the
//                            next tile's Q and K load. Without it, one CTA per tile and
//                            O goes through shared memory to 16-byte stores.
//                            Which tiles: blockIdx.x first, then either blockIdx.x +
//                            k gridDim.x (static: tiles of equal work) or, when the launch
//                            passes a tile counter (causal, local, varlen: unequal tiles),
//                            the next tile of the flat order (per (batch, head) its last,
//                            heaviest query tiles first) taken with one atomic when the
//                            CTA starts a tile — the hardware's block scheduling without
//                            the per-tile prologue and epilogue. A producer lane
//                            takes the tile, decodes it once and hands it (its number
//                            and TileRecord) to the loader, the storer and the
//                            consumers through a two-slot queue in shared memory
//                            (tile_full / tile_empty).
//   tile overlap             (persistent kernels, FLASHATTN_CUDA_HOPPER_EPILOGUE=tma_overlap,
//                            launch.hpp; off by default until timed) tiles run back to
//                            back across their boundary, as FA3's: with two Q buffers
//                            (overlaps_with_two_q_buffers: d128, d64 block_m 128, no
//                            dropout) tile t + 1's Q loads into the other buffer during
//                            tile t; after tile t's last P V the consumers stage its O in
//                            tile t's Q buffer (stmatrix) and go straight on to tile t + 1,
//                            whose Q and K_0 are in place; a storer lane of the producer
//                            warpgroup stores the staged O with the TMA (64-row boxes per
//                            consumer warpgroup) as soon as it is staged, and hands the
//                            buffer to the loader (Q of tile t + 2) once the store has
//                            read it. With one buffer (no room or no registers
//                            to spare) Q is released after the last S = Q K^T instead of
//                            the last P V, so the next Q loads during that P V.
//
// Shared-memory tiles are stored as 64-column panels (128 bytes per row, the TMA/wgmma
// 128-byte swizzle: 16-byte chunk c of row r lives at chunk c ^ (r % 8) of its 1024-byte
// 8-row atom); panel p of a (rows, d) tile starts at p * rows * 128 bytes.
//
// Masks beyond MaskRule (attn_mask, block mask; src/core/mask_tables.hpp): when the
// launch passes the device mask's tile lists, a tile's key blocks are its list (in list
// order, descending like the interval range) instead of the interval range, for the
// producer and the consumers alike: both read the same entry `index` of the same list,
// so the rings stay in lock-step. Partial entries take fragment::apply_mask (the whole
// element pass: sequence ends, interval rule, block mask, attn_mask), its fast form on a
// tile code, or (a block mask without bits; FLASHATTN_CUDA_MASKS_ROW_INTERVALS=0 turns it
// off) one key interval per query row made once per tile (fragment::RowKeyInterval); full
// ones no mask at all. A runtime branch per tile, not a template flag (no new
// instantiations): masks run the one-CTA-per-tile kernels with two consumer warpgroups
// (ProblemClass::mask_lists), and only those compile the path (HopperTileConfig::has_mask_lists). The
// others sit at the register limit (persistent loops; d64's three consumer warpgroups at
// 160 registers spill already): without the path they stay exactly as they were.
//
// Variable-length batches: the tensor maps span the packed rows; a sequence's tile
// starts at its cu_seqlens offset. Rows of the next sequence that a tile reaches are
// masked (keys: n0 + kBlockN > seqlen_k takes the element mask) or not stored
// (queries), exactly like the zero-filled rows past the end of a dense tensor.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cuda/ptx>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "flashattn/dropout.hpp"
#include "flashattn/error.hpp"
#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "flashattn/score.hpp"
#include "src/core/params.hpp"
#include "src/cuda/common/alibi_path.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/common/fragment.cuh"
#include "src/cuda/common/mask_fragment.cuh"
#include "src/cuda/common/named_barriers.hpp"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/common/swizzle.cuh"
#include "src/cuda/common/tma_panels.cuh"
#include "src/cuda/hopper/cta_state.cuh"
#include "src/cuda/hopper/epilogue.cuh"
#include "src/cuda/hopper/launch.hpp"
#include "src/cuda/hopper/mainloop.cuh"
#include "src/cuda/hopper/tile_config.hpp"
#include "src/cuda/hopper/tile_queue.cuh"
#include "src/cuda/hopper/tile_scheduler.cuh"
#include "src/cuda/ptx/bulk_reduce.cuh"
#include "src/cuda/ptx/math.cuh"
#include "src/cuda/ptx/mbarrier.cuh"
#include "src/cuda/ptx/named_barrier.cuh"
#include "src/cuda/ptx/stmatrix.cuh"
#include "src/cuda/ptx/warpgroup.cuh"
#include "src/cuda/ptx/wgmma.cuh"

namespace flashattn::cuda::hopper {

// Named barriers (common/named_barriers.hpp): per consumer warpgroup, its epilogue and
// its GEMM turn of the ping-pong schedule.
static_assert(static_cast<int>(NamedBarrier::kTurnFirst) ==
                  static_cast<int>(NamedBarrier::kConsumerEpilogueFirst) + kMaxConsumerWarpgroups,
              "one epilogue barrier per consumer warpgroup, then the turns");
// The late claim's marks on the tile queue (NamedTileMarks, tile_queue.cuh): a pair per
// reader — the loader, the storer, each consumer warpgroup.
inline constexpr int kTileQueueReaders = 2 + kMaxConsumerWarpgroups;
static_assert(static_cast<int>(NamedBarrier::kTileSlotWrittenFirst) == static_cast<int>(NamedBarrier::kTurnFirst) + 2 &&
                  static_cast<int>(NamedBarrier::kTileSlotReadFirst) ==
                      static_cast<int>(NamedBarrier::kTileSlotWrittenFirst) + kTileQueueReaders &&
                  static_cast<int>(NamedBarrier::kTileSlotReadFirst) + kTileQueueReaders <= 16,
              "the tile queue's barriers after the turns, one per reader and direction, within ids 1..15");

template <class T, int kHeadDimArg, int kBlockMArg, int kBlockNArg, int kStagesArg, bool kIntraOverlapArg,
          bool kPingPongArg, bool kPersistentArg, bool kHasDropout>
__global__ void __launch_bounds__(ptx::kWarpgroupThreads * (1 + kBlockMArg / ptx::kWarpgroupRows), 1)
    forward_kernel_sm90(const __grid_constant__ HopperForwardParams params) {
#if FLASHATTN_HOPPER_DEVICE_CODE
  constexpr HopperTileConfig kConfig{kHeadDimArg, kBlockMArg, kBlockNArg, kStagesArg,
                                     kIntraOverlapArg, kPingPongArg, kPersistentArg};
  using Kernel = KernelSpec<T, kConfig, kHasDropout>;  // what the role types are instantiated for
  constexpr int kHeadDim = kConfig.kernel_head_dim;
  constexpr int kBlockM = kConfig.block_m;
  constexpr int kBlockN = kConfig.block_n;
  constexpr int kStages = kConfig.stages;
  constexpr int kPanels = kConfig.panels();
  constexpr int kQBytes = kConfig.q_bytes();
  constexpr int kKVBytes = kConfig.kv_tile_bytes();
  constexpr int kConsumerWarpgroups = kConfig.consumer_warpgroups();
  static_assert(kBlockM % ptx::kWarpgroupRows == 0 && kConsumerWarpgroups >= 1 &&
                    kConsumerWarpgroups <= kMaxConsumerWarpgroups,
                "each consumer warpgroup owns 64 query rows");
  static_assert(ptx::kWarpgroupThreads * kConfig.producer_registers() +
                    ptx::kWarpgroupThreads * kConsumerWarpgroups * kConfig.consumer_registers() <=
                65536,
                "register file: 64K 32-bit registers per SM");
  static_assert(!kPingPongArg || kConsumerWarpgroups == 2, "the ping-pong schedule alternates two warpgroups");
  static_assert(kHeadDim % kPanelColumns == 0, "tiles are whole 64-column panels");
  static_assert(kPanelColumns == kSwizzlePanelColumns, "load_panels and the descriptors: the same panels");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma N: multiple of 16 (P's k16 steps), at most 256");
  static_assert(kConfig.shared_bytes() <= kMaxSharedBytes, "tiles exceed 227 KB of shared memory");
  static_assert(!kPingPongArg || kIntraOverlapArg, "ping-pong is built on the overlapped mainloop");
  static_assert(kOutputStoreRows == ptx::kWarpgroupRows, "out's TMA store box: one consumer warpgroup's rows");

  const AttentionParams& attention = params.attention;
  // Tiles: one running index, mapped by params.tile_order (tile_order.hpp) — flat: query
  // tile fastest, the last query tiles (the most keys under a causal mask) first, as in
  // the FA2 kernel. A CTA runs tiles blockIdx.x, then blockIdx.x + gridDim.x, ... or the
  // dynamic scheduler's: one tile, or several when the launch is persistent.
  const std::int64_t num_m_blocks = (attention.seqlen_q + kBlockM - 1) / kBlockM;
  const std::int64_t num_tiles = num_m_blocks * attention.heads_q * attention.batch;
  // The device mask's key-tile lists (absent without attn_mask / block mask; read only
  // by the kernels of ProblemClass::mask_lists, see the header).
  constexpr bool kHasDeviceMask = kConfig.has_mask_lists();
  const TileLists& key_lists = attention.device_mask.by_query_tile;
  // A tile number to its tile (Tile, tile_scheduler.cuh); false for a tile past its
  // (varlen) sequence's end: it has no rows and is skipped. Persistent kernels: called by
  // the scheduler lane only, once per tile (the others read its TileRecord); one-tile
  // kernels: by every role. A lambda of the kernel,
  // not a method of a tile_scheduler.cuh type: moved there (same body, called the same
  // way) it moved the persistent kernels' code (PTX: the tile order's arithmetic split
  // across its branches; SASS of bf16 d128 +8 instructions, spills 28/36 -> 24/32 bytes),
  // and none of the formulations tried kept it in place (hopper/TUNING.md).
  auto decode_tile = [&](std::int64_t linear, Tile& tile) {
    const TileOrder::Coordinates coordinates = params.tile_order.at(static_cast<std::int32_t>(linear));
    const std::int64_t m_block = coordinates.m_block;
    // In 32 bits (heads_q * batch <= the tile count, which the launch keeps below 2^31):
    // the 64-bit division was a subroutine call, whose spills around it the
    // 24-register scheduler lane paid (ptxas -v).
    const std::int32_t heads_q = static_cast<std::int32_t>(attention.heads_q);
    tile.head = coordinates.head_batch % heads_q;
    tile.batch = coordinates.head_batch / heads_q;
    tile.seqlen_q = attention.seqlen_q_of(tile.batch);
    tile.m0 = m_block * kBlockM;
    if (tile.m0 >= tile.seqlen_q) return false;
    tile.seqlen_k = attention.seqlen_k_of(tile.batch);
    tile.row_end = tile.m0 + kBlockM < tile.seqlen_q ? tile.m0 + kBlockM : tile.seqlen_q;
    tile.mask = attention.mask_of(tile.batch);
    // Block indices in unsigned 32 bits: every column bound here lies in [0, seqlen_k] and
    // keys are below 2^31 - 256 (the launch's tensor-map check), so the quotients are the
    // 64-bit ones. 64-bit divisions by a block_n that is not a power of two (d256: 80)
    // cost the 24-register producer lanes, which decode, spills (ptxas -v).
    const auto block_of = [](std::int64_t column) { return static_cast<std::uint32_t>(column) / kBlockN; };
    const auto blocks_below = [](std::int64_t column) {
      return (static_cast<std::uint32_t>(column) + kBlockN - 1) / kBlockN;
    };
    const MaskRule::ColumnRange columns = tile.mask.columns_of_rows(tile.m0, tile.row_end);
    tile.n_block_end = blocks_below(columns.end);
    tile.num_n_blocks = columns.end > columns.begin ? static_cast<int>(tile.n_block_end - block_of(columns.begin)) : 0;
    // MaskRule::full_key_blocks (the whole blocks inside columns_of_all_rows; the tile has
    // rows) in those 32 bits. Visit index i is block n_block_end - 1 - i: the full blocks
    // [begin, end) are the indices [n_block_end - end, n_block_end - begin).
    const MaskRule::ColumnRange all_rows = tile.mask.columns_of_all_rows(tile.m0, tile.row_end);
    const std::uint32_t full_begin = blocks_below(all_rows.begin);
    const std::uint32_t full_end = block_of(all_rows.end) > full_begin ? block_of(all_rows.end) : full_begin;
    tile.masked_leading_blocks = static_cast<int>(tile.n_block_end - full_end);
    tile.full_blocks = static_cast<int>(full_end - full_begin);
    tile.key_list = -1;
    if (kHasDeviceMask && key_lists.present()) {
      // The list was built for (block_m, block_n) (launch_forward_sm90 checks) with the
      // interval rule folded in; an empty one is a tile without keys (O = 0, LSE -inf).
      tile.key_list = key_lists.list(tile.batch, tile.head, m_block);
      tile.num_n_blocks = key_lists.count(tile.key_list);
    }
    return true;
  };
  // Key block `index` of a tile's visit order (KeyBlock, tile_scheduler.cuh): the interval
  // range from n_block_end - 1 down, or the device mask's list. The producer and the
  // consumers read the same list entries, so the rings stay in lock-step. Lambdas of the
  // kernel like decode_tile: as methods they moved the code (bf16 d256 persistent: the
  // block_n 80 products reassociated, PTX and SASS).
  auto is_listed = [&](const Tile& tile) { return kHasDeviceMask && tile.key_list >= 0; };
  auto key_block = [&](const Tile& tile, int index) {
    if (is_listed(tile)) {
      const TileEntry entry = key_lists.entry(tile.key_list, index);
      const std::int64_t n0 = static_cast<std::int64_t>(entry.tile) * kBlockN;
      return KeyBlock{n0, entry.partial || n0 + kBlockN > tile.seqlen_k,
                      entry.partial ? key_lists.code(tile.key_list, index) : kGeneralTile};
    }
    // Outside [masked_leading_blocks, + full_blocks), as one unsigned compare (an empty
    // full range: every block; a negative difference wraps to a large value).
    const bool is_partial = static_cast<unsigned>(index - tile.masked_leading_blocks) >=
                            static_cast<unsigned>(tile.full_blocks);
    return KeyBlock{(tile.n_block_end - 1 - index) * kBlockN, is_partial, kGeneralTile};
  };

  // Tiles 1024-byte aligned (the swizzle atom; the descriptors' base offset is 0).
  extern __shared__ unsigned char shared_storage[];
  const std::uint32_t raw_address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_storage));
  unsigned char* shared_base =
      shared_storage + ((kSwizzleAtomBytes - raw_address % kSwizzleAtomBytes) % kSwizzleAtomBytes);
  T* shared_q = reinterpret_cast<T*>(shared_base);                   // (kBlockM, kHeadDim) in panels
  T* shared_k = shared_q + kBlockM * kHeadDim;                       // kStages x (kBlockN, kHeadDim)
  T* shared_v = shared_k + kStages * kBlockN * kHeadDim;             // kStages x (kBlockN, kHeadDim)
  auto* barriers = reinterpret_cast<std::uint64_t*>(shared_v + kStages * kBlockN * kHeadDim);
  // The tile-overlap schedule's second Q buffer (tile_config.hpp: after the mbarriers,
  // where the launch gave the shared memory for it: has_two_q_buffers below).
  constexpr bool kHasTwoQBuffers = overlaps_with_two_q_buffers(kConfig, kHasDropout);
  static_assert(kConfig.second_q_offset() ==
                    kQBytes + 2 * kStages * kKVBytes + static_cast<int>(kSwizzleAtomBytes),
                "the second Q buffer starts one swizzle atom after the K/V rings (past the mbarriers)");
  // Q buffer `buffer` (0 or 1): (kBlockM, kHeadDim) in panels.
  auto q_tile = [&](int buffer) {
    return reinterpret_cast<T*>(shared_base + (buffer == 0 ? 0 : kConfig.second_q_offset()));
  };
  // K and V have their own rings of barriers: with the overlapped mainloop K_j is
  // released (S_j done) one block before V_j (O += P_j V_j done).
  std::uint64_t* q_full = barriers;                      // [2]: Q buffer landed
  std::uint64_t* q_empty = barriers + 2;                 // [2]: every consumer warp is done with the buffer
                                                         //      (persistent, one Q buffer)
  std::uint64_t* o_full = barriers + 4;                  // [2]: every consumer warp is done with the buffer,
                                                         //      its O staged (two Q buffers)
  std::uint64_t* k_full = barriers + 6;                  // [kStages]: K stage landed
  std::uint64_t* v_full = barriers + 6 + kStages;        // [kStages]: V stage landed
  std::uint64_t* k_empty = barriers + 6 + 2 * kStages;   // [kStages]: every consumer warp is done with it
  std::uint64_t* v_empty = barriers + 6 + 3 * kStages;   // [kStages]
  // Persistent launches: the tile queue, two slots of tile indices (the producer takes
  // tile t + 1 while the consumers still read t's slot).
  std::uint64_t* tile_full = barriers + 6 + 4 * kStages;   // [2]: the slot holds the next tile
  std::uint64_t* tile_empty = barriers + 8 + 4 * kStages;  // [2]: the loader and every consumer warp read it
  auto* tile_slots = reinterpret_cast<std::int32_t*>(barriers + 10 + 4 * kStages);  // [2]
  // Beside the slots, the decoded tiles (TileRecord, tile_scheduler.cuh): after the 256
  // bytes of the mbarriers, where the mask lists' row intervals are in the kernels that
  // have them (never persistent).
  auto* tile_records = reinterpret_cast<TileRecord*>(reinterpret_cast<unsigned char*>(barriers) + 256);  // [2]
  static_assert(!kPersistentArg || kConfig.tile_record_bytes() >= kTileRecordsBytes,
                "persistent kernels: shared memory for the tile records");
  const TileQueue<TileRecord> queue{tile_full, tile_empty, tile_slots, tile_records};  // tile_queue.cuh
  const NamedTileMarks named_marks{static_cast<int>(NamedBarrier::kTileSlotWrittenFirst),
                                   static_cast<int>(NamedBarrier::kTileSlotReadFirst)};
  // Two Q buffers: where the O staged in buffer b goes (StoreHeader, epilogue.cuh).
  auto* store_headers = reinterpret_cast<StoreHeader*>(tile_slots + 2);  // [2]
  // The mask lists' row intervals (kernels with has_mask_lists; see apply_device_mask):
  // [kBlockM], one per query row of the tile, after the 256 bytes of the mbarriers.
  auto* row_intervals = reinterpret_cast<fragment::RowKeyInterval*>(reinterpret_cast<unsigned char*>(barriers) + 256);
  static_assert(kConfig.row_interval_bytes() == (kConfig.has_mask_lists() ? kBlockM * sizeof(fragment::RowKeyInterval) : 0),
                "one row interval per query row of the tile");
  constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
  static_assert((10 + 4 * kStages) * 8 + 2 * 4 + 2 * 16 <= 256,
                "mbarriers, tile slots and store headers exceed their 256 bytes");

  // The tile-overlap schedule (HopperEpilogue::tma_overlap, launch.hpp), where this
  // kernel has it (can_overlap_tiles) and the launch asks for it. With two Q buffers
  // (the launch gave the shared memory for them) tile t runs in buffer t % 2; with one,
  // Q is released after the tile's last S = Q K^T instead of its last P V.
  const bool is_tile_overlap = can_overlap_tiles(kConfig) && params.is_tile_overlap;
  const bool has_two_q_buffers = kHasTwoQBuffers && is_tile_overlap;
  // The Q buffer of the CTA's tile number `count`, and how often that buffer was used before.
  auto q_buffer_of = [&](int count) { return has_two_q_buffers ? count & 1 : 0; };
  auto q_use_of = [&](int count) { return has_two_q_buffers ? count >> 1 : count; };
  // The tile queue of persistent launches (TileQueueMode, launch.hpp; TileDistribution,
  // tile_scheduler.cuh): whether the scheduler claims a tile only once the previous one
  // has started (the late claim), and whether every put and take also passes the named
  // marks. Their readers: the loader, the storer (two Q buffers), each consumer warpgroup.
  const bool is_late_claim = kPersistentArg && params.tile_queue_mode != TileQueueMode::early_claim;
  const bool has_named_marks = kPersistentArg && params.tile_queue_mode == TileQueueMode::late_claim;
  using Distribution = TileDistribution<kConsumerWarpgroups>;
  const Distribution distribution{queue, named_marks, is_late_claim, has_named_marks};

  if (threadIdx.x == 0) {
    for (int buffer = 0; buffer < 2; ++buffer) {
      ::cuda::ptx::mbarrier_init(&q_full[buffer], 1);
      // One buffer: every consumer warp; two: the storer, once the buffer's O is stored.
      ::cuda::ptx::mbarrier_init(&q_empty[buffer], has_two_q_buffers ? 1 : kConsumerWarps);
      ::cuda::ptx::mbarrier_init(&o_full[buffer], kConsumerWarps);
    }
    for (int stage = 0; stage < kStages; ++stage) {
      ::cuda::ptx::mbarrier_init(&k_full[stage], 1);
      ::cuda::ptx::mbarrier_init(&v_full[stage], 1);
      ::cuda::ptx::mbarrier_init(&k_empty[stage], kConsumerWarps);
      ::cuda::ptx::mbarrier_init(&v_empty[stage], kConsumerWarps);
    }
    for (int slot = 0; slot < 2; ++slot) {
      ::cuda::ptx::mbarrier_init(&tile_full[slot], 1);
      // + the loader, and the storer with two Q buffers
      ::cuda::ptx::mbarrier_init(&tile_empty[slot], kConsumerWarps + (has_two_q_buffers ? 2 : 1));
    }
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / ptx::kWarpgroupThreads;
  // Varlen tensors are one batch entry whose sequences are row ranges.
  const bool is_varlen = attention.is_varlen();

  if (warpgroup == 0) {
    // ---- producer ----------------------------------------------------------------
    ptx::setmaxnreg_decrease<kConfig.producer_registers()>();
    // Tile indices in 32 bits (the launch checks num_tiles < 2^31).
    const std::int32_t tile_end = static_cast<std::int32_t>(num_tiles);
    if constexpr (kPersistentArg) {
      if (threadIdx.x == 32) {
        // The scheduler lane (one lane of the producer's second warp, so the loader keeps
        // its 24 registers): puts the CTA's tile number `taken` into its slot of the queue —
        // the scheduler's initial tile, then its next ones (tile_scheduler.cuh: static or
        // dynamic, as the launch chose) — and tile_end once none is left. early_claim: the
        // next tile is claimed at once, before its slot is free, so up to three wait beyond
        // the one the consumers run, and at the end of a launch the last (lightest) tiles sit
        // in busy CTAs' queues while other SMs idle. Late claim: only once every reader has
        // taken the tile just put (it has started), so one waits: with the named marks, once
        // each marked reader marked it read (each put is published to them first);
        // late_claim_mbarrier, once the slot's empty barrier completes. After tile_end the
        // marked readers' last marks are waited for too, so that every barrier phase
        // completes. This loop stays in the kernel: moved into a TileDistribution method
        // (or with the scheduler made once before it), the persistent kernels' code moved
        // (PTX register numbering, then SASS; hopper/TUNING.md).
        using Scheduler = PersistentScheduler;
        std::int32_t linear = Scheduler{tile_end, params.maybe_tile_counter}.initial_tile();
        const int marked_readers = distribution.marked_readers(has_two_q_buffers);
        for (int taken = 0;; ++taken) {
          // The tile decoded here, once for the CTA (TileRecord): its readers take the
          // record. Tiles without rows (past a varlen sequence's end) are skipped here,
          // for every reader, and the next one claimed.
          Tile tile{};
          bool is_valid = Scheduler{tile_end, params.maybe_tile_counter}.is_valid(linear);
          while (is_valid && !decode_tile(linear, tile)) {
            linear = Scheduler{tile_end, params.maybe_tile_counter}.next_tile(linear);
            is_valid = Scheduler{tile_end, params.maybe_tile_counter}.is_valid(linear);
          }
          queue.wait_free(taken);  // with the marks already done: its readers marked taken - 1 read
          queue.put(taken, is_valid ? linear : tile_end, TileRecord::of(tile));
          distribution.publish(marked_readers);
          if (!is_valid) {
            distribution.wait_read(marked_readers);
            return;
          }
          distribution.wait_read(marked_readers);
          if (is_late_claim && marked_readers == 0) queue.wait_free(taken + 2);
          linear = Scheduler{tile_end, params.maybe_tile_counter}.next_tile(linear);
        }
      }
    }
    if constexpr (kHasTwoQBuffers) {
      if (threadIdx.x == 64 && has_two_q_buffers) {
        // Two Q buffers: the O of the CTA's tile number `count`, staged by the consumers in
        // its Q buffer, to out (epilogue.cuh).
        const OutputStorer<T, kConfig> storer{params, shared_base, o_full, store_headers, has_named_marks, is_varlen};
        // The storer (one lane of the producer's third warp): takes the CTA's tiles like
        // the loader and the consumers; stores each tile's O as soon as every consumer
        // warp has staged it, and hands the buffer back to the loader (q_empty) once the
        // store has read it — for Q of the tile after next, loaded about a tile later.
        int count = 0;
        for (int taken = 0;; ++taken) {
          TileRecord record;
          const std::int32_t linear = distribution.take(taken, Distribution::kStorerReader, std::true_type{}, record);
          if (linear >= tile_end) break;
          storer.store(count, record.tile(attention.window_left, attention.window_right));
          ptx::bulk_wait_group_read<0>();
          ::cuda::ptx::mbarrier_arrive(&q_empty[count & 1]);
          ++count;
        }
        ptx::bulk_wait_group<0>();  // the last stores complete before the CTA's shared memory goes
        return;
      }
    }
    if (threadIdx.x != 0) return;
    int tile_count = 0;   // tiles run so far by this CTA: Q's buffer and phase
    int block_base = 0;   // K/V blocks loaded for earlier tiles: the rings' position
    for (int taken = 0;; ++taken) {
      // One tile per CTA: SingleTileScheduler's; persistent: the queue's (the scheduler lane's).
      std::int32_t linear = SingleTileScheduler::initial_tile();
      TileRecord record;
      if constexpr (kPersistentArg) {
        linear = distribution.take(taken, Distribution::kLoaderReader, std::true_type{}, record);
      } else if (taken > 0) {
        break;
      }
      if (linear >= tile_end) break;
      Tile tile;
      if constexpr (kPersistentArg) {
        tile = record.tile(attention.window_left, attention.window_right);  // decoded by the scheduler lane
      } else if (!decode_tile(linear, tile)) {
        continue;
      }
      const std::int32_t batch_coordinate = is_varlen ? 0 : static_cast<std::int32_t>(tile.batch);
      // The tile's Q buffer released after its previous use (persistent launches): by
      // every consumer warp, or with two buffers by the storer once the O staged there
      // (tile_count - 2) is stored. The header tells the storer where this tile's O goes
      // (written before Q is loaded, read after the consumers' o_full: ordered through them;
      // with the named marks the storer makes it from the tile's record instead, the
      // header goes unread).
      const int q_buffer = q_buffer_of(tile_count);
      const int q_use = q_use_of(tile_count);
      if (q_use > 0) ptx::mbarrier_wait(&q_empty[q_buffer], (q_use - 1) & 1);
      const std::int32_t q_row = static_cast<std::int32_t>(attention.q_start(tile.batch) + tile.m0);
      if (has_two_q_buffers)
        store_headers[q_buffer] = StoreHeader{q_row, static_cast<std::int32_t>(tile.head), batch_coordinate,
                                              static_cast<std::int32_t>(tile.row_end - tile.m0)};
      ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                             ::cuda::ptx::space_shared, &q_full[q_buffer], kQBytes);
      load_panels<kPanels, kBlockM>(q_tile(q_buffer), &params.q_map, q_row, static_cast<std::int32_t>(tile.head),
                                    batch_coordinate, &q_full[q_buffer]);
      const std::int64_t k_start = attention.k_start(tile.batch);
      const std::int32_t head_kv = static_cast<std::int32_t>(tile.head / attention.group_size);
      // The tile's K/V blocks into the rings (mainloop.cuh).
      const MainloopLoader<Kernel, decltype(key_block)> loader{block_base, k_start,  key_block,
                                                               tile,       head_kv,  batch_coordinate};
      // The consumers' order: K_0, then K_j before V_(j-1), then the last V.
      const int num_n_blocks = tile.num_n_blocks;
      if (num_n_blocks > 0) loader.load_block(&params.k_map, shared_k, k_full, k_empty, 0);
      for (int index = 1; index < num_n_blocks; ++index) {
        loader.load_block(&params.k_map, shared_k, k_full, k_empty, index);
        loader.load_block(&params.v_map, shared_v, v_full, v_empty, index - 1);
      }
      if (num_n_blocks > 0) loader.load_block(&params.v_map, shared_v, v_full, v_empty, num_n_blocks - 1);
      block_base += num_n_blocks;
      ++tile_count;
    }
    return;
  }

  // ---- consumers -------------------------------------------------------------------
  ptx::setmaxnreg_increase<kConfig.consumer_registers()>();
  const int consumer = warpgroup - 1;
  const int thread_in_warpgroup = threadIdx.x % ptx::kWarpgroupThreads;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;      // accumulator row within an 8-row half
  const int quad_lane = lane % 4;  // accumulator column pair
  const int warpgroup_row0 = consumer * ptx::kWarpgroupRows;
  const int thread_row0 = warpgroup_row0 + (thread_in_warpgroup / 32) * 16 + group;  // + 8 * half
  const ConsumerThread thread{consumer, thread_in_warpgroup, lane, group, quad_lane, warpgroup_row0, thread_row0};

  // Descriptors (see wgmma.cuh). Q and K are K-major (rows of head-dim elements), V is
  // read MN-major for O += P V (rows of head-dim elements indexed by the key).
  const std::uint32_t q_address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_q));
  const std::uint32_t k_address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_k));
  const std::uint32_t v_address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_v));
  const std::uint64_t q_descriptor =
      ptx::make_smem_descriptor(q_address + warpgroup_row0 * kSwizzleRowBytes, 16, kSwizzleAtomBytes,
                                ptx::SwizzleMode::bytes128);
  const std::uint64_t k_descriptor =
      ptx::make_smem_descriptor(k_address, 16, kSwizzleAtomBytes, ptx::SwizzleMode::bytes128);
  const std::uint64_t v_descriptor =
      ptx::make_smem_descriptor(v_address, kBlockN * kSwizzleRowBytes, kSwizzleAtomBytes, ptx::SwizzleMode::bytes128);

  // Fast path (no softcap, no ALiBi): scores stay raw q.k until the exponent, 2^(s *
  // exp_scale - m) is one FFMA + one MUFU per element. Otherwise the tile's ScoreRule
  // maps them to log2 units first (softcap needs the scaled score inside tanh, the ALiBi
  // bias moves the row max).
  const bool is_positive_scale = attention.score_is_positive_scale();
  const float exp_scale = is_positive_scale ? attention.softmax_scale_log2 : 1.0f;
  // A float attn_mask's bias (natural log) in the unit of S: raw q.k on the fast path
  // (exp_scale = softmax_scale log2(e) applies to the sum), else log2 units.
  const float mask_bias_factor =
      is_positive_scale ? 1.0f / attention.softmax_scale : static_cast<float>(online_softmax::kLog2e);
  // Dropout: seed and offset may be device memory (a graph replays fresh ones), read
  // once per CTA. Without dropout inverse_keep is 1.
  const DropoutRule dropout = kHasDropout ? attention.dropout() : DropoutRule{};

  Tile tile{};         // the tile being run
  // ALiBi's affine form on the key blocks this warp's 16 rows see off the diagonal
  // (default: off, every block takes the per-element form). Compiled where it costs no
  // spills: d64 and d128 with two consumer warpgroups (ptxas -v: d256 and d64's three
  // consumer warpgroups of 160 registers spilled 32-72 bytes more with it).
  constexpr bool kHasAffineAlibi = kHeadDim <= 128 && kConsumerWarpgroups == 2;
  // The tile's score rule and ALiBi's affine state for this lane (read only off the fast
  // path): built from the slope (the one memory read), the tile and launch constants.
  struct TileScore {
    ScoreRule rule;
    fragment::AffineBiasLane alibi_lane;  // default: every block straddles (the affine form off)
  };
  auto tile_score_of = [&](float alibi_slope_log2) {
    TileScore score{attention.score_of_slope(alibi_slope_log2, tile.mask), {}};
    if (kHasAffineAlibi && params.is_alibi_affine && score.rule.has_affine_bias()) {
      const std::int64_t warp_row_first = tile.m0 + thread_row0 - group;
      score.alibi_lane = fragment::AffineBiasLane::of(
          score.rule, score.rule.side_bounds(warp_row_first, warp_row_first + 15, kBlockN, tile.mask),
          tile.m0 + thread_row0);
    }
    return score;
  };
  // Persistent kernels keep only the slope across the mainloop and rebuild the rest per
  // key block inside the score-rule branch: kept live, the rule and the affine state sat
  // in every path's registers across the consumers' loop (ptxas -v, bf16 d128 with the
  // tile overlap: 112/92 bytes of spills and a local load of seqlen_k per key block on
  // the fast path; rebuilt: 28/36, all in the producer). One-tile kernels keep the whole
  // state (rebuilt per block, bf16 d128 went from 0/0 to 48/40), and so does d256, which
  // has no affine form (rebuilt, its dropout kernel spilled 8/8 bytes more per tile).
  constexpr bool kRebuildsTileScore = kPersistentArg && kHeadDim <= 128;
  float alibi_slope_log2 = 0.0f;  // log2 units, set only off the fast path
  TileScore tile_score{};         // set only off the fast path, without kRebuildsTileScore
  std::uint32_t dropout_head = 0;  // the tile's (batch, head) in the dropout generator
  int block_base = 0;  // K/V blocks consumed for earlier tiles: the rings' position
  int tile_count = 0;  // tiles run so far: Q's buffer and phase
  float o[kHeadDim / 2];                      // (64, kHeadDim) per warpgroup, fp32 accumulator
  float s[kBlockN / 2];                       // (64, kBlockN) per warpgroup: S, then P in fp32
  std::uint32_t p[kBlockN / 16][4];           // (64, kBlockN) per warpgroup: P as wgmma A fragments
  online_softmax::State<float> row_state[2];  // rows thread_row0 and thread_row0 + 8; l is this
                                              // thread's partial sum until the end
  float row_factor[2];                        // rescale of O for the block just exponentiated
  constexpr int kNTiles = kBlockN / 8;        // n8 tiles of S per warp (the fragment.cuh hooks' unit)
  // Dropout keep flags of S/P, one word per n8 tile: bit 7 of byte 2 half + e of word j is
  // set iff s[4 j + 2 half + e] is kept (fragment::dropout_keep_sign_bytes). One-tile
  // kernels pack four tiles per word (fragment::pack_sign_bytes: 3 more operations per
  // draw, 2 more per 4 pairs): with 16 words live across the softmax their Philox
  // products spilled (ptxas -v, bf16 d128: 156/164 bytes; d64 and d256 20-40) or fell
  // back from IMAD.WIDE to IMAD.HI + IMAD. Persistent kernels keep a word per tile
  // (no spills; SASS per 128-key block in TUNING.md).
  constexpr bool kPacksKeepFlags = !kPersistentArg;
  std::uint32_t keep_flags[kPacksKeepFlags ? (kNTiles + 3) / 4 : kNTiles];

  // S = Q K^T and O += P V of a key block (mainloop.cuh).
  const WarpgroupGemms<Kernel> gemms{has_two_q_buffers, q_descriptor, k_descriptor, v_descriptor, block_base,
                                     tile_count,        s,            o,            p};
  // Dropout keep flags of `block` (coordinates only, no S): the draws are integer
  // work that runs while S = Q K^T is still on the tensor cores. One draw per 16 of the
  // lane's elements (a 32-column block; n0 may be ≡ 16 mod 32 with block_n 80: the
  // straddling draws are made once, fragment::dropout_keep_sign_bytes). convert_p
  // applies them to the packed P (after softmax_block has added the undropped P to l);
  // 1/(1 - p) is applied with 1/l in finish_rows.
  auto draw_keep = [&](const KeyBlock& block) {
    if constexpr (kPacksKeepFlags) {
      std::uint32_t flags[kNTiles];
      fragment::dropout_keep_sign_bytes<kNTiles, kBlockN % 32 == 0>(dropout, dropout_head, tile.m0 + thread_row0,
                                                                    block.n0, fragment::quad_lane(), flags);
      fragment::pack_sign_bytes<kNTiles>(flags, keep_flags);
    } else {
      fragment::dropout_keep_sign_bytes<kNTiles, kBlockN % 32 == 0>(dropout, dropout_head, tile.m0 + thread_row0,
                                                                    block.n0, fragment::quad_lane(), keep_flags);
    }
  };
  // The device mask's element pass (fragment::apply_mask) on a partial listed block,
  // kMaskStepTiles n8 column tiles per step of a rolled loop: each step masks s[0 ..
  // 4 kMaskStepTiles) and rotates S left by that much, so all indices stay compile-time
  // and after the last step S is back in place. Unrolled over the whole block, the pass
  // (block codes, element rule, attn_mask: loads per element) made the d128 object
  // compile in 148 s instead of 9; 4 tiles per step (16 elements' loads in flight)
  // compile in 14.5 s, without spills (ptxas -v; 8 did not spill either, 23 s).
  // The row-interval pass (launch.hpp's FLASHATTN_CUDA_MASKS_ROW_INTERVALS): a listed tile
  // of a block mask without bits has its rows' key intervals (fragment::RowKeyInterval)
  // computed once in consume_tile, into shared memory (held in registers across the key
  // loop they spilled the mask kernels: ptxas -v, bf16 d128 0 -> 56 bytes); its partial
  // blocks of a partial id read their two rows' (a thread whose rows are not one interval
  // each keeps the fast pass: a per-thread flag, set with the intervals; tested on the
  // intervals read back, the fall-through to the fast pass spilled 28 bytes).
  // Compiled where it costs no spills: not into d256's dropout kernel (ptxas -v: 0 -> 16/20
  // bytes), whose masks keep the fast pass.
  constexpr bool kHasRowIntervals = kHasDeviceMask && !(kHasDropout && kHeadDim > 128);
  auto is_row_interval_tile = [&]() {
    if constexpr (!kHasRowIntervals) return false;
    // (a dense attn_mask makes every partial tile kGeneralTile, so its intervals go unused;
    // testing has_attn_mask() here too spilled the mask kernels, ptxas -v d128 0 -> 40/44)
    return params.is_mask_row_intervals && is_listed(tile) && attention.has_block_mask() &&
           !attention.block_mask.rule.has_bits();
  };
  bool has_row_intervals = false;  // the tile's and both of the thread's rows are one interval
  constexpr int kMaskStepTiles = kNTiles % 4 == 0 ? 4 : 2;  // block_n 80: 10 tiles
  static_assert(kNTiles % kMaskStepTiles == 0, "whole steps");
  auto apply_device_mask = [&](std::int64_t n0, std::int32_t code, float bias_factor) {
    if (kHasRowIntervals && code >= 0 && has_row_intervals) {
      // A partial block of a block mask without bits: the rows' intervals, made per tile.
      const fragment::RowKeyInterval rows[2] = {row_intervals[thread_row0], row_intervals[thread_row0 + 8]};
      fragment::apply_row_key_intervals<kNTiles>(s, rows, static_cast<std::int32_t>(n0));
      return;
    }
    if (code != kGeneralTile) {
      // One block code under the tile: spans and bits, loaded once, tested in registers.
      fragment::apply_fragment_mask<kNTiles>(s, attention, tile.mask, code, tile.batch, tile.m0 + thread_row0, n0);
      return;
    }
#pragma unroll 1
    for (int j = 0; j < kNTiles; j += kMaskStepTiles) {
      float step_s[4 * kMaskStepTiles];  // columns n0 + 8 j ..
#pragma unroll
      for (int i = 0; i < 4 * kMaskStepTiles; ++i) step_s[i] = s[i];
      fragment::apply_mask<kMaskStepTiles>(step_s, attention, tile.mask, tile.batch, tile.head, tile.m0 + thread_row0,
                                           n0 + 8 * j, bias_factor);
#pragma unroll
      for (int i = 0; i < 4 * (kNTiles - kMaskStepTiles); ++i) s[i] = s[i + 4 * kMaskStepTiles];
#pragma unroll
      for (int i = 0; i < 4 * kMaskStepTiles; ++i) s[4 * (kNTiles - kMaskStepTiles) + i] = step_s[i];
    }
  };
  // The interval range's element mask of a partial block (softmax_block): one word of
  // allowed elements per row and block (fragment::apply_row_key_intervals: ~1.2
  // instructions an element, ~25 a row), where the per-element form tested each element
  // against the row's bounds clamped to the block in 64 bits (~5 an element; the d64 1k
  // causal diagonal block was 9.7% of the consumers' samples, hopper/TUNING.md "Where the
  // consumers wait"). Not in the one-tile d128 kernel without dropout (masked problems
  // past 2k, mask lists): there every cheaper form tried spilled 48/48 bytes, loaded in
  // the key loop (ptxas -v); it keeps the per-element form.
  constexpr bool kMasksByRowWords = !(kHeadDim == 128 && !kPersistentArg && !kHasDropout);
  // Score rule, element mask, online softmax of `block` (S complete in registers):
  // S becomes P (fp32) and row_factor the rescale O still needs. After the score rule
  // an element's log2 score is score_scale * s + score_offset[half]: on the fast path
  // (exp_scale, 0), with the per-element rule (1, 0), with ALiBi's affine form (the
  // slope, the row's offset); score_scale > 0, so the row max is taken on s and mapped.
  auto softmax_block = [&](const KeyBlock& block) {
    ptx::fence_operands(s);
    const std::int64_t n0 = block.n0;
    float score_scale = exp_scale;
    float score_offset[2] = {0.0f, 0.0f};
    float bias_factor = mask_bias_factor;  // an attn_mask bias in the unit of s
    if (!is_positive_scale) {
      const TileScore score = kRebuildsTileScore ? tile_score_of(alibi_slope_log2) : tile_score;
      const ScoreRule& score_rule = score.rule;
      const fragment::AffineBiasLane& alibi_lane = score.alibi_lane;
      // The side of the diagonal this warp's 16 rows see the block on (a warp-uniform
      // branch; n0 is a 32-bit TMA coordinate).
      const std::int32_t n0_32 = static_cast<std::int32_t>(n0);
      const DiagonalSide side = kHasAffineAlibi ? alibi_lane.side(n0_32) : DiagonalSide::straddles;
      if (side == DiagonalSide::left) {
        fragment::apply_affine_bias<kNTiles, DiagonalSide::left>(s, score_rule, alibi_lane, n0_32, score_offset);
      } else if (side == DiagonalSide::right) {
        fragment::apply_affine_bias<kNTiles, DiagonalSide::right>(s, score_rule, alibi_lane, n0_32, score_offset);
      } else {
        fragment::apply_score_rule<kNTiles, kConsumerWarpgroups == 2>(s, score_rule, tile.m0 + thread_row0, n0);
      }
      if (side != DiagonalSide::straddles) {
        score_scale = score_rule.alibi_slope_log2;
        bias_factor = mask_bias_factor / score_rule.alibi_slope_log2;
      }
    }
    if (is_listed(tile)) {
      if (block.is_partial) apply_device_mask(n0, block.code, bias_factor);  // listed full blocks: no mask at all
    } else if (block.is_partial) {
      // Interval range: the element mask only where the block crosses a mask edge or
      // the end of the keys (key_block's per-tile range, MaskRule::full_key_blocks).
      if constexpr (kMasksByRowWords) {
        // Per row its allowed keys as a RowKeyInterval (col_begin, col_end: in [0,
        // seqlen_k], below 2^31), a word of allowed elements made once per row and block,
        // then one bit test and select per element (fragment::apply_row_key_intervals,
        // the mask lists' row-interval pass; no test for a bound that cannot mask).
        fragment::RowKeyInterval rows[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const std::int64_t row = tile.m0 + thread_row0 + 8 * half;
          rows[half] = {static_cast<std::int32_t>(tile.mask.col_begin(row)),
                        static_cast<std::int32_t>(tile.mask.col_end(row))};
        }
        fragment::apply_row_key_intervals<kNTiles>(s, rows, static_cast<std::int32_t>(n0),
                                                   online_softmax::negative_infinity<float>());
      } else {
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
    }
    // Per row: raise the max, exponentiate in place, add to the running sum.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float block_max = online_softmax::negative_infinity<float>();
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
        block_max = fmaxf(block_max, fmaxf(s[4 * j + 2 * half], s[4 * j + 2 * half + 1]));
      // In log2 units (-inf stays -inf), then across the quad's 4 lanes, which hold the
      // row's columns (the affine form's offsets differ per lane: mapped first).
      block_max = fmaf(block_max, score_scale, score_offset[half]);
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
      online_softmax::State<float>& state = row_state[half];
      row_factor[half] = state.raise_max(block_max);
      const float exponent_offset = score_offset[half] - state.base();
      float block_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float probability = ptx::exp2_approx_ftz(fmaf(s[4 * j + 2 * half + e], score_scale, exponent_offset));
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
  // Two adjacent n8 column tiles of P, packed to 16 bits, are the A fragment of one k16 step.
  // Dropout: each packed pair ANDed with its two elements' keep masks (a dropped entry
  // becomes +0): two integer operations per pair (fragment::kept_pair_mask), where a
  // select per element of the fp32 P took one and a bit test.
  auto convert_p = [&]() {
#pragma unroll
    for (int kp = 0; kp < kBlockN / 16; ++kp) {
      p[kp][0] = pack_pair<T>(s[8 * kp + 0], s[8 * kp + 1]);
      p[kp][1] = pack_pair<T>(s[8 * kp + 2], s[8 * kp + 3]);
      p[kp][2] = pack_pair<T>(s[8 * kp + 4], s[8 * kp + 5]);
      p[kp][3] = pack_pair<T>(s[8 * kp + 6], s[8 * kp + 7]);
      if constexpr (kHasDropout) {
        if constexpr (kPacksKeepFlags) {
          p[kp][0] &= fragment::kept_packed_pair_mask<0>(keep_flags[kp / 2], (2 * kp) % 4);
          p[kp][1] &= fragment::kept_packed_pair_mask<1>(keep_flags[kp / 2], (2 * kp) % 4);
          p[kp][2] &= fragment::kept_packed_pair_mask<0>(keep_flags[kp / 2], (2 * kp + 1) % 4);
          p[kp][3] &= fragment::kept_packed_pair_mask<1>(keep_flags[kp / 2], (2 * kp + 1) % 4);
        } else {
          p[kp][0] &= fragment::kept_pair_mask<0>(keep_flags[2 * kp]);
          p[kp][1] &= fragment::kept_pair_mask<1>(keep_flags[2 * kp]);
          p[kp][2] &= fragment::kept_pair_mask<0>(keep_flags[2 * kp + 1]);
          p[kp][3] &= fragment::kept_pair_mask<1>(keep_flags[2 * kp + 1]);
        }
      }
    }
  };
  // This warp no longer reads the stage of block `index`: the producer may refill it.
  auto release = [&](std::uint64_t* empty, int index) {
    if (lane == 0) ::cuda::ptx::mbarrier_arrive(&empty[(block_base + index) % kStages]);
  };
  auto wait_k = [&](int index) {
    const int position = block_base + index;
    ptx::mbarrier_wait(&k_full[position % kStages], (position / kStages) & 1);
  };
  auto wait_v = [&](int index) {
    const int position = block_base + index;
    ptx::mbarrier_wait(&v_full[position % kStages], (position / kStages) & 1);
  };

  // Ping-pong (FA3 section 3.1): the two consumer warpgroups take turns issuing their
  // GEMMs, so one's softmax runs while the other's GEMMs occupy the tensor cores. Turn
  // barrier of warpgroup c: its 128 threads sync, the other's 128 arrive. Consumer 1
  // opens consumer 0's first turn and skips its own last hand-over, so every barrier
  // completes exactly as often as it is waited on.
  const int my_turn = static_cast<int>(NamedBarrier::kTurnFirst) + consumer;
  const int other_turn = static_cast<int>(NamedBarrier::kTurnFirst) + (1 - consumer);
  int gemm_rounds = 0;  // per tile: block 0's QK, then (QK, PV) pairs, then the last PV
  int round = 0;
  const PingPongTurns<Kernel> turns =  // mainloop.cuh
      ping_pong_turns<Kernel>(my_turn, round, consumer, gemm_rounds, other_turn);

  // ---- epilogue: normalise once, LSE, O (epilogue.cuh) -------------------------------
  const Epilogue<T, kConfig> epilogue{params,    thread,   dropout.inverse_keep, attention.maybe_lse,
                                      shared_q,  q_address, o_full,             is_varlen};
  using OutputTile = typename Epilogue<T, kConfig>::Tile;

  // ---- Q buffer releases (persistent launches) ----------------------------------------
  // One arrival per consumer warp and tile. One buffer: on q_empty, after the tile's last
  // P V (every wgmma done), or with the tile overlap (is_q_released_early) after the last
  // S = Q K^T, before the last P V is waited for: the next Q loads during that P V and
  // the epilogue. Two buffers: on o_full once O is staged (stage_output).
  const bool is_q_released_early = is_tile_overlap && !has_two_q_buffers;
  auto release_q = [&](int buffer) {
    if (lane == 0) ::cuda::ptx::mbarrier_arrive(&q_empty[buffer]);
  };
  // One tile's mainloop; O and row_state hold the unnormalised result after it.
  auto consume_tile = [&]() {
    const int num_n_blocks = tile.num_n_blocks;
    const int q_buffer = q_buffer_of(tile_count);
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.0f;
    row_state[0] = online_softmax::State<float>{};
    row_state[1] = online_softmax::State<float>{};
    if (!is_positive_scale) {
      alibi_slope_log2 = attention.alibi_slope_log2_of(tile.batch, tile.head);
      if constexpr (!kRebuildsTileScore) tile_score = tile_score_of(alibi_slope_log2);
    }
    if constexpr (kHasDropout) dropout_head = attention.dropout_head(tile.batch, tile.head);
    if constexpr (kHasDeviceMask) {
      // Made while Q lands (the row-interval pass, see apply_device_mask). The warp's 16
      // rows are its own: lane quad 0 of each row writes it, the warp reads it.
      has_row_intervals = is_row_interval_tile();
      if (has_row_intervals) {
        __syncwarp();
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const fragment::RowKeyInterval interval =
              fragment::row_key_interval(attention, tile.mask, tile.batch, tile.m0 + thread_row0 + 8 * half);
          if (quad_lane == 0) row_intervals[thread_row0 + 8 * half] = interval;
          has_row_intervals = has_row_intervals && interval.begin != fragment::RowKeyInterval::kNone;
        }
        __syncwarp();
      }
    }
    ptx::mbarrier_wait(&q_full[q_buffer], q_use_of(tile_count) & 1);
    if constexpr (kPingPongArg) {
      gemm_rounds = num_n_blocks + 1;
      round = 0;
      if (consumer == 1 && num_n_blocks > 0) ptx::named_barrier_arrive(other_turn, 2 * ptx::kWarpgroupThreads);
    }
    if constexpr (kIntraOverlapArg) {
      // Software pipeline (FA3 section 3.2): S_(j) = Q K_j^T is issued before the softmax
      // of block j-1 finishes being used, so that softmax overlaps O += P_(j-1) V_(j-1).
      // Each block's list entry is read before its K wait: the load hides behind it.
      if (num_n_blocks > 0) {
        const KeyBlock block = key_block(tile, 0);
        wait_k(0);
        turns.begin_turn();
        gemms.issue_qk(0);
        turns.end_turn();
        if constexpr (kHasDropout) draw_keep(block);
        ptx::wgmma_wait_group<0>();
        release(k_empty, 0);
        softmax_block(block);
        rescale_o();
        convert_p();
      }
      for (int index = 1; index < num_n_blocks; ++index) {
        const KeyBlock block = key_block(tile, index);
        wait_k(index);
        wait_v(index - 1);
        turns.begin_turn();
        gemms.issue_qk(index);
        // Dropout's draws between the two issues, while only S = Q K^T runs: drawn after
        // O += P V was issued (its A operand, P, read from registers while it runs), the
        // forward ran 6-12% slower (H200, 2026-11-27; ncu: dispatch and gmma stalls 3x the
        // dropout-free kernel's; TUNING.md).
        if constexpr (kHasDropout) draw_keep(block);
        gemms.issue_pv(index - 1);
        turns.end_turn();
        ptx::wgmma_wait_group<1>();  // S_(index) done, O += P V still running
        release(k_empty, index);
        softmax_block(block);
        ptx::wgmma_wait_group<0>();
        ptx::fence_operands(o);
        release(v_empty, index - 1);
        rescale_o();
        convert_p();
      }
      if (num_n_blocks > 0) {
        wait_v(num_n_blocks - 1);
        turns.begin_turn();
        gemms.issue_pv(num_n_blocks - 1);
        turns.end_turn();
        if (is_q_released_early) release_q(q_buffer);  // every S = Q K^T of the tile is done
        ptx::wgmma_wait_group<0>();
        ptx::fence_operands(o);
        release(v_empty, num_n_blocks - 1);
      }
    } else {
      for (int index = 0; index < num_n_blocks; ++index) {
        const KeyBlock block = key_block(tile, index);
        wait_k(index);
        gemms.issue_qk(index);
        if constexpr (kHasDropout) draw_keep(block);
        ptx::wgmma_wait_group<0>();
        release(k_empty, index);
        softmax_block(block);
        rescale_o();
        convert_p();
        wait_v(index);
        gemms.issue_pv(index);
        ptx::wgmma_wait_group<0>();
        ptx::fence_operands(o);
        release(v_empty, index);
      }
    }
  };
  // Without a persistent grid there is no loop at all (one tile per CTA): the loop
  // would keep more values live across the mainloop (measured: spills at d256).
  if constexpr (kPersistentArg) {
    int taken = 0;
    // num_tiles in 32 bits from two launch parameters: kept in registers across the loop
    // (or spilled), the 64-bit num_tiles cost the consumers a reload per tile (ptxas).
    const std::int32_t tile_end = params.tile_order.num_m_blocks * params.tile_order.num_heads_batches;
    // The CTA's next tile (the scheduler lane put only tiles with rows, decoded: TileRecord),
    // into `tile`; false once none is left.
    auto take_next_tile = [&]() {
      TileRecord record;
      const std::int32_t linear =
          distribution.take(taken++, Distribution::kFirstConsumerReader + consumer, std::false_type{}, record);
      if (linear >= tile_end) return false;
      tile = record.tile(attention.window_left, attention.window_right);
      return true;
    };
    for (bool has_tile = take_next_tile(); has_tile; has_tile = take_next_tile()) {
      consume_tile();
      if (has_two_q_buffers) {
        // Tile t + 1's Q (loaded during tile t into the other buffer) and K_0 are in place
        // once tile t's O is staged in tile t's Q buffer; its store drains while tile t + 1
        // runs.
        epilogue.stage(OutputTile::of(tile), q_buffer_of(tile_count), o, row_state);
      } else {
        // Every wgmma of this warp is complete: the producer may load the next tile's Q
        // (if it has not already) while this warp stores O straight from registers.
        if (!is_q_released_early || tile.num_n_blocks == 0) release_q(0);
        epilogue.store_from_registers(OutputTile::of(tile), o, row_state);
      }
      block_base += tile.num_n_blocks;
      ++tile_count;
    }
  } else {
    if (decode_tile(SingleTileScheduler::initial_tile(), tile)) {
      consume_tile();
      epilogue.store_through_shared_memory(OutputTile::of(tile), o, row_state);
    }
  }
#endif
}

// Multiprocessors of a device, asked once per device index (the dispatch stays in the
// microseconds).
inline int multiprocessor_count(int device) {
  constexpr int kMaxCachedDevices = 64;
  static std::atomic<int> cached[kMaxCachedDevices];
  if (device < 0 || device >= kMaxCachedDevices) {
    int count = 0;
    FLASHATTN_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }
  int count = cached[device].load(std::memory_order_relaxed);
  if (count == 0) {
    FLASHATTN_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    cached[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

// Launches forward_kernel_sm90 with kConfig's tile shape for already validated params
// (their device mask's lists, if any, built for kConfig's tiles: hopper::forward).
// No allocation, no synchronisation; launch errors throw CudaError.
template <class T, HopperTileConfig kConfig, bool kHasDropout>
void launch_forward_sm90(const HopperForwardParams& params, cudaStream_t stream) {
  const AttentionParams& attention = params.attention;
  const TileLists& key_lists = attention.device_mask.by_query_tile;
  if (key_lists.present() && (!kConfig.has_mask_lists() || key_lists.outer_tile_size != kConfig.block_m ||
                              key_lists.inner_tile_size != kConfig.block_n))
    throw std::logic_error("flashattn: flash3 forward: mask lists built for tiles (" +
                           std::to_string(key_lists.outer_tile_size) + ", " +
                           std::to_string(key_lists.inner_tile_size) + ") reached the kernel of tiles (" +
                           std::to_string(kConfig.block_m) + ", " + std::to_string(kConfig.block_n) +
                           (kConfig.has_mask_lists() ? ")" : "), which has no mask path"));
  const std::int64_t num_m_blocks = (attention.seqlen_q + kConfig.block_m - 1) / kConfig.block_m;
  const std::int64_t num_tiles = num_m_blocks * attention.heads_q * attention.batch;
  if (num_tiles == 0) return;
  int device = 0;
  FLASHATTN_CUDA_CHECK(cudaGetDevice(&device));
  // Persistent: one CTA per SM (shared memory and registers allow no second), each
  // running tiles blockIdx.x, blockIdx.x + gridDim.x, ...
  const std::int64_t num_ctas =
      kConfig.is_persistent ? std::min<std::int64_t>(num_tiles, multiprocessor_count(device)) : num_tiles;
  // Tile indices are 32-bit in the kernel, including the next index a persistent CTA
  // computes (up to num_tiles + gridDim.x).
  if (num_tiles + (kConfig.is_persistent ? num_ctas : 0) > INT_MAX)
    throw NotSupported("flashattn: q: too many query tiles x heads x batch for one launch (" +
                       std::to_string(num_tiles) + " tiles)");
  // The tiles' order (tile_order.hpp): flat, or L2 sections for the dynamic scheduler.
  HopperForwardParams launch_params = params;
  launch_params.tile_order = TileOrder{static_cast<std::int32_t>(num_m_blocks),
                                       static_cast<std::int32_t>(attention.heads_q * attention.batch), 0};
  launch_params.is_alibi_affine = is_affine_alibi_enabled();
  launch_params.is_mask_row_intervals = kConfig.has_mask_lists() && are_mask_row_intervals_enabled();
  if (kConfig.is_persistent && params.maybe_tile_counter != nullptr && is_l2_section_order_requested())
    launch_params.tile_order.section_heads = l2_section_heads(
        attention.seqlen_k * kConfig.kernel_head_dim * 2 * kConfig.element_bytes, static_cast<std::int32_t>(attention.group_size));
  // The tile-overlap schedule where requested and this kernel has it; its second Q
  // buffer where shared memory has room (tile_config.hpp).
  launch_params.is_tile_overlap = can_overlap_tiles(kConfig) && requested_epilogue() == HopperEpilogue::tma_overlap;
  launch_params.tile_queue_mode = requested_tile_queue_mode();
  constexpr int kSharedBytes = kConfig.shared_bytes();
  constexpr int kMaxKernelSharedBytes =
      overlaps_with_two_q_buffers(kConfig, kHasDropout) ? kConfig.two_q_shared_bytes() : kSharedBytes;
  const int shared_bytes = launch_params.is_tile_overlap ? kMaxKernelSharedBytes : kSharedBytes;
  auto* kernel = forward_kernel_sm90<T, kConfig.kernel_head_dim, kConfig.block_m, kConfig.block_n, kConfig.stages,
                                     kConfig.is_intra_overlap, kConfig.is_ping_pong, kConfig.is_persistent, kHasDropout>;
  // Above 48 KB of dynamic shared memory a kernel must opt in, once per device.
  static std::atomic<std::uint64_t> opted_in_devices{0};
  const std::uint64_t device_bit = device < 64 ? (std::uint64_t{1} << device) : 0;
  if (device_bit == 0 || (opted_in_devices.load(std::memory_order_acquire) & device_bit) == 0) {
    FLASHATTN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxKernelSharedBytes));
    opted_in_devices.fetch_or(device_bit, std::memory_order_release);
  }
  kernel<<<static_cast<unsigned>(num_ctas), kConfig.threads(), shared_bytes, stream>>>(launch_params);
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

// The tile configs of one (head dim, dropout) pair, chosen by problem class.
template <class T, int kHeadDim, bool kHasDropout>
void launch_forward_sm90_for(ProblemClass problem_class, const HopperForwardParams& params, cudaStream_t stream) {
  constexpr HopperTileConfig kUnmasked = hopper_tile_config(kHeadDim, ProblemClass::unmasked, kHasDropout);
  constexpr HopperTileConfig kMasked = hopper_tile_config(kHeadDim, ProblemClass::masked, kHasDropout);
  constexpr HopperTileConfig kShortMasked = hopper_tile_config(kHeadDim, ProblemClass::short_masked, kHasDropout);
  static_assert(kUnmasked.kernel_head_dim == kHeadDim && kMasked.kernel_head_dim == kHeadDim,
                "no Hopper tile config for this head dim");
  constexpr HopperTileConfig kMaskLists = hopper_tile_config(kHeadDim, ProblemClass::mask_lists, kHasDropout);
  static_assert(kMaskLists.has_mask_lists(), "attn_mask / block masks need a kernel with the mask lists' path");
  switch (problem_class) {
    case ProblemClass::unmasked: return launch_forward_sm90<T, kUnmasked, kHasDropout>(params, stream);
    case ProblemClass::masked: return launch_forward_sm90<T, kMasked, kHasDropout>(params, stream);
    case ProblemClass::short_masked: return launch_forward_sm90<T, kShortMasked, kHasDropout>(params, stream);
    // unmasked's kernel (an A/B switch, launch.hpp): no new kernel.
    case ProblemClass::short_masked_on_unmasked_tiles:
      return launch_forward_sm90<T, kUnmasked, kHasDropout>(params, stream);
    // The config of masked or short_masked problems (tile_config.hpp): no new kernel.
    case ProblemClass::mask_lists: return launch_forward_sm90<T, kMaskLists, kHasDropout>(params, stream);
  }
}

// What a generated translation unit instantiates (see src/cuda/generate_instantiations.py).
// Dropout runs its own instantiation (kHasDropout): the default kernel carries none of it.
template <class T, int kHeadDim>
void run_forward_sm90(const HopperForwardParams& params, cudaStream_t stream) {
  const AttentionParams& attention = params.attention;
  // The same choice as hopper::forward's (the tensor maps' box rows and the mask lists).
  const ProblemClass problem_class = problem_class_of(attention);
  if (attention.has_dropout()) {
    launch_forward_sm90_for<T, kHeadDim, true>(problem_class, params, stream);
  } else {
    launch_forward_sm90_for<T, kHeadDim, false>(problem_class, params, stream);
  }
}

}  // namespace flashattn::cuda::hopper
