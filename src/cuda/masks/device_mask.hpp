// src/cuda/masks/device_mask.hpp — TEMPORARY copy of the interface declared in
// notes/masks.md, so the Hopper forward compiles before helper "masks-core" lands the
// real header (same path): the lead keeps masks-core's version when merging.
#pragma once

#include <cuda_runtime.h>

#include "src/core/mask_tables.hpp"
#include "src/core/params.hpp"

namespace flashattn::cuda::masks {
// The tile sizes of the kernel the tables are built for, and which lists it reads.
struct KernelTiles {
  int query_tile = 0;   // the kernel's block_m
  int key_tile = 0;     // the kernel's block_n
  bool by_query_tile = false;  // lists per query tile naming key tiles (forward; a separate dQ kernel)
  bool by_key_tile = false;    // lists per key tile naming query tiles (dK/dV kernels)
};
// Owns the device scratch of the tables (stream-ordered cudaMallocAsync; freed with
// cudaFreeAsync on the same stream when destroyed). Move-only.
class MaskTables {
 public:
  MaskTables() = default;
  MaskTables(MaskTables&&) noexcept; MaskTables& operator=(MaskTables&&) noexcept; ~MaskTables();
  const DeviceMask& view() const;
};
// Builds the tables for params' masks (params.has_attn_mask() || params.has_block_mask())
// on `stream`; an empty MaskTables (view().present() == false) when there are none.
// For a BackwardParams with maybe_dbias, also allocates and zeroes the dBias accumulator.
MaskTables prepare(const AttentionParams& params, const KernelTiles& tiles, cudaStream_t stream);
MaskTables prepare(const BackwardParams& params, const KernelTiles& tiles, cudaStream_t stream);
// After the backward kernels: converts the accumulator into params.maybe_dbias
// (its dtype and strides). No-op without dbias.
void finish_dbias(const BackwardParams& params, const MaskTables& tables, cudaStream_t stream);
}
