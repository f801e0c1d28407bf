// src/cuda/hopper/tile_scheduler.cuh — the tile-scheduler role of the Hopper forward
// kernel (hopper/kernel.cuh): which tiles a CTA runs, and what a tile is.
//
//   Tile, KeyBlock           a tile (a tile number decoded through TileOrder,
//                            tile_order.hpp, by the kernel's decode_tile): its batch, head,
//                            query rows, key blocks and mask; the key block of each step of
//                            its visit order (the kernel's key_block: the interval range or
//                            the device mask's list);
//   SingleTileScheduler      one CTA per tile (blockIdx.x);
//   StaticPersistentScheduler, DynamicPersistentScheduler
//                            a persistent CTA's tile numbers: blockIdx.x, then gridDim.x
//                            further (tiles of equal work) or the next value of a global
//                            counter (unequal work: causal, local, varlen); the launch
//                            picks one through maybe_tile_counter (PersistentScheduler);
//   TileDistribution         the queue's readers: the scheduler lane runs the scheduler,
//                            decodes each tile once (TileRecord) and hands its number and
//                            record through the shared-memory queue (tile_queue.cuh) to
//                            the loader, the storer and the consumer warpgroups, which
//                            take them in turn.
// Every scheduler answers initial_tile(), next_tile(linear) and is_valid(linear): a new
// one (FA3's longest-first or varlen schedulers) changes the scheduler lane's
// `using Scheduler` in kernel.cuh, not the loader, the consumers or the epilogue.
#pragma once

#include <cstdint>
#include <type_traits>

#include "flashattn/mask.hpp"
#include "src/core/mask_tables.hpp"
#include "src/core/params.hpp"
#include "src/cuda/common/named_barriers.hpp"
#include "src/cuda/hopper/cta_state.cuh"
#include "src/cuda/hopper/launch.hpp"
#include "src/cuda/hopper/tile_config.hpp"
#include "src/cuda/hopper/tile_order.hpp"
#include "src/cuda/hopper/tile_queue.cuh"
#include "src/cuda/ptx/warpgroup.cuh"

namespace flashattn::cuda::hopper {

// One (batch, head, query tile) and the key blocks its rows see.
struct Tile {
  std::int64_t batch, head, m0, row_end, seqlen_q, seqlen_k, n_block_end;
  std::int64_t key_list;  // the tile's list in the device mask's key lists, -1: the interval range
  int num_n_blocks;       // key blocks visited, from n_block_end - 1 down (or the list's)
  // The interval range's fully allowed blocks (MaskRule::full_key_blocks) as visit indices
  // [masked_leading_blocks, masked_leading_blocks + full_blocks): made once per tile, so a
  // block's "needs the element mask" is one unsigned compare on its index, not the 64-bit
  // tile_fully_allowed after the S wait (hopper/TUNING.md, "Where the consumers wait").
  int masked_leading_blocks;
  int full_blocks;
  MaskRule mask;
};

// A decoded tile as the persistent kernels' scheduler lane hands it on, beside its queue
// slot (TileQueue::records): the scheduler lane decodes each tile number once, and the
// loader, the storer and every consumer warp read the record with a few shared-memory
// loads instead of each decoding it (the tile order's division, head_batch % heads_q, the
// sequence bounds, columns_of_rows, full_key_blocks: ~240 instructions per warp and tile,
// hopper/TUNING.md "Where the consumers wait"). 32-bit fields: rows and keys are below
// 2^31 (the launch checks rows + 256 < 2^31 for the tensor maps), tile numbers too. Only
// tiles with rows are put; the persistent kernels have no mask lists (key_list -1).
struct alignas(16) TileRecord {
  std::int32_t batch, head, m0, row_end, seqlen_q, seqlen_k, n_block_end;
  std::int32_t num_n_blocks, masked_leading_blocks, full_blocks;
  std::int32_t unused[2];  // 48 bytes: three 16-byte loads

