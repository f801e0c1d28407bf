// src/cuda/hopper/tile_queue.cuh — how the CTAs of a persistent Hopper forward kernel
// (hopper/kernel.cuh) take their tiles, and how one lane hands each tile to the rest of
// its CTA.
//
// Tile numbers: a CTA runs blockIdx.x first, then either blockIdx.x + k gridDim.x (the
// static order: tiles of equal work) or, when the launch passes a zeroed counter (tiles
// of unequal work: causal, local, varlen), gridDim.x + the counter's next value, one
// atomic per tile — the hardware's block scheduling without the per-tile prologue and
// epilogue. Which tile a number names: TileOrder (tile_order.hpp).
//
// The queue: two slots of tile numbers in shared memory, each with a "full" mbarrier
// (count 1: the scheduler lane put a number there) and an "empty" one (count: every
// reading warp, one arrival each, made by its lane 0 once every lane of the warp has read
// the slot). The CTA's tile number `taken` lives in slot taken % 2, phase taken / 2.
// Once the tiles run out the scheduler puts tile_end there: every reader stops at it.
#pragma once

#include <cstdint>
#include <cuda/ptx>

#include "src/cuda/ptx/arch.cuh"
#include "src/cuda/ptx/mbarrier.cuh"

namespace flashattn::cuda::hopper {

struct TileQueue {
  std::uint64_t* full;   // [2]: the slot holds the CTA's next tile number
  std::uint64_t* empty;  // [2]: every reading warp has read it
  std::int32_t* slots;   // [2]

  // The scheduler lane, before it puts tile number `taken`: its slot has been read for
  // tile number taken - 2.
  __device__ __forceinline__ void wait_free(int taken) const {
    if (taken >= 2) ptx::mbarrier_wait(&empty[taken & 1], ((taken >> 1) - 1) & 1);
  }
  // Tile number `taken` is `linear` (the scheduler lane, after wait_free(taken)).
  __device__ __forceinline__ void put(int taken, std::int32_t linear) const {
#if FLASHATTN_SM90_DEVICE_CODE
    slots[taken & 1] = linear;
    ::cuda::ptx::mbarrier_arrive(&full[taken & 1]);
#endif
  }
  // Tile number `taken`, read by every lane of `warp_mask` (the lanes of this warp that
  // read it, all active here); lane 0 of the warp, among them, releases the slot after
  // every one of them has read it.
  __device__ __forceinline__ std::int32_t take(int taken, std::uint32_t warp_mask) const {
    std::int32_t linear = 0;
#if FLASHATTN_SM90_DEVICE_CODE
    ptx::mbarrier_wait(&full[taken & 1], (taken >> 1) & 1);
    linear = slots[taken & 1];
    __syncwarp(warp_mask);
    if (threadIdx.x % 32 == 0) ::cuda::ptx::mbarrier_arrive(&empty[taken & 1]);
#endif
    return linear;
  }
};

// The CTA's tile number after `linear`: from the counter (dynamic) or gridDim.x further
// (static). Tile numbers fit 32 bits: the launches check num_tiles + gridDim.x < 2^31.
__device__ __forceinline__ std::int32_t next_tile(std::int32_t linear, unsigned int* maybe_tile_counter) {
  return maybe_tile_counter != nullptr ? static_cast<std::int32_t>(gridDim.x + atomicAdd(maybe_tile_counter, 1u))
                                       : linear + static_cast<std::int32_t>(gridDim.x);
}

}  // namespace flashattn::cuda::hopper
