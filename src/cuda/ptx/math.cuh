// src/cuda/ptx/math.cuh — special-function unit instructions.
//
// PTX ISA, "Floating Point Instructions" > "ex2": ex2.approx.ftz.f32 d, a computes
// 2^a on the SFU (MUFU.EX2 in SASS), maximum relative error 2^-22 over the full
// range; .ftz flushes subnormal inputs and results to sign-preserving zero.
// Plain exp2f compiles to the non-.ftz form, which adds range-fixing instructions
// around the MUFU for subnormal results; softmax probabilities below 2^-126 are zero
// for every purpose, so attention kernels use the .ftz form. ex2(-inf) = +0.
#pragma once

namespace flashattn::cuda::ptx {

__device__ __forceinline__ float exp2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashattn::cuda::ptx
