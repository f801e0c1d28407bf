// src/cuda/bwd/dq_traits.hpp — compile-time shape of the deterministic dQ kernel
// (dq_kernel.cuh) for one tile config: warp grids, swizzled tiles, shared-memory
// layout. Host and device (select.hpp sizes every config, the layout test checks the
// addressing on the host). The names of the S/dP grid match DkdvTraits, so the two
// kernels share exponentiate and write_p_and_ds.
#pragma once

#include <cstddef>

#include "flashattn/config.hpp"
#include "src/cuda/bwd/tile_config.hpp"
#include "src/cuda/common/swizzle.cuh"

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
  static constexpr bool kPrefetch = kConfig.prefetch_fragments;
  // S, dP: (kBlockM, kBlockN), warp tiles (kSdpWarpRows, kSdpWarpCols)
  static constexpr int kSdpWarpsM = kConfig.sdp_warps_m, kSdpWarpsN = kWarps / kSdpWarpsM;
  static constexpr int kSdpWarpRows = kBlockM / kSdpWarpsM, kSdpWarpCols = kBlockN / kSdpWarpsN;
  static constexpr int kSdpMTiles = kSdpWarpRows / 16, kSdpNTiles = kSdpWarpCols / 8;
  // dQ: (kBlockM, kHeadDim), warp tiles (kDqWarpRows, kDqWarpCols)
  static constexpr int kDqWarpsM = kConfig.dq_warps_m, kDqWarpsD = kWarps / kDqWarpsM;
  static constexpr int kDqWarpRows = kBlockM / kDqWarpsM, kDqWarpCols = kHeadDim / kDqWarpsD;
  static constexpr int kDqMTiles = kDqWarpRows / 16, kDqNTiles = kDqWarpCols / 8;
  static_assert(kWarps % kSdpWarpsM == 0 && kWarps % kDqWarpsM == 0);
  static_assert(kSdpWarpRows % 16 == 0 && kSdpWarpCols % 16 == 0, "S/dP warp tiles: m16 x (pairs of n8)");
  static_assert(kDqWarpRows % 16 == 0 && kDqWarpCols % 16 == 0, "dQ warp tiles: m16 x (pairs of n8)");
  static_assert(kBlockM <= kMaxBlockM && kMaxBlockM % kBlockM == 0, "whole tiles of the padded statistics");
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0);
  static_assert(kStages == 1 || kStages == 2);

  using QTile = SwizzledTile<kBlockM, kHeadDim>;     // Q, dO
  using KvTile = SwizzledTile<kBlockN, kHeadDim>;    // K, V
  using ScoreTile = SwizzledTile<kBlockM, kBlockN>;  // dS

  // Shared memory, byte offsets: Q | dO | K x stages | V x stages | dS | LSE | D
  static constexpr int kQOffset = 0;
  static constexpr int kDoOffset = kQOffset + QTile::kBytes;
  static constexpr int kKOffset = kDoOffset + QTile::kBytes;
  static constexpr int kVOffset = kKOffset + kStages * KvTile::kBytes;
  static constexpr int kDsOffset = kVOffset + kStages * KvTile::kBytes;
  static constexpr int kLseOffset = kDsOffset + ScoreTile::kBytes;
  static constexpr int kDsumOffset = kLseOffset + kBlockM * 4;
  static constexpr std::size_t kDqSmemBytes = kDsumOffset + kBlockM * 4;

  // Origins of warp w's tiles; the warps along the first dimension vary fastest.
  FLASHATTN_HOST_DEVICE static constexpr int sdp_row0(int w) { return (w % kSdpWarpsM) * kSdpWarpRows; }
  FLASHATTN_HOST_DEVICE static constexpr int sdp_col0(int w) { return (w / kSdpWarpsM) * kSdpWarpCols; }
  FLASHATTN_HOST_DEVICE static constexpr int dq_row0(int w) { return (w % kDqWarpsM) * kDqWarpRows; }
  FLASHATTN_HOST_DEVICE static constexpr int dq_col0(int w) { return (w / kDqWarpsM) * kDqWarpCols; }
  // Chunk extent of one warp's K columns in dQ (FragmentAddress's kWarpChunks; 0 = one warp).
  static constexpr int kDqWarpChunks = kDqWarpsD > 1 ? kDqWarpCols / kChunkElements : 0;
};

}  // namespace flashattn::cuda::bwd
