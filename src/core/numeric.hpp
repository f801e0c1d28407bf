// src/core/numeric.hpp — host conversions between float and the storage formats:
// IEEE binary16 and bfloat16 (round-to-nearest-even, NaN/Inf preserved) and OCP FP8
// E4M3 (PyTorch's float8_e4m3fn; see float_to_float8_e4m3 for its overflow rule).
#pragma once

#include <cstdint>
#include <cstring>

#include "flashattn/tensor.hpp"
#include "src/core/float8.hpp"

namespace flashattn::numeric {

inline std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

inline float bfloat16_to_float(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }

inline std::uint16_t float_to_bfloat16(float x) {
  const std::uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

inline float float16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // Inf/NaN
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);
    // Subnormal: value = mantissa * 2^-24.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline std::uint16_t float_to_float16(float x) {
  const std::uint32_t u = float_bits(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to Inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): scale so the float's rounding does the work.
    const float magnitude = bits_float(abs) * 16777216.0f;  // * 2^24: units of the smallest subnormal
    const auto rounded = static_cast<std::uint32_t>(__builtin_nearbyintf(magnitude));
    return static_cast<std::uint16_t>(sign | rounded);
  }
  // Normal: rebias exponent 127 -> 15 and round the 13 dropped mantissa bits to even.
  const std::uint32_t rebased = abs - (112u << 23);
  const std::uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rebased + rounding) >> 13));
}

// E4M3 (src/core/float8.hpp holds the one codec, host and device).
inline float float8_e4m3_to_float(std::uint8_t code) { return float8::decode_e4m3(code); }

// float -> E4M3 rounded to nearest, ties to even, exactly as PyTorch's
// x.to(torch.float8_e4m3fn) (c10 fp8e4m3fn_from_fp32_value): it does NOT saturate. A
// magnitude that rounds past 448 (> 464, the midpoint between 448 and the NaN code's
// 480) and Inf become NaN (0x7f with the sign); NaN stays NaN. In range it is the
// cache's saturating encoder (float8::encode_e4m3). Quantisers scale by amax / 448
// first, so they never reach the NaN branch.
inline std::uint8_t float_to_float8_e4m3(float x) {
  const std::uint32_t u = float_bits(x);
  constexpr std::uint32_t kFirstOverflow = 0x43e80001u;  // the float just above 464
  if ((u & 0x7fffffffu) >= kFirstOverflow) return static_cast<std::uint8_t>(((u >> 24) & 0x80u) | 0x7fu);
  return float8::encode_e4m3(x);
}

// Element load/store by dtype, for the portable (non-hot) paths and tests.
inline float load_as_float(const void* base, DType dtype, std::int64_t index) {
  switch (dtype) {
    case DType::float32: return static_cast<const float*>(base)[index];
    case DType::float16: return float16_to_float(static_cast<const std::uint16_t*>(base)[index]);
    case DType::bfloat16: return bfloat16_to_float(static_cast<const std::uint16_t*>(base)[index]);
    case DType::float8_e4m3: return float8_e4m3_to_float(static_cast<const std::uint8_t*>(base)[index]);
    default: return 0.0f;
  }
}

inline void store_from_float(void* base, DType dtype, std::int64_t index, float value) {
  switch (dtype) {
    case DType::float32: static_cast<float*>(base)[index] = value; break;
    case DType::float16: static_cast<std::uint16_t*>(base)[index] = float_to_float16(value); break;
    case DType::bfloat16: static_cast<std::uint16_t*>(base)[index] = float_to_bfloat16(value); break;
    case DType::float8_e4m3: static_cast<std::uint8_t*>(base)[index] = float_to_float8_e4m3(value); break;
    default: break;
  }
}

// Round a float to what the storage dtype can hold (identity for float32).
inline float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::float16: return float16_to_float(float_to_float16(value));
    case DType::bfloat16: return bfloat16_to_float(float_to_bfloat16(value));
    case DType::float8_e4m3: return float8_e4m3_to_float(float_to_float8_e4m3(value));
    default: return value;
  }
}

}  // namespace flashattn::numeric
