// src/cuda/masks/device_mask.hpp — the host side of the GPU masks: builds the device
// tables of src/core/mask_tables.hpp (block codes, a kernel's tile lists, the dBias
// accumulator) on the call's stream before the kernels run, and converts the dBias
// accumulator into the caller's dbias after the backward kernels.
//
// Usage in a launch function (kernels take params by value, so copy):
//   masks::MaskTables tables = masks::prepare(params, {kBlockM, kBlockN, /*by_query_tile=*/true, false}, stream);
//   AttentionParams launch_params = params;
//   tables.bind(launch_params);      // device_mask, and a converted dense mask's block form
//   kernel<<<...>>>(launch_params);  // tables must outlive the enqueue only (stream-ordered free)
//
// A dense boolean attn_mask alone (src/core/dense_mask_blocks.hpp) is converted on the
// device into its block form (unless FLASHATTN_DENSE_MASK=elements): block codes and bits at
// mask blocks matching the kernel's tiles, made by one kernel that reads the mask once.
// The kernels then see a block mask with bits and no attn_mask (bind()): empty tiles are
// not listed, full ones get no element pass, partial ones the fast pass on the bits.
//
// Everything is stream-ordered (cudaMallocAsync / cudaFreeAsync on the call's stream,
// capturable in a CUDA graph); the tables are built by a few tiny kernels (one warp
// per list, a few µs) and only depend on (b, h) where the block mask does: a
// broadcast block mask (and no block mask at all) gives one [1, 1] set of lists.
// Host code; the kernels live in device_mask.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "src/core/mask_tables.hpp"
#include "src/core/params.hpp"

namespace flashattn::cuda::masks {

// The tile sizes of the kernel the tables are built for, and which lists it reads.
struct KernelTiles {
  int query_tile = 0;          // the kernel's block_m
  int key_tile = 0;            // the kernel's block_n
  bool by_query_tile = false;  // lists per query tile naming key tiles (forward; a separate dQ kernel)
  bool by_key_tile = false;    // lists per key tile naming query tiles (dK/dV kernels)
};

// Owns the device scratch of the tables (one stream-ordered allocation, freed with
// cudaFreeAsync on the same stream when destroyed). Move-only.
class MaskTables {
 public:
  MaskTables() = default;
  MaskTables(MaskTables&& other) noexcept;
  MaskTables& operator=(MaskTables&& other) noexcept;
  MaskTables(const MaskTables&) = delete;
  MaskTables& operator=(const MaskTables&) = delete;
  ~MaskTables();

  // The tables as the kernels read them (params.device_mask); present() == false when
  // the call has no masks.
  const DeviceMask& view() const { return view_; }
  // Whether a dense boolean attn_mask was converted into its block form (see the header).
  bool has_dense_mask_blocks() const { return has_dense_mask_blocks_; }
  // Sets what a kernel reads of these tables in its params: device_mask = view(), and for
  // a converted dense mask its block form in place of the attn_mask (block_mask = the
  // converted view, maybe_attn_mask = null). `params` must be those prepare() was given.
  void bind(AttentionParams& params) const;

 private:
  friend MaskTables prepare(const AttentionParams& params, const KernelTiles& tiles, cudaStream_t stream);
  friend MaskTables prepare(const BackwardParams& params, const KernelTiles& tiles, cudaStream_t stream);
  // Both prepare() overloads: the backward one passes itself for the dBias accumulator.
  static MaskTables build(const AttentionParams& params, const BackwardParams* maybe_backward, const KernelTiles& tiles,
                          cudaStream_t stream);
  void release() noexcept;

  DeviceMask view_;
  BlockMaskView dense_mask_blocks_;  // the converted block form (has_dense_mask_blocks_), in scratch_
  bool has_dense_mask_blocks_ = false;
  void* scratch_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// Builds the tables for params' masks (params.has_attn_mask() || params.has_block_mask())
// on `stream`; an empty MaskTables (view().present() == false) when there are none.
// For a BackwardParams with maybe_dbias, also allocates and zeroes the dBias accumulator.
// Throws NotSupported when `tiles` asks for no list or has a non-positive tile size.
MaskTables prepare(const AttentionParams& params, const KernelTiles& tiles, cudaStream_t stream);
MaskTables prepare(const BackwardParams& params, const KernelTiles& tiles, cudaStream_t stream);

// After the backward kernels: converts the accumulator into params.maybe_dbias
// (its dtype and strides). No-op without dbias.
void finish_dbias(const BackwardParams& params, const MaskTables& tables, cudaStream_t stream);

}  // namespace flashattn::cuda::masks
