// src/core/float8.hpp — exact OCP FP8 E4M3 (PyTorch's float8_e4m3fn) conversions,
// host and device, by bit manipulation: the reference the FP8 KV-cache kernels and
// tests agree on bit for bit.
//
// E4M3: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; 0x7f/0xff NaN;
// largest finite 448 (0x7e), smallest normal 2^-6, smallest subnormal 2^-9.
//
// encode_e4m3 is the cache's quantiser: round to nearest, ties to even, saturating —
// a finite value beyond 448 and ±infinity become ±448, NaN the canonical 0x7f. That is
// PTX cvt.rn.satfinite.e4m3x2.f32 (CUDA's __NV_SATFINITE, what vLLM's FP8 cache writes
// use). PyTorch's x.to(torch.float8_e4m3fn) differs only out of range: it gives NaN for
// |x| > 464 (no saturation), so a scale that lets values exceed 448 is the caller's
// concern there, and clipped here.
#pragma once

#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <cmath>
#include <cstring>
#endif

#include "flashattn/config.hpp"

namespace flashattn::float8 {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr std::uint8_t kE4m3MaxBits = 0x7e;
inline constexpr std::uint8_t kE4m3NanBits = 0x7f;

FLASHATTN_HOST_DEVICE std::uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}
FLASHATTN_HOST_DEVICE float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// The value of an E4M3 byte (exact in float).
FLASHATTN_HOST_DEVICE float decode_e4m3(std::uint8_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x80u) << 24;
  const std::uint32_t exponent = (bits >> 3) & 0xfu, mantissa = bits & 0x7u;
  if (exponent == 0xfu && mantissa == 0x7u) return bits_float(sign | 0x7fc00000u);
  // Normal: rebias 7 -> 127 and widen the mantissa; subnormal: mantissa * 2^-9.
  if (exponent != 0) return bits_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
  return bits_float(sign | float_bits(static_cast<float>(mantissa) * 0.001953125f));
}

// The E4M3 byte nearest x (ties to even), saturating at ±448; NaN -> 0x7f.
FLASHATTN_HOST_DEVICE std::uint8_t encode_e4m3(float x) {
  const std::uint32_t u = float_bits(x);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return kE4m3NanBits;
  std::uint32_t magnitude;
  if (abs < 0x3c800000u) {
    // Below 2^-6: subnormal (or zero) in units of 2^-9; the float's rint rounds to even
    // (8 units is the smallest normal, whose bits are 0x08 as well).
    const float units = bits_float(abs) * 512.0f;
#if defined(__CUDA_ARCH__)
    magnitude = static_cast<std::uint32_t>(rintf(units));
#else
    magnitude = static_cast<std::uint32_t>(std::nearbyint(units));
#endif
  } else if (abs >= 0x43e00000u) {  // >= 448 (infinity included)
    magnitude = kE4m3MaxBits;
  } else {
    // Normal: rebias 127 -> 7 and round the 20 dropped mantissa bits to even; a carry
    // lands in the exponent, and past 448 (464 < |x| < 480 rounds to 0x7f) saturates.
    const std::uint32_t rebased = abs - (120u << 23);
    const std::uint32_t rounding = 0x7ffffu + ((rebased >> 20) & 1u);
    magnitude = (rebased + rounding) >> 20;
    if (magnitude > kE4m3MaxBits) magnitude = kE4m3MaxBits;
  }
  return static_cast<std::uint8_t>(sign | magnitude);
}

// The cache's quantisation of a value with its descale: stored = e4m3(x / descale),
// the division rounded in float32 (IEEE; kernels use __fdiv_rn), then encode_e4m3.
FLASHATTN_HOST_DEVICE std::uint8_t quantize_e4m3(float x, float descale) {
#if defined(__CUDA_ARCH__)
  return encode_e4m3(__fdiv_rn(x, descale));
#else
  return encode_e4m3(x / descale);
#endif
}

}  // namespace flashattn::float8
