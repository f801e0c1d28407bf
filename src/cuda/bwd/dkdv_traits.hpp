// src/cuda/bwd/dkdv_traits.hpp — compile-time shape of the dK/dV kernel for one tile
// config: warp grids, swizzled tiles, shared-memory layout. Host and device (the
// layout test checks every table entry on the host).
#pragma once

#include "flashattn/config.hpp"
#include "src/cuda/bwd/tile_config.hpp"
#include "src/cuda/common/swizzle.cuh"

namespace flashattn::cuda::bwd {

// kConfig_ defaults to the table; the timing tool instantiates alternatives.
template <class Element_, int kHeadDim_, DkdvConfig kConfig_ = dkdv_config(kHeadDim_)>
struct DkdvTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr DkdvConfig kConfig = kConfig_;
  static constexpr int kBlockM = kConfig.block_m;
  static constexpr int kBlockN = kConfig.block_n;
  static constexpr int kWarps = kConfig.warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = kConfig.stages;
  // S, dP: (kBlockM, kBlockN), warp tiles (kSdpWarpRows, kSdpWarpCols)
  static constexpr int kSdpWarpsM = kConfig.sdp_warps_m, kSdpWarpsN = kWarps / kSdpWarpsM;
  static constexpr int kSdpWarpRows = kBlockM / kSdpWarpsM, kSdpWarpCols = kBlockN / kSdpWarpsN;
  static constexpr int kSdpMTiles = kSdpWarpRows / 16, kSdpNTiles = kSdpWarpCols / 8;
  // dK, dV: (kBlockN, kHeadDim), warp tiles (kKvWarpRows, kKvWarpCols)
  static constexpr int kKvWarpsN = kConfig.dkdv_warps_n, kKvWarpsD = kWarps / kKvWarpsN;
  static constexpr int kKvWarpRows = kBlockN / kKvWarpsN, kKvWarpCols = kHeadDim / kKvWarpsD;
  static constexpr int kKvMTiles = kKvWarpRows / 16, kKvNTiles = kKvWarpCols / 8;
  // dQ: (kBlockM, kHeadDim), warp tiles (kDqWarpRows, kDqWarpCols)
  static constexpr int kDqWarpsM = kConfig.dq_warps_m, kDqWarpsD = kWarps / kDqWarpsM;
  static constexpr int kDqWarpRows = kBlockM / kDqWarpsM, kDqWarpCols = kHeadDim / kDqWarpsD;
  static constexpr int kDqMTiles = kDqWarpRows / 16, kDqNTiles = kDqWarpCols / 8;
  static_assert(kWarps % kSdpWarpsM == 0 && kWarps % kKvWarpsN == 0 && kWarps % kDqWarpsM == 0);
  static_assert(kSdpWarpRows % 16 == 0 && kSdpWarpCols % 16 == 0, "S/dP warp tiles: m16 x (pairs of n8)");
  static_assert(kKvWarpRows % 16 == 0 && kKvWarpCols % 16 == 0, "dK/dV warp tiles: m16 x (pairs of n8)");
  static_assert(kDqWarpRows % 16 == 0 && kDqWarpCols % 16 == 0, "dQ warp tiles: m16 x (pairs of n8)");
  static_assert(kBlockM <= kMaxBlockM && kBlockM % 16 == 0 && kHeadDim % 16 == 0);
  static_assert(kStages == 1 || kStages == 2);

  using QTile = SwizzledTile<kBlockM, kHeadDim>;      // Q, dO
  using KvTile = SwizzledTile<kBlockN, kHeadDim>;     // K, V
  using ScoreTile = SwizzledTile<kBlockM, kBlockN>;   // P, dS
  static constexpr bool kDqAtomics = kConfig.dq_atomics;
  static constexpr bool kPrefetch = kConfig.prefetch_fragments;
  // The fp32 dQ staging tile has the accumulator's row layout (one bulk copy per
  // tile), so its fragment stores meet 4-way bank conflicts; a small cost per step.
  static constexpr int kDqStagingLd = kHeadDim;
  static constexpr int kDqStagingBytes = kDqAtomics ? 0 : kBlockM * kDqStagingLd * 4;

  // Shared memory, byte offsets: K | V | Q x stages | dO x stages | P | dS | dQ staging | LSE x stages | D x stages
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + KvTile::kBytes;
  static constexpr int kQOffset = kVOffset + KvTile::kBytes;
  static constexpr int kDoOffset = kQOffset + kStages * QTile::kBytes;
  static constexpr int kPOffset = kDoOffset + kStages * QTile::kBytes;
  static constexpr int kDsOffset = kPOffset + ScoreTile::kBytes;
  static constexpr int kDqOffset = kDsOffset + ScoreTile::kBytes;
  static constexpr int kLseOffset = kDqOffset + kDqStagingBytes;
  static constexpr int kDsumOffset = kLseOffset + kStages * kBlockM * 4;
  static constexpr int kSmemBytes = kDsumOffset + kStages * kBlockM * 4;

  // Origins of warp w's tiles; the warps along the first dimension vary fastest.
  FLASHATTN_HOST_DEVICE static constexpr int sdp_row0(int w) { return (w % kSdpWarpsM) * kSdpWarpRows; }
  FLASHATTN_HOST_DEVICE static constexpr int sdp_col0(int w) { return (w / kSdpWarpsM) * kSdpWarpCols; }
  FLASHATTN_HOST_DEVICE static constexpr int kv_row0(int w) { return (w % kKvWarpsN) * kKvWarpRows; }
  FLASHATTN_HOST_DEVICE static constexpr int kv_col0(int w) { return (w / kKvWarpsN) * kKvWarpCols; }
  FLASHATTN_HOST_DEVICE static constexpr int dq_row0(int w) { return (w % kDqWarpsM) * kDqWarpRows; }
  FLASHATTN_HOST_DEVICE static constexpr int dq_col0(int w) { return (w / kDqWarpsM) * kDqWarpCols; }
  // Chunk extents of one warp where warps split a tile's columns (FragmentAddress's
  // kWarpChunks; 0 = a single warp spans the columns): Q/dO columns in dK/dV, P/dS
  // columns (keys) in dK/dV, K columns in dQ.
  static constexpr int kKvWarpChunks = kKvWarpsD > 1 ? kKvWarpCols / kChunkElements : 0;
  static constexpr int kPWarpChunks = kKvWarpsN > 1 ? kKvWarpRows / kChunkElements : 0;
  static constexpr int kDqWarpChunks = kDqWarpsD > 1 ? kDqWarpCols / kChunkElements : 0;
};

}  // namespace flashattn::cuda::bwd
