// src/cuda/ptx/bulk_reduce.cuh — bulk asynchronous reductions shared -> global (Hopper).
//
// PTX ISA, "Data Movement and Conversion Instructions" > "Data movement instructions
// using the Tensor Memory Accelerator (bulk, non-tensor)": "cp.reduce.async.bulk",
// "cp.async.bulk.commit_group", "cp.async.bulk.wait_group"; and "Parallel
// Synchronization and Communication Instructions" > "membar/fence" (fence.proxy.async,
// fence.proxy.async.global).
// sm_90 and newer.
//
// One thread hands a contiguous range of shared memory to the TMA unit, which adds
// it element-wise into global memory (each element atomically, in no defined order)
// while the threads go on computing. Rules the callers follow:
//   - shared memory written by ordinary stores must be made visible to the async
//     proxy first: every writing thread runs fence_proxy_async_shared() after its
//     stores, then a barrier, then the issuing thread issues the reduction;
//   - the source may be overwritten only after bulk_wait_group_read<0>() in the
//     issuing thread (and a barrier for the other threads);
//   - addresses 16-byte aligned, size a multiple of 16 bytes.
#pragma once

#include <cstdint>

namespace flashattn::cuda::ptx {

// cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [global], [shared], bytes:
// global[i] += shared[i] for the bytes / 4 floats of the range.
__device__ __forceinline__ void bulk_reduce_add_f32(float* global_destination, std::uint32_t shared_source,
                                                    std::uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(global_destination),
               "r"(shared_source), "r"(bytes)
               : "memory");
}

// cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [map, {c0..c3}],
// [shared] (PTX ISA "cp.reduce.async.bulk.tensor"): the map's box at coordinates (c0
// innermost) += the shared-memory box, element-wise and atomically, in the map's element
// type (here fp32) and with its swizzle applied to the shared-memory side; elements outside
// the tensor are skipped. `map` must live in parameter, constant or global memory (a
// __grid_constant__ kernel parameter's address). Same rules as bulk_reduce_add_f32.
__device__ __forceinline__ void tensor_reduce_add_4d(const void* map, std::uint32_t shared_source, std::int32_t c0,
                                                     std::int32_t c1, std::int32_t c2, std::int32_t c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          map),
      "r"(shared_source), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Closes the bulk group of the reductions this thread issued since the previous commit.
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most kPendingGroups of this thread's bulk groups still read their
// shared-memory source (the global writes may still be in flight).
template <int kPendingGroups>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPendingGroups) : "memory");
}

// Waits until at most kPendingGroups of this thread's bulk groups are incomplete
// (their global writes performed).
template <int kPendingGroups>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPendingGroups) : "memory");
}

// fence.proxy.async.shared::cta: orders this thread's prior generic-proxy accesses
// to shared memory before later async-proxy (TMA) accesses to it.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// fence.proxy.async.global: orders this thread's async-proxy (TMA) accesses to global
// memory with its generic-proxy accesses to it, both ways. Between a completed bulk
// reduction (bulk_wait_group<0>) and the release that publishes it, and between the
// acquire that waits for another CTA's reduction and the next bulk reduction.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

}  // namespace flashattn::cuda::ptx
