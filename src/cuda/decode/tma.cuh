// src/cuda/decode/tma.cuh — the Hopper TMA (tensor copy) and prefetch instructions of
// the sm_90 decode kernel (kernel_tma.cuh), on 32-bit shared-memory addresses. sm_90
// and newer (FLASHATTN_SM90_DEVICE_CODE); below, every wrapper compiles to nothing (the
// kernel that calls them is empty there). Its mbarriers: ptx/mbarrier.cuh; its named
// barrier: ptx/named_barrier.cuh.
//
// PTX ISA: "cp.async.bulk.tensor" (global -> shared::cluster through a tensor map,
// completing its byte count on an mbarrier), "prefetch" (global -> L2),
// "prefetch.tensormap", "ld.relaxed".
//
// Measured and rejected (H100, 2026-11-23): one non-tensor cp.async.bulk per 256-byte
// key row (no tensor map, any page layout) streams at most 1.9 TB/s — the copy engine
// takes ~30 cycles per request, so small requests cannot feed an SM at 13 bytes/cycle;
// a tensor-map box moves 8-16 KB per request.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "src/cuda/ptx/arch.cuh"

namespace flashattn::cuda::decode::tma {

// The box of `map` at coordinates (c0, c1, c2, c3) into shared memory at
// `shared_destination` (1024-byte aligned for the 128-byte swizzle); the completion
// counts the whole box (zero-filled out-of-bounds elements included) on `barrier`.
__device__ __forceinline__ void copy_box(std::uint32_t shared_destination, const CUtensorMap* map, std::int32_t c0, std::int32_t c1,
                                         std::int32_t c2, std::int32_t c3, std::uint32_t barrier) {
#if FLASHATTN_SM90_DEVICE_CODE
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(
          shared_destination),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(barrier)
      : "memory");
#endif
}

// Starts bringing the 128-byte line at `global_address` into L2 (an LSU prefetch, not the
// TMA). A hint: it changes no value anyone reads, so it may be issued before the kernel's
// inputs are final (before griddepcontrol.wait), from a speculative (in-bounds) address.
__device__ __forceinline__ void prefetch_line_l2(const void* global_address) {
#if FLASHATTN_SM90_DEVICE_CODE
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(global_address) : "memory");
#endif
}

// Fetches the tensor map (a kernel parameter) ahead of its first use.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
#if FLASHATTN_SM90_DEVICE_CODE
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
#endif
}

// A relaxed 32-bit load that may race with a writer (a speculative read before
// griddepcontrol.wait): some value that was or is being stored, never undefined.
__device__ __forceinline__ std::int32_t load_relaxed(const std::int32_t* address) {
  std::int32_t value = 0;
#if FLASHATTN_SM90_DEVICE_CODE
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
#endif
  return value;
}

}  // namespace flashattn::cuda::decode::tma
