// src/cuda/hopper/tile_queue.cuh — how the CTAs of a persistent Hopper forward kernel
// (hopper/kernel.cuh) take their tiles, and how one lane hands each tile to the rest of
// its CTA.
//
// Tile numbers: a CTA runs blockIdx.x first, then either blockIdx.x + k gridDim.x (the
// static order: tiles of equal work) or, when the launch passes a zeroed counter (tiles
// of unequal work: causal, local, varlen), gridDim.x + the counter's next value, one
// atomic per tile — the hardware's block scheduling without the per-tile prologue and
// epilogue (the schedulers: tile_scheduler.cuh). Which tile a number names: TileOrder
// (tile_order.hpp).
//
// The queue: two slots of tile numbers in shared memory (each with a record beside it:
// the forward's decoded tile, TileRecord), each with a "full" mbarrier
// (count 1: the scheduler lane put a number there) and an "empty" one (count: every
// reading warp, one arrival each, made by its lane 0 once every lane of the warp has read
// the slot). The CTA's tile number `taken` lives in slot taken % 2, phase taken / 2.
// Once the tiles run out the scheduler puts tile_end there: every reader stops at it.
//
// NamedTileMarks, the late claim's hand-off (the bf16 kernel's
// FLASHATTN_CUDA_HOPPER_TILE_QUEUE=late_claim): the same queue, each put and take also
// passing named barriers, a pair per reader (a lone lane, a warp or a warpgroup) with the
// scheduler's warp — "slot written" (the scheduler arrives after its put, the reader waits
// before its take) and "slot read" (the reader arrives after its take, the scheduler waits
// before it claims the next tile and puts it). compute-sanitizer racecheck models named
// barriers, not the mbarriers' ordering of plain shared-memory accesses: with the marks
// every slot access is ordered in its model. A pair per reader, so that no reader waits
// for another (one barrier for all made the loader wait for the consumers' previous tile)
// and every count is a constant.
#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda/ptx>

#include "src/cuda/ptx/arch.cuh"
#include "src/cuda/ptx/mbarrier.cuh"
#include "src/cuda/ptx/named_barrier.cuh"

namespace flashattn::cuda::hopper {

// Record: what travels with each tile number (the forward's TileRecord, the decoded
// tile), written before the slot's full barrier completes and read before its empty one.
// NoTileRecord: the tile number alone (the backward, whose loads thread walks the tile's
// steps itself and hands them on through TileLoads); `records` stays null then.
struct NoTileRecord {};

template <class Record = NoTileRecord>
struct TileQueue {
  static constexpr bool kHasRecord = !std::is_same_v<Record, NoTileRecord>;

  std::uint64_t* full;   // [2]: the slot holds the CTA's next tile number
  std::uint64_t* empty;  // [2]: every reading warp has read it
  std::int32_t* slots;   // [2]
  Record* records;       // [2]: beside the slots

  // The scheduler lane, before it puts tile number `taken`: its slot has been read for
  // tile number taken - 2.
  __device__ __forceinline__ void wait_free(int taken) const {
    if (taken >= 2) ptx::mbarrier_wait(&empty[taken & 1], ((taken >> 1) - 1) & 1);
  }
  // Tile number `taken` is `linear`, with its record (unset past the last tile; the
  // scheduler lane, after wait_free(taken)). The arrival releases both stores.
  __device__ __forceinline__ void put(int taken, std::int32_t linear, const Record& record = {}) const {
#if FLASHATTN_SM90_DEVICE_CODE
    if constexpr (kHasRecord) records[taken & 1] = record;
    slots[taken & 1] = linear;
    ::cuda::ptx::mbarrier_arrive(&full[taken & 1]);
#endif
  }
  // Tile number `taken` and its record (meaningless for the end's number: read without a
  // branch, it stays in the CTA's shared memory), read by every lane of `warp_mask` (the
  // lanes of this warp that read it, all active here); lane 0 of the warp, among them,
  // releases the slot after every one of them has read it.
  __device__ __forceinline__ std::int32_t take(int taken, std::uint32_t warp_mask, Record& record) const {
    std::int32_t linear = 0;
#if FLASHATTN_SM90_DEVICE_CODE
    ptx::mbarrier_wait(&full[taken & 1], (taken >> 1) & 1);
    linear = slots[taken & 1];
    if constexpr (kHasRecord) record = records[taken & 1];
    __syncwarp(warp_mask);
    if (threadIdx.x % 32 == 0) ::cuda::ptx::mbarrier_arrive(&empty[taken & 1]);
#endif
    return linear;
  }
};

// The named-barrier marks (header). Reader r's barriers are slot_written_first + r and
// slot_read_first + r, over `threads`: the reader's threads and the scheduler's warp's 32
// (a barrier counts warps: a lane alone in its warp counts 32, and takes the unaligned
// barrier.sync / barrier.arrive, its warp's other lanes having left). A reader's marks are
// predicated on `is_on` inside their asm (named_barrier.cuh), so that a reader's code
// takes no branch for them: the 24-register producer lanes and the 160-register consumers
// spilled more around a run-time branch in the take (ptxas -v, hopper/TUNING.md).
struct NamedTileMarks {
  int slot_written_first;
  int slot_read_first;

  // A reader, around TileQueue::take; kIsLoneLane: one lane of its warp, else whole warps.
  template <bool kIsLoneLane>
  __device__ __forceinline__ void wait_written(bool is_on, int reader, int threads) const {
    if constexpr (kIsLoneLane) {
      ptx::named_barrier_sync_unaligned_if(is_on, slot_written_first + reader, threads);
    } else {
      ptx::named_barrier_sync_if(is_on, slot_written_first + reader, threads);
    }
  }
  template <bool kIsLoneLane>
  __device__ __forceinline__ void mark_read(bool is_on, int reader, int threads) const {
    if constexpr (kIsLoneLane) {
      ptx::named_barrier_arrive_unaligned_if(is_on, slot_read_first + reader, threads);
    } else {
      ptx::named_barrier_arrive_if(is_on, slot_read_first + reader, threads);
    }
  }

  // The scheduler lane (predicated likewise): after TileQueue::put, publish to each
  // reader; before the next claim, wait_read of each.
  __device__ __forceinline__ void publish(bool is_on, int reader, int threads) const {
    ptx::named_barrier_arrive_unaligned_if(is_on, slot_written_first + reader, threads);
  }
  __device__ __forceinline__ void wait_read(bool is_on, int reader, int threads) const {
    ptx::named_barrier_sync_unaligned_if(is_on, slot_read_first + reader, threads);
  }
};

}  // namespace flashattn::cuda::hopper
