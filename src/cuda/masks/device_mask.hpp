// TEMPORARY (helper masks-hopper-bwd): masks.md's interface of helper masks-core's
// src/cuda/masks/device_mask.hpp, declared so that the Hopper backward compiles before
// it lands. On merge, take masks-core's file.
#pragma once

#include <cuda_runtime.h>

#include "src/core/mask_tables.hpp"
#include "src/core/params.hpp"

namespace flashattn::cuda::masks {

struct KernelTiles {
  int query_tile = 0;
  int key_tile = 0;
  bool by_query_tile = false;
  bool by_key_tile = false;
};

class MaskTables {
 public:
  MaskTables() = default;
  MaskTables(MaskTables&&) noexcept;
  MaskTables& operator=(MaskTables&&) noexcept;
  ~MaskTables();
  const DeviceMask& view() const;

 private:
  DeviceMask view_;
};

MaskTables prepare(const AttentionParams& params, const KernelTiles& tiles, cudaStream_t stream);
MaskTables prepare(const BackwardParams& params, const KernelTiles& tiles, cudaStream_t stream);
void finish_dbias(const BackwardParams& params, const MaskTables& tables, cudaStream_t stream);

}  // namespace flashattn::cuda::masks
