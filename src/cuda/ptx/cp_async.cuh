// src/cuda/ptx/cp_async.cuh — asynchronous global -> shared copies (Ampere+).
//
// PTX ISA, "Data Movement and Conversion Instructions" > "Asynchronous copy" >
// "cp.async", "cp.async.commit_group", "cp.async.wait_group"; sm_80 and newer.
// Each thread copies its own 16 bytes; copies issued since the last commit form a
// group; wait_group<N> blocks until at most N of this thread's groups are still in
// flight. The data is visible to other threads only after wait_group *and* a
// barrier (__syncthreads / named barrier).
#pragma once

#include <cstdint>

namespace flashattn::cuda::ptx {

// cp.async.cg.shared.global [dst], [src], 16, src_size: copies 16 bytes, bypassing
// L1 (.cg). When is_valid is false, src_size = 0: nothing is read from global memory
// (src may then be any mapped-or-not address, we pass a valid base anyway) and the
// 16 destination bytes are zero-filled. This is how tile tails (rows past the
// sequence, head-dim columns past head_dim) become zeros without branches.
__device__ __forceinline__ void cp_async_16(std::uint32_t shared_destination, const void* global_source,
                                            bool is_valid) {
  const int source_bytes = is_valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_destination), "l"(global_source),
               "r"(source_bytes)
               : "memory");
}

// Closes the group of copies issued by this thread since the previous commit.
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most kPendingGroups of this thread's committed groups are still in flight.
template <int kPendingGroups>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPendingGroups) : "memory");
}

}  // namespace flashattn::cuda::ptx
