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
