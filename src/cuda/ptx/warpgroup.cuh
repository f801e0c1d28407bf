// src/cuda/ptx/warpgroup.cuh — register reallocation between the warpgroups of a
// warp-specialised sm_90a kernel (its named barriers: named_barrier.cuh).
//
// PTX ISA 9.7.19.5 "setmaxnreg": setmaxnreg.{inc,dec}.sync.aligned.u32 N moves the
//   per-thread register limit of the executing warpgroup to N (a multiple of 8 in
//   [24, 256]); every warp of the warpgroup must execute the same instruction. Only
//   effective when the kernel has a register cap at entry (__launch_bounds__(t, 1)).
#pragma once

#include <cstdint>

namespace flashattn::cuda::ptx {

inline constexpr int kWarpSize = 32;
inline constexpr int kWarpgroupThreads = 128;  // 4 consecutive warps, the unit of wgmma and setmaxnreg
inline constexpr int kWarpgroupRows = 64;      // wgmma's M: the rows of D one warpgroup owns

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

}  // namespace flashattn::cuda::ptx
