// src/cuda/common/sfu_math.cuh — the special-function unit's arithmetic as the Math
// policy of flashattn/online_softmax.hpp (State, merge, rescale_factor, lse_of), for
// kernels whose softmax is issue-bound: the accurate exp2f/log2f/division routines
// cost tens of instructions each where these are one MUFU (plus a refinement for 1/x).
//   exp2:       ex2.approx.ftz (ptx/math.cuh; relative error 2^-22, ex2(-inf) = +0)
//   log2:       __log2f = lg2.approx (MUFU.LG2; only in the epilogue's LSE)
//   reciprocal: __frcp_rn, the correctly rounded 1/x (MUFU.RCP and one Newton step)
#pragma once

#include <cuda_runtime.h>

#include "src/cuda/ptx/math.cuh"

namespace flashattn::cuda {

struct SfuMath {
  __device__ __forceinline__ static float exp2(float x) { return ptx::exp2_approx_ftz(x); }
  __device__ __forceinline__ static float log2(float x) { return __log2f(x); }
  __device__ __forceinline__ static float reciprocal(float x) { return __frcp_rn(x); }
};

}  // namespace flashattn::cuda
