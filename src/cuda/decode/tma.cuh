// src/cuda/decode/tma.cuh — the Hopper TMA (tensor copy) and mbarrier instructions of
// the sm_90 decode kernel (kernel_tma.cuh). sm_90 and newer; below, every wrapper
// compiles to nothing (the kernel that calls them is empty there).
//
// PTX ISA: "cp.async.bulk.tensor" (global -> shared::cluster through a tensor map,
// completing its byte count on an mbarrier), "prefetch" (global -> L2),
// "prefetch.tensormap", "mbarrier.init / arrive /
// arrive.expect_tx / try_wait.parity", "fence.mbarrier_init", "bar.sync".
//
// Measured and rejected (H100, 2026-11-23): one non-tensor cp.async.bulk per 256-byte
// key row (no tensor map, any page layout) streams at most 1.9 TB/s — the copy engine
// takes ~30 cycles per request, so small requests cannot feed an SM at 13 bytes/cycle;
// a tensor-map box moves 8-16 KB per request.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

namespace flashattn::cuda::decode::tma {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FLASHATTN_DECODE_TMA_CODE 1
#else
#define FLASHATTN_DECODE_TMA_CODE 0
#endif

__device__ __forceinline__ void mbarrier_init(std::uint32_t barrier, std::uint32_t count) {
#if FLASHATTN_DECODE_TMA_CODE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(count) : "memory");
#endif
}

// Makes the initialised barriers visible to the async proxy (and the cluster).
__device__ __forceinline__ void fence_mbarrier_init() {
#if FLASHATTN_DECODE_TMA_CODE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival, and `bytes` more transaction bytes the current phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint32_t barrier, std::uint32_t bytes) {
#if FLASHATTN_DECODE_TMA_CODE
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void mbarrier_arrive(std::uint32_t barrier) {
#if FLASHATTN_DECODE_TMA_CODE
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
#endif
}

// Blocks until the phase of the given parity has completed (acquire: the bytes the
// phase counted, and what the arriving threads wrote before arriving, are visible).
// Returns with the calling warp's threads converged: each thread polls on its own, so
// they may see the phase complete at different polls, and what follows (mma.sync,
// ldmatrix, bar.sync) needs the whole warp together. The poll loop is C++, not a branch
// inside the asm, so the compiler knows the warp can diverge there (an asm-internal
// loop hides that divergence from it).
__device__ __forceinline__ bool mbarrier_try_wait(std::uint32_t barrier, std::uint32_t parity) {
  std::uint32_t done = 1;
#if FLASHATTN_DECODE_TMA_CODE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(barrier), "r"(parity)
      : "memory");
#endif
  return done != 0;
}

__device__ __forceinline__ void mbarrier_wait(std::uint32_t barrier, std::uint32_t parity) {
  while (!mbarrier_try_wait(barrier, parity)) {
  }
  __syncwarp();
}

// The box of `map` at coordinates (c0, c1, c2, c3) into shared memory at
// `shared_destination` (1024-byte aligned for the 128-byte swizzle); the completion
// counts the whole box (zero-filled out-of-bounds elements included) on `barrier`.
__device__ __forceinline__ void copy_box(std::uint32_t shared_destination, const CUtensorMap* map, std::int32_t c0, std::int32_t c1,
                                         std::int32_t c2, std::int32_t c3, std::uint32_t barrier) {
#if FLASHATTN_DECODE_TMA_CODE
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
#if FLASHATTN_DECODE_TMA_CODE
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(global_address) : "memory");
#endif
}

// Fetches the tensor map (a kernel parameter) ahead of its first use.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
#if FLASHATTN_DECODE_TMA_CODE
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
#endif
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads of the CTA.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// A relaxed 32-bit load that may race with a writer (a speculative read before
// griddepcontrol.wait): some value that was or is being stored, never undefined.
__device__ __forceinline__ std::int32_t load_relaxed(const std::int32_t* address) {
  std::int32_t value = 0;
#if FLASHATTN_DECODE_TMA_CODE
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
#endif
  return value;
}

}  // namespace flashattn::cuda::decode::tma
