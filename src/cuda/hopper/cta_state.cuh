// src/cuda/hopper/cta_state.cuh — what the roles of the Hopper forward kernel
// (hopper/kernel.cuh: tile scheduler, mainloop, epilogue) share within a CTA: the kernel
// they belong to (KernelSpec) and where a consumer thread sits in the wgmma accumulator
// layout (ConsumerThread).
#pragma once

#include <cstdint>

#include "src/cuda/hopper/tile_config.hpp"
#include "src/cuda/ptx/warpgroup.cuh"

namespace flashattn::cuda::hopper {

// The kernel a role belongs to: forward_kernel_sm90's template arguments and the shape
// constants the roles derive from them (one instantiation of each role type per kernel).
template <class T, HopperTileConfig kConfigArg, bool kHasDropoutArg>
struct KernelSpec {
  using Element = T;
  static constexpr HopperTileConfig kConfig = kConfigArg;
  static constexpr bool kHasDropout = kHasDropoutArg;
  static constexpr int kHeadDim = kConfig.kernel_head_dim;
  static constexpr int kBlockM = kConfig.block_m;
  static constexpr int kBlockN = kConfig.block_n;
  static constexpr int kConsumerWarpgroups = kConfig.consumer_warpgroups();
  static constexpr bool kHasDeviceMask = kConfig.has_mask_lists();  // the device mask's key-tile lists
};

// A consumer thread's place: its warpgroup (64 query rows each) and its rows and
// columns of the m64nNk16 accumulator (the mma.sync C layout repeated: thread_row0 and
// thread_row0 + 8, columns 8 j + 2 quad_lane + {0, 1}). Made by the kernel from its
// own locals: computed by a helper function instead, the persistent bf16 d128 kernel's
// PTX had the same expressions in another order and ptxas scheduled it differently
// (SASS compared, 2026-11-27).
struct ConsumerThread {
  int consumer;             // consumer warpgroup, 0 .. block_m / 64 - 1
  int thread_in_warpgroup;  // 0 .. 127
  int lane;                 // in the warp
  int group;                // accumulator row within an 8-row half
  int quad_lane;            // accumulator column pair
  int warpgroup_row0;       // the warpgroup's first row of the tile
  int thread_row0;          // the thread's first row of the tile (+ 8 * half)
};

}  // namespace flashattn::cuda::hopper