  __device__ __forceinline__ static TileRecord of(const Tile& tile) {
    return TileRecord{static_cast<std::int32_t>(tile.batch),
                      static_cast<std::int32_t>(tile.head),
                      static_cast<std::int32_t>(tile.m0),
                      static_cast<std::int32_t>(tile.row_end),
                      static_cast<std::int32_t>(tile.seqlen_q),
                      static_cast<std::int32_t>(tile.seqlen_k),
                      static_cast<std::int32_t>(tile.n_block_end),
                      tile.num_n_blocks,
                      tile.masked_leading_blocks,
                      tile.full_blocks,
                      {0, 0}};
  }
  // The tile again, its mask from the sequence lengths and the launch's window.
  __device__ __forceinline__ Tile tile(std::int64_t window_left, std::int64_t window_right) const {
    Tile tile;
    tile.batch = batch;
    tile.head = head;
    tile.m0 = m0;
    tile.row_end = row_end;
    tile.seqlen_q = seqlen_q;
    tile.seqlen_k = seqlen_k;
    tile.n_block_end = n_block_end;
    tile.key_list = -1;
    tile.num_n_blocks = num_n_blocks;
    tile.masked_leading_blocks = masked_leading_blocks;
    tile.full_blocks = full_blocks;
    tile.mask = MaskRule{seqlen_q, seqlen_k, window_left, window_right};
    return tile;
  }
};
inline constexpr int kTileRecordsBytes = 2 * static_cast<int>(sizeof(TileRecord));  // one per queue slot
static_assert(sizeof(TileRecord) == 48 && kTileRecordsBytes <= kTileRecordsMaxBytes,
              "two tile records within the bytes tile_config.hpp reserves for them");

// Key block `index` of a tile's visit order: its first key row, and whether it takes the
// device mask's element pass — listed partial, or past the end of the keys, where TMA
// delivers zero rows whose scores must not count. On the interval range: whether the
// block is outside the tile's fully allowed blocks (a mask edge or the end of the keys
// crosses it), so the mainloop applies the rows' intervals there.
struct KeyBlock {
  std::int64_t n0;
  bool is_partial;
  std::int32_t code;  // a partial listed block's tile code (mask_tables.hpp), else kGeneralTile
};

// Tile numbers are 32-bit: the launches check num_tiles + gridDim.x < 2^31. A number at
// or past tile_end means none is left.

// One CTA per tile: its own number, then none.
struct SingleTileScheduler {
  std::int32_t tile_end;

  __device__ __forceinline__ static std::int32_t initial_tile() { return static_cast<std::int32_t>(blockIdx.x); }
  __device__ __forceinline__ std::int32_t next_tile(std::int32_t) const { return tile_end; }
  __device__ __forceinline__ bool is_valid(std::int32_t linear) const { return linear < tile_end; }
};

// Persistent, tiles of equal work: blockIdx.x, blockIdx.x + gridDim.x, ...
struct StaticPersistentScheduler {
  std::int32_t tile_end;

  __device__ __forceinline__ static std::int32_t initial_tile() { return static_cast<std::int32_t>(blockIdx.x); }
  __device__ __forceinline__ std::int32_t next_tile(std::int32_t linear) const {
    return linear + static_cast<std::int32_t>(gridDim.x);
  }
  __device__ __forceinline__ bool is_valid(std::int32_t linear) const { return linear < tile_end; }
};

// Persistent, tiles of unequal work (causal, local, varlen): blockIdx.x, then gridDim.x +
// the next value of a zeroed global counter, one atomic per tile — the hardware's block
// scheduling without the per-tile prologue and epilogue.
struct DynamicPersistentScheduler {
  std::int32_t tile_end;
  unsigned int* tile_counter;

  __device__ __forceinline__ static std::int32_t initial_tile() { return static_cast<std::int32_t>(blockIdx.x); }
  __device__ __forceinline__ std::int32_t next_tile(std::int32_t) const {
    return static_cast<std::int32_t>(gridDim.x + atomicAdd(tile_counter, 1u));
  }
  __device__ __forceinline__ bool is_valid(std::int32_t linear) const { return linear < tile_end; }
};

// The persistent kernels' scheduler: dynamic where the launch passes a tile counter,
// else static (one kernel for both: a template choice would double the instantiations).
struct PersistentScheduler {
  std::int32_t tile_end;
  // The launch parameter itself, read where a tile is claimed: a copy made before the
  // scheduler lane's loop moved code (PTX compared).
  unsigned int* const& maybe_tile_counter;

