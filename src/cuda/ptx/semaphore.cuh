// src/cuda/ptx/semaphore.cuh — a global-memory int32 semaphore between CTAs: an
// acquire load to wait on it, a release store to advance it (sm_70 and newer).
//
// PTX ISA, "Parallel Synchronization and Communication Instructions" > "ld" (the
// .acquire qualifier), "st" (.release), and "Memory Consistency Model" > "Scope"
// (.gpu: every thread of the device). A release store by one CTA that an acquire load
// of another CTA reads synchronizes the two: the writer's earlier generic-proxy memory
// accesses happen before the reader's later ones. Async-proxy (TMA) accesses need
// fence_proxy_async_global (bulk_reduce.cuh) on each side as well.
#pragma once

#include <cstdint>

namespace flashattn::cuda::ptx {

// ld.acquire.gpu.global.b32: the value of *semaphore, ordered before this thread's later accesses.
__device__ __forceinline__ std::int32_t load_acquire_gpu(const std::int32_t* semaphore) {
  std::int32_t value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(semaphore) : "memory");
  return value;
}

// Spins (one thread) until *semaphore == expected; acquire semantics.
__device__ __forceinline__ void wait_until_equal_acquire_gpu(const std::int32_t* semaphore, std::int32_t expected) {
  while (load_acquire_gpu(semaphore) != expected) {
  }
}

// st.release.gpu.global.b32: *semaphore = value after this thread's earlier accesses.
__device__ __forceinline__ void store_release_gpu(std::int32_t* semaphore, std::int32_t value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(semaphore), "r"(value) : "memory");
}

}  // namespace flashattn::cuda::ptx
