// src/cuda/ptx/named_barrier.cuh — named barriers: synchronisation among a subset of
// the CTA's warps (a warpgroup, the consumer warps of a warp-specialised kernel).
//
// PTX ISA 9.7.13.1 "bar.sync / bar.arrive": barrier `id` (1..15; 0 is __syncthreads)
//   completes once `thread_count` threads (a multiple of 32) have arrived; bar.arrive
//   arrives without waiting (the producer side of a ping-pong).
// Ids come from one registry (common/named_barriers.hpp, an enum per kernel family);
// the enum overloads are what kernels call, so no kernel writes a raw id.
#pragma once

#include <type_traits>

namespace flashattn::cuda::ptx {

__device__ __forceinline__ void named_barrier_sync(int id, int thread_count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(thread_count) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int thread_count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(thread_count) : "memory");
}

// The same, executed only where `is_on` (a predicate inside the asm, no branch: a
// run-time switch leaves the caller's control flow, and so its register allocation, as
// without the barrier). The aligned forms first converge the warp (bar.warp.sync), under
// the same predicate. The _unaligned forms (barrier.sync / barrier.arrive without
// .aligned) are for a warp that need not be converged, e.g. one lane of a producer warp
// whose other lanes have exited: the barrier counts warps — the executing thread waits
// for its warp's non-exited threads and marks the whole warp arrived — so thread_count
// still counts 32 per participating warp.
__device__ __forceinline__ void named_barrier_sync_if(bool is_on, int id, int thread_count) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %0, 0;\n @p bar.warp.sync -1;\n @p bar.sync %1, %2;\n}\n" ::"r"(
          static_cast<int>(is_on)),
      "r"(id), "r"(thread_count)
      : "memory");
}

__device__ __forceinline__ void named_barrier_arrive_if(bool is_on, int id, int thread_count) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %0, 0;\n @p bar.warp.sync -1;\n @p bar.arrive %1, %2;\n}\n" ::"r"(
          static_cast<int>(is_on)),
      "r"(id), "r"(thread_count)
      : "memory");
}

__device__ __forceinline__ void named_barrier_sync_unaligned_if(bool is_on, int id, int thread_count) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %0, 0;\n @p barrier.sync %1, %2;\n}\n" ::"r"(
                   static_cast<int>(is_on)),
               "r"(id), "r"(thread_count)
               : "memory");
}

__device__ __forceinline__ void named_barrier_arrive_unaligned_if(bool is_on, int id, int thread_count) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %0, 0;\n @p barrier.arrive %1, %2;\n}\n" ::"r"(
                   static_cast<int>(is_on)),
               "r"(id), "r"(thread_count)
               : "memory");
}

// Barrier `first + index` of a registry enum (one barrier per warpgroup: index = which).
template <class Barrier>
  requires std::is_enum_v<Barrier>
__device__ __forceinline__ void named_barrier_sync(Barrier first, int thread_count, int index = 0) {
  named_barrier_sync(static_cast<int>(first) + index, thread_count);
}

template <class Barrier>
  requires std::is_enum_v<Barrier>
__device__ __forceinline__ void named_barrier_arrive(Barrier first, int thread_count, int index = 0) {
  named_barrier_arrive(static_cast<int>(first) + index, thread_count);
}

}  // namespace flashattn::cuda::ptx