  __device__ __forceinline__ static std::int32_t initial_tile() { return static_cast<std::int32_t>(blockIdx.x); }
  __device__ __forceinline__ std::int32_t next_tile(std::int32_t linear) const {
    return maybe_tile_counter != nullptr ? DynamicPersistentScheduler{tile_end, maybe_tile_counter}.next_tile(linear)
                                         : StaticPersistentScheduler{tile_end}.next_tile(linear);
  }
  __device__ __forceinline__ bool is_valid(std::int32_t linear) const { return linear < tile_end; }
};

// A persistent CTA's tile numbers, from its scheduler lane to its readers through the
// queue (tile_queue.cuh): the loader, the storer (two Q buffers) and each consumer
// warpgroup take the CTA's tile number `taken` in turn. The queue modes (TileQueueMode,
// launch.hpp): whether the scheduler claims a tile only once the previous one has started
// (the late claim), and whether every put and take also passes the named marks
// (NamedTileMarks), a pair of barriers per reader over its threads and the scheduler's warp.
template <int kConsumerWarpgroups>
struct TileDistribution {
  static constexpr int kLoaderReader = 0, kStorerReader = 1, kFirstConsumerReader = 2;
  static constexpr int kReaders = kFirstConsumerReader + kConsumerWarpgroups;

  // The kernel's own values, by reference (as the lambdas that this replaced captured
  // them): copies moved the persistent kernels' code (PTX compared).
  const TileQueue<TileRecord>& queue;
  const NamedTileMarks& named_marks;
  const bool& is_late_claim;
  const bool& has_named_marks;

  // A reader's threads: the loader and the storer are a lane alone in its warp (a
  // barrier counts warps), a consumer reader its warpgroup; plus the scheduler's warp.
  __device__ __forceinline__ static int queue_threads(int reader) {
    return ptx::kWarpSize + (reader < kFirstConsumerReader ? ptx::kWarpSize : ptx::kWarpgroupThreads);
  }

  // The CTA's tile number `taken` (tile_end: none left) and its decoded tile (TileRecord)
  // for `reader` (is_lone_lane: the loader and the storer). Every consumer warp, the loader and (two Q buffers) the
  // storer read each slot, then release it; every reading lane has read it before lane 0
  // does: the loader and the storer are lane 0 of a producer warp alone, a consumer warp
  // is whole and converged here (it has just left aligned wgmma code), so the active mask
  // is the whole warp. The named marks around it are predicated (no branch): a branch
  // there cost the 24-register producer lanes and the d64 block_m 192 consumers spills
  // (ptxas -v, hopper/TUNING.md).
  template <class IsLoneLane>
  __device__ __forceinline__ std::int32_t take(int taken, int reader, IsLoneLane, TileRecord& record) const {
    named_marks.wait_written<IsLoneLane::value>(has_named_marks, reader, queue_threads(reader));
    const std::int32_t linear = queue.take(taken, __activemask(), record);
    named_marks.mark_read<IsLoneLane::value>(has_named_marks, reader, queue_threads(reader));
    return linear;
  }

  // The scheduler lane's readers with marks, one bit each (0 without the marks): one
  // register across its loop, where two flags cost the 24-register lane a spill (ptxas -v).
  __device__ __forceinline__ int marked_readers(bool has_two_q_buffers) const {
    constexpr int kAllReaders = (1 << kReaders) - 1;
    return !has_named_marks ? 0 : has_two_q_buffers ? kAllReaders : kAllReaders & ~(1 << kStorerReader);
  }
  // The scheduler lane, after a put: publish it to each marked reader; before the next
  // claim, wait until each has marked it read.
  __device__ __forceinline__ void publish(int marked) const {
    for (int reader = 0; reader < kReaders; ++reader)
      named_marks.publish(((marked >> reader) & 1) != 0, reader, queue_threads(reader));
  }
  __device__ __forceinline__ void wait_read(int marked) const {
    for (int reader = 0; reader < kReaders; ++reader)
      named_marks.wait_read(((marked >> reader) & 1) != 0, reader, queue_threads(reader));
  }
};

}  // namespace flashattn::cuda::hopper
