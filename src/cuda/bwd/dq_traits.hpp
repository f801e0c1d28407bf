// src/cuda/bwd/dq_traits.hpp — compile-time shape of the deterministic dQ kernel
// (dq_kernel.cuh) for one tile config: warp grids and the padded shared-memory
// tiles. Host and device (select.hpp sizes every config on the host).
#pragma once

#include <cstddef>

#include "src/cuda/bwd/tile_config.hpp"

namespace flashattn::cuda::bwd {

// kConfig_ defaults to the table; the timing tool instantiates alternatives.
template <class Element_, int kHeadDim_, TileConfig kConfig_ = dq_config(kHeadDim_)>
struct DqTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr TileConfig kConfig = kConfig_;
  static constexpr int kBlockM = kConfig.block_m;
  static constexpr int kBlockN = kConfig.block_n;
  static constexpr int kWarps = kConfig.warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = kConfig.stages;
  // Shared-memory row strides padded by 16 bytes: the 8 rows an ldmatrix reads then
  // start in 8 distinct 16-byte bank groups (row stride / 16 B is odd).
  static constexpr int kLdHead = kHeadDim + 8;
  static constexpr int kLdN = kBlockN + 8;
  // Warp grids; every warp owns 16 rows. Products with kBlockM rows (S, dP, dQ):
  static constexpr int kWarpsRowsQ = kBlockM / 16;
  static constexpr int kWarpsColsQ = kWarps / kWarpsRowsQ;
  // Products with kBlockN rows (dK, dV):
  static constexpr int kWarpsRowsKv = kBlockN / 16;
  static constexpr int kWarpsColsKv = kWarps / kWarpsRowsKv;
  static constexpr int kScoreTiles = kBlockN / kWarpsColsQ / 8;   // n8 tiles of S, dP per warp
  static constexpr int kKvTiles = kHeadDim / kWarpsColsKv / 8;    // of dK, dV per warp
  static constexpr int kDqTiles = kHeadDim / kWarpsColsQ / 8;     // of dQ per warp
  static_assert(kHeadDim % 16 == 0 && kBlockM % 16 == 0 && kBlockN % 16 == 0);
  static_assert(kWarps % kWarpsRowsQ == 0 && kWarps % kWarpsRowsKv == 0);
  static_assert(kBlockN % (kWarpsColsQ * 8) == 0 && kHeadDim % (kWarpsColsKv * 8) == 0 &&
                kHeadDim % (kWarpsColsQ * 8) == 0);
  static_assert(kStages == 1 || kStages == 2);

  static constexpr int kTileQ = kBlockM * kLdHead;  // elements of one (kBlockM, kHeadDim) tile
  static constexpr int kTileKv = kBlockN * kLdHead;
  static constexpr int kTileScores = kBlockM * kLdN;
  // dq_kernel: Q, dO | K[stages], V[stages] | dS | LSE, D
  static constexpr std::size_t kDqSmemBytes =
      sizeof(Element) * (2 * kTileQ + 2 * kStages * kTileKv + kTileScores) + sizeof(float) * 2 * kBlockM;
};

}  // namespace flashattn::cuda::bwd
