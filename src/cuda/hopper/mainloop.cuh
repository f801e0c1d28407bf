// src/cuda/hopper/mainloop.cuh — the mainloop role of the Hopper forward kernel
// (hopper/kernel.cuh), its producer side: the loader lane's TMA loads of a tile's K and V
// blocks into the kernel's shared-memory rings (kStages stages each, a "full" mbarrier per
// stage that the TMA completes, an "empty" one that every consumer warp arrives on).
//
// The consumers' side (S = Q K^T, the variant hooks, the online softmax, O += P V) is
// still the kernel's lambdas: as a struct of the same methods (branch
// s19-fwd-roles-mainloop-wip) the bf16 d128 kernels kept their PTX byte for byte but the
// d256 ones moved (hopper/TUNING.md, "Role files").
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cuda/ptx>

#include "src/cuda/common/tma_panels.cuh"
#include "src/cuda/hopper/cta_state.cuh"
#include "src/cuda/hopper/tile_scheduler.cuh"
#include "src/cuda/ptx/mbarrier.cuh"

namespace flashattn::cuda::hopper {

// One tile's K/V loads, issued by the loader lane in the consumers' order (K_0, then K_j
// before V_(j-1), then the last V). KeyBlockOf: the kernel's key_block(tile, index). The
// members are references to the kernel's own values, as the lambda this replaced captured
// them (the kernel's code is pinned: scripts/sass_fingerprint.py).
template <class Kernel, class KeyBlockOf>
struct MainloopLoader {
  using T = typename Kernel::Element;
  static constexpr int kHeadDim = Kernel::kHeadDim;
  static constexpr int kBlockN = Kernel::kBlockN;
  static constexpr int kStages = Kernel::kConfig.stages;
  static constexpr int kPanels = Kernel::kConfig.panels();
  static constexpr int kKVBytes = Kernel::kConfig.kv_tile_bytes();

  int& block_base;                     // K/V blocks loaded for earlier tiles: the rings' position
  const std::int64_t& k_start;         // the tile's sequence's first key row
  const KeyBlockOf& key_block;
  const Tile& tile;
  const std::int32_t& head_kv;
  const std::int32_t& batch_coordinate;  // 0 for varlen (one batch entry of packed rows)

  // Block `index` of the tile's visit order into its stage of a ring; waits until the
  // consumers have released that stage's previous block.
  __device__ void load_block(const CUtensorMap* tensor_map, T* ring, std::uint64_t* full, std::uint64_t* empty,
                             int index) const {
    const int position = block_base + index;
    const int stage = position % kStages;
    if (position >= kStages) ptx::mbarrier_wait(&empty[stage], ((position / kStages) - 1) & 1);
    ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                           ::cuda::ptx::space_shared, &full[stage], kKVBytes);
    const std::int32_t row = static_cast<std::int32_t>(k_start + key_block(tile, index).n0);
    load_panels<kPanels, kBlockN>(ring + stage * kBlockN * kHeadDim, tensor_map, row, head_kv, batch_coordinate,
                                  &full[stage]);
  }
};

}  // namespace flashattn::cuda::hopper
