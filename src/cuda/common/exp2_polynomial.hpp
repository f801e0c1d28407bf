// src/cuda/common/exp2_polynomial.hpp — 2^x on the FMA pipe: a polynomial instead of
// the special-function unit's MUFU.EX2, for softmax loops that are MUFU-bound.
//
// Why: an SM issues 16 MUFU.EX2 per clock against 128 FP32 FMAs. At FP8 d128 (2 x 128
// FP8 FMAs per score at 4096/clk/SM) and bf16 d64 (2 x 64 at 2048) one exp2 per score
// takes the MUFU as long as the GEMMs take the tensor cores, so the softmax cannot hide
// under them (hopper_fp8/TUNING.md point 4). Computing a fraction of the exponentials
// here (FA4 does this on Blackwell) moves that work to the FMA pipe, which has room.
//
// Method (Cody-Waite): x = j + r with j = round(x), r in [-0.5, 0.5]; 2^r from a
// degree-N polynomial fitted for relative error (near-minimax, float32 Horner), then 2^j
// added to the exponent bits. Rounding x to an integer is one FADD of 1.5 * 2^23 (the
// sum's low mantissa bits are j), so no float-to-int conversion (the XU pipe) is needed:
// about 4 + N FP32 instructions and one integer shift-add. Max relative error over the
// range: degree 3 7.5e-5, degree 4 2.7e-6, degree 5 3.3e-7 (tests/core: every float of the outer binades of
// [-0.5, 0.5] and a sweep of x); MUFU.EX2's is 2^-22.
//
// Range: x <= 127 (the kernels' exponents are <= 0, FP8's <= 8). x is clamped below at
// -127, where the result is exactly +0: so exp2(-inf) = +0 as ex2.approx.ftz gives
// (masked scores must contribute nothing, and a row that sees no key must keep l = 0).
// Between -127 and -126.5 the result is a tiny subnormal (below 2^-126), where
// ex2.approx.ftz returns 0: no softmax weight that small matters.
#pragma once

#include <cstdint>
#include <cstring>

#include "flashattn/config.hpp"

namespace flashattn::cuda {

namespace exp2_polynomial_detail {

FLASHATTN_HOST_DEVICE std::uint32_t bits_of(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

FLASHATTN_HOST_DEVICE float float_of(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

// 2^r on [-0.5, 0.5], coefficients c0..cN (relative-error fits, float32-exact literals).
template <int kDegree>
struct Exp2Coefficients;
template <>
struct Exp2Coefficients<3> {
  static constexpr float c[4] = {0x1.fff692p-1f, 0x1.62f31ap-1f, 0x1.f0de1cp-3f, 0x1.c3f760p-5f};
};
template <>
struct Exp2Coefficients<4> {
  static constexpr float c[5] = {0x1.ffffe8p-1f, 0x1.62e0dcp-1f, 0x1.ec06dap-3f, 0x1.ca1442p-5f, 0x1.3997d4p-7f};
};
template <>
struct Exp2Coefficients<5> {
  // c0 one ulp below 1 rather than the fit's one above (3e-7 of error at r = 0): every
  // degree's 2^0 has exponent field 126, which the clamp at x = -127 needs (below).
  static constexpr float c[6] = {0x1.fffffep-1f, 0x1.62e428p-1f, 0x1.ebf918p-3f,
                                 0x1.c6b6e4p-5f, 0x1.3d0c54p-7f, 0x1.5c08e4p-10f};
};

}  // namespace exp2_polynomial_detail

// 2^x for x <= 127 (see the header), degree 3, 4 or 5.
template <int kDegree>
FLASHATTN_HOST_DEVICE float exp2_polynomial(float x) {
  using Coefficients = exp2_polynomial_detail::Exp2Coefficients<kDegree>;
  constexpr float kRoundingShift = 0x1.8p23f;  // x + 1.5 * 2^23 keeps round(x) in the low bits
  x = x > -127.0f ? x : -127.0f;               // also maps -inf (and NaN) to -127: +0 below
  const float shifted = x + kRoundingShift;
  const float r = x - (shifted - kRoundingShift);  // in [-0.5, 0.5]
  float p = Coefficients::c[kDegree];
FLASHATTN_UNROLL
  for (int k = kDegree - 1; k >= 0; --k) p = p * r + Coefficients::c[k];
  // shifted's bits are 0x4B400000 + round(x); shifted left by 23 only round(x) << 23 is left.
  // At x = -127 (r = 0, p = c0 just below 1: exponent field 126) the sum's exponent field
  // would be -1: clamp the bits at 0 so that the result is +0 (one integer max).
  const std::int32_t bits = static_cast<std::int32_t>(exp2_polynomial_detail::bits_of(p) +
                                                      (exp2_polynomial_detail::bits_of(shifted) << 23));
  return exp2_polynomial_detail::float_of(static_cast<std::uint32_t>(bits > 0 ? bits : 0));
}

}  // namespace flashattn::cuda
