// src/cuda/decode/bulk_copy.cuh — the Hopper bulk-copy (TMA, non-tensor) and mbarrier
// instructions the sm_90 decode kernel (kernel_bulk.cuh) uses. sm_90 and newer; every
// wrapper compiles to nothing below, where the kernel that calls them is empty.
//
// PTX ISA: "cp.async.bulk" (global -> shared::cluster, completing its byte count on an
// mbarrier), "cp.async.bulk.prefetch" (global -> L2, no destination, no completion),
// "mbarrier.init / arrive / arrive.expect_tx / try_wait.parity", "fence.mbarrier_init",
// "fence.proxy.async".
//
// Why bulk copies of single key rows rather than tensor maps: a cache row of one KV
// head is head_dim contiguous elements, successive keys are heads_kv * head_dim apart,
// and a paged cache scatters them over pages of any size (16, 48, 256...) with a key
// range that may start mid-page (left padding). One 16-byte-multiple copy per row needs
// no host-side tensor map, takes any page size or alignment, and is still one
// instruction per 256 bytes (d = 128) instead of 16 cp.async of 16 bytes.
#pragma once

#include <cstdint>

namespace flashattn::cuda::decode::bulk {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FLASHATTN_DECODE_BULK_CODE 1
#else
#define FLASHATTN_DECODE_BULK_CODE 0
#endif

__device__ __forceinline__ void mbarrier_init(std::uint32_t barrier, std::uint32_t count) {
#if FLASHATTN_DECODE_BULK_CODE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(count) : "memory");
#endif
}

// Makes the initialised barriers visible to the async proxy (and the cluster).
__device__ __forceinline__ void fence_mbarrier_init() {
#if FLASHATTN_DECODE_BULK_CODE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival, and `bytes` more transaction bytes the current phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint32_t barrier, std::uint32_t bytes) {
#if FLASHATTN_DECODE_BULK_CODE
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void mbarrier_arrive(std::uint32_t barrier) {
#if FLASHATTN_DECODE_BULK_CODE
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
#endif
}

// Blocks until the phase of the given parity has completed (acquire: the bytes the
// phase counted, and whatever the arriving threads wrote before arriving, are visible).
__device__ __forceinline__ void mbarrier_wait(std::uint32_t barrier, std::uint32_t parity) {
#if FLASHATTN_DECODE_BULK_CODE
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_loop:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_loop;\n"
      "}\n" ::"r"(barrier),
      "r"(parity)
      : "memory");
#endif
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to this
// CTA's shared memory; the completion counts `bytes` on `barrier`.
__device__ __forceinline__ void copy_to_shared(std::uint32_t shared_destination, const void* global_source, std::uint32_t bytes,
                                               std::uint32_t barrier) {
#if FLASHATTN_DECODE_BULK_CODE
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(shared_destination),
               "l"(global_source), "r"(bytes), "r"(barrier)
               : "memory");
#endif
}

// Starts bringing `bytes` (multiple of 16, 16-byte aligned) at `global_source` into L2.
// A hint: it changes no value anyone reads, so it may be issued before the kernel's
// inputs are final (before griddepcontrol.wait), from a speculative address.
__device__ __forceinline__ void prefetch_l2(const void* global_source, std::uint32_t bytes) {
#if FLASHATTN_DECODE_BULK_CODE
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(global_source), "r"(bytes) : "memory");
#endif
}

// Orders this thread's earlier generic shared-memory writes before later async-proxy
// (bulk copy) accesses of the same CTA.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if FLASHATTN_DECODE_BULK_CODE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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
#if FLASHATTN_DECODE_BULK_CODE
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
#endif
  return value;
}

}  // namespace flashattn::cuda::decode::bulk
