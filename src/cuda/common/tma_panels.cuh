// src/cuda/common/tma_panels.cuh — the TMA copy of a tile in 64-column panels (the
// 128-byte swizzle, common/swizzle.cuh), shared by the producers of the Hopper forward
// (hopper/kernel.cuh: Q, the K and V stages) and backward (hopper_bwd/: K, V, Q, dO),
// and the Hopper forward's TMA store of O (the tile-overlap schedule).
// Through libcu++ (::cuda::ptx::cp_async_bulk_tensor, PTX ISA "cp.async.bulk.tensor"),
// sm_90 and newer; below, it compiles to nothing.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>
#include <cuda/ptx>

#include "src/cuda/common/swizzle.cuh"
#include "src/cuda/ptx/arch.cuh"

namespace flashattn::cuda {

// A (kRows, kPanels x 64) tile of one head: kPanels TMA copies of the map's (64 columns,
// kRows rows) box at (row, head, batch_coordinate) into 64-column panels of kRows rows,
// completing on `barrier` (whose expected bytes the caller has set).
template <int kPanels, int kRows, class T>
__device__ __forceinline__ void load_panels(T* destination, const CUtensorMap* map, std::int32_t row, std::int32_t head,
                                            std::int32_t batch_coordinate, std::uint64_t* barrier) {
#if FLASHATTN_SM90_DEVICE_CODE
#pragma unroll
  for (int panel = 0; panel < kPanels; ++panel) {
    const std::int32_t coordinates[4] = {panel * kSwizzlePanelColumns, row, head, batch_coordinate};
    ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global,
                                      destination + panel * kRows * kSwizzlePanelColumns, map, coordinates, barrier);
  }
#endif
}

// The inverse for one row band: a (kBandRows, kPanels x 64) band of a tile stored in
// 64-column panels of kTileRows rows (`source`: the band's first row of panel 0) goes to
// the map's (64 columns, kBandRows rows) box at (row, head, batch_coordinate), one TMA
// store per panel holding any of the first `columns` columns (PTX ISA
// "cp.async.bulk.tensor", .global.shared::cta.bulk_group). Elements outside the map's
// extents are not written. The caller has made `source` visible to the async proxy
// (fence.proxy.async.shared::cta, then a barrier) and commits the bulk group; `source`
// may be overwritten once the group has been read (cp.async.bulk.wait_group.read).
template <int kPanels, int kTileRows, class T>
__device__ __forceinline__ void store_panels(const T* source, const CUtensorMap* map, std::int32_t row,
                                             std::int32_t head, std::int32_t batch_coordinate, int columns) {
#if FLASHATTN_SM90_DEVICE_CODE
#pragma unroll
  for (int panel = 0; panel < kPanels; ++panel) {
    if (panel * kSwizzlePanelColumns >= columns) break;
    const std::int32_t coordinates[4] = {panel * kSwizzlePanelColumns, row, head, batch_coordinate};
    ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_global, ::cuda::ptx::space_shared, map, coordinates,
                                      source + panel * kTileRows * kSwizzlePanelColumns);
  }
#endif
}

}  // namespace flashattn::cuda
