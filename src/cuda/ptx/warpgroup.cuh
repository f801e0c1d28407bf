// src/cuda/ptx/warpgroup.cuh — warp-specialisation primitives of sm_90a: register
// reallocation between warpgroups and named barriers among a subset of warps.
//
// PTX ISA 9.7.19.5 "setmaxnreg": setmaxnreg.{inc,dec}.sync.aligned.u32 N moves the
//   per-thread register limit of the executing warpgroup to N (a multiple of 8 in
//   [24, 256]); every warp of the warpgroup must execute the same instruction. Only
//   effective when the kernel has a register cap at entry (__launch_bounds__(t, 1)).
// PTX ISA 9.7.13.1 "bar.sync / bar.arrive": barrier `id` (1..15; 0 is __syncthreads)
//   completes once `thread_count` threads (a multiple of 32) have arrived; bar.arrive
//   arrives without waiting (the producer side of a ping-pong).
#pragma once

#include <cstdint>

namespace flashattn::cuda::ptx {

template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_increase() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg: 24..256, multiple of 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_decrease() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg: 24..256, multiple of 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

__device__ __forceinline__ void named_barrier_sync(int id, int thread_count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(thread_count) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int thread_count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(thread_count) : "memory");
}

}  // namespace flashattn::cuda::ptx
