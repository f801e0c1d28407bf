// src/cpu/tile_kernels.hpp — the bodies of the TileKernels table (kernels.hpp),
// included by exactly one translation unit per ISA (kernels_<isa>.cpp), which
// defines FLASHATTN_CPU_VECTOR_BYTES and is compiled with the matching -m flags.
// Everything here has internal linkage and uses only compiler builtins.
//
// Written with GCC/Clang vector extensions: one source, every ISA.
#pragma once

#ifndef FLASHATTN_CPU_VECTOR_BYTES
#error "include tile_kernels.hpp from a kernels_<isa>.cpp that defines FLASHATTN_CPU_VECTOR_BYTES"
#endif

#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>  // static inline, always-inlined intrinsics: safe under per-file ISA flags
#endif

#include "src/cpu/kernels.hpp"

namespace flashattn::cpu {
namespace {

constexpr int kVectorBytes = FLASHATTN_CPU_VECTOR_BYTES;
constexpr int kLanes = kVectorBytes / static_cast<int>(sizeof(float));
typedef float Vec __attribute__((vector_size(kVectorBytes)));
typedef std::int32_t IntVec __attribute__((vector_size(kVectorBytes)));
static_assert(kTileWidthMultiple % kLanes == 0);

// Unaligned vector load/store. The intrinsics keep GCC from routing the micro-tile
// accumulators through a stack copy, which the memcpy form did (≈5% of a 64-deep tile).
inline Vec load(const float* p) {
#if FLASHATTN_CPU_VECTOR_BYTES == 64 && defined(__AVX512F__)
  return (Vec)_mm512_loadu_ps(p);
#elif FLASHATTN_CPU_VECTOR_BYTES == 32 && defined(__AVX__)
  return (Vec)_mm256_loadu_ps(p);
#else
  Vec v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
#endif
}
inline void store(float* p, Vec v) {
#if FLASHATTN_CPU_VECTOR_BYTES == 64 && defined(__AVX512F__)
  _mm512_storeu_ps(p, (__m512)v);
#elif FLASHATTN_CPU_VECTOR_BYTES == 32 && defined(__AVX__)
  _mm256_storeu_ps(p, (__m256)v);
#else
  __builtin_memcpy(p, &v, sizeof v);
#endif
}
inline Vec broadcast(float x) { return Vec{} + x; }
// Broadcast straight from memory: on x86 one vbroadcastss from the load port (GCC
// turns `Vec{} + *p` into a scalar load plus a shuffle on the port that AVX-512's
// second FMA unit shares).
inline Vec broadcast_from(const float* p) {
#if FLASHATTN_CPU_VECTOR_BYTES == 64 && defined(__AVX512F__)
  return (Vec)_mm512_set1_ps(*p);
#elif FLASHATTN_CPU_VECTOR_BYTES == 32 && defined(__AVX__)
  return (Vec)_mm256_broadcast_ss(p);
#else
  return broadcast(*p);
#endif
}
inline Vec vmax(Vec a, Vec b) { return a > b ? a : b; }

// 2^x: x = n + f with n = round(x), |f| <= 1/2; 2^f by its degree-6 Taylor polynomial
// (relative error < 2e-7, about float32's own rounding), 2^n added to the exponent
// bits. Rounding by the 1.5·2^23 trick: t = x + 1.5·2^23 holds round(x) in its low
// mantissa bits, so n needs no float<->int conversion, and (bits of t) << 23 is
// exactly n << 23. x < -126 (the mask's -inf included) gives exactly 0, so masked
// scores vanish; callers pass x <= 0 up to rounding, so there is no overflow. NaN
// stays NaN (the clamp alone would turn it into 2^-126 and silently drop the key).
inline Vec exp2(Vec x) {
  const Vec kRoundingMagic = broadcast(12582912.0f);  // 1.5 * 2^23
  const Vec clamped = vmax(x, broadcast(-126.0f));
  const Vec t = clamped + kRoundingMagic;
  const Vec f = clamped - (t - kRoundingMagic);
  // (ln 2)^k / k!
  Vec p = broadcast(1.5403530393381608e-4f);
  p = p * f + 1.3333558146428443e-3f;
  p = p * f + 9.6181291076284772e-3f;
  p = p * f + 5.5504108664821580e-2f;
  p = p * f + 2.4022650695910071e-1f;
  p = p * f + 6.9314718055994531e-1f;
  p = p * f + 1.0f;
  IntVec p_bits, t_bits;
  __builtin_memcpy(&p_bits, &p, sizeof p_bits);
  __builtin_memcpy(&t_bits, &t, sizeof t_bits);
  p_bits += t_bits << 23;
  Vec result;
  __builtin_memcpy(&result, &p_bits, sizeof result);
  const Vec finite = x < -126.0f ? Vec{} : result;
  return x == x ? finite : x;
}

// A (kRows, kVecs*kLanes) block of C held in registers for the whole depth loop: per
// depth step kVecs loads of B and kRows broadcasts of A feed kRows*kVecs FMAs.
// What a matmul does with C's old values.
enum class Update { kOverwrite, kAccumulate, kRescaleAccumulate };  // C = AB | C + AB | C ∘ column_scale + AB

template <int kRows, int kVecs, Update kUpdate>
inline void micro_tile(const float* a, std::int64_t a_row_stride, std::int64_t a_depth_stride, const float* b,
                       std::int64_t b_stride, std::int64_t depth, float* c, std::int64_t c_stride, const float* column_scale) {
  // One flat array, loops fully unrolled: GCC then keeps every accumulator in a
  // register (with acc[kRows][kVecs] it spilled them around the depth loop).
  Vec acc[kRows * kVecs];
#pragma GCC unroll 16
  for (int e = 0; e < kRows * kVecs; ++e) {
    if constexpr (kUpdate == Update::kOverwrite) acc[e] = Vec{};
    if constexpr (kUpdate == Update::kAccumulate) acc[e] = load(c + (e / kVecs) * c_stride + (e % kVecs) * kLanes);
    if constexpr (kUpdate == Update::kRescaleAccumulate)
      acc[e] = load(c + (e / kVecs) * c_stride + (e % kVecs) * kLanes) * load(column_scale + (e % kVecs) * kLanes);
  }
  for (std::int64_t k = 0; k < depth; ++k) {
    Vec b_row[kVecs];
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v) b_row[v] = load(b + k * b_stride + v * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const Vec a_value = broadcast_from(a + r * a_row_stride + k * a_depth_stride);
#pragma GCC unroll 16
      for (int v = 0; v < kVecs; ++v) acc[r * kVecs + v] += a_value * b_row[v];
    }
  }
#pragma GCC unroll 16
  for (int e = 0; e < kRows * kVecs; ++e) store(c + (e / kVecs) * c_stride + (e % kVecs) * kLanes, acc[e]);
}

// Register budget: 32 vector registers with AVX-512 (16 accumulators + 4 B rows +
// broadcasts), 16 otherwise (8 accumulators).
constexpr int kMicroRows = static_cast<int>(kTileRowsMultiple);
constexpr int kMicroVecs = kVectorBytes == 64 ? 4 : 2;

template <Update kUpdate>
void matmul_impl(const float* a, std::int64_t a_row_stride, std::int64_t a_depth_stride, const float* b, std::int64_t b_stride,
                 std::int64_t depth, float* c, std::int64_t c_stride, std::int64_t rows, std::int64_t width, const float* column_scale) {
  for (std::int64_t r = 0; r < rows; r += kMicroRows) {
    const float* a_rows = a + r * a_row_stride;
    float* c_rows = c + r * c_stride;
    std::int64_t col = 0;
    for (; col + kMicroVecs * kLanes <= width; col += kMicroVecs * kLanes)
      micro_tile<kMicroRows, kMicroVecs, kUpdate>(a_rows, a_row_stride, a_depth_stride, b + col, b_stride, depth, c_rows + col, c_stride,
                                                  column_scale + col);
    for (; col < width; col += kLanes)
      micro_tile<kMicroRows, 1, kUpdate>(a_rows, a_row_stride, a_depth_stride, b + col, b_stride, depth, c_rows + col, c_stride,
                                         column_scale + col);
  }
}

void matmul(const float* a, std::int64_t a_row_stride, std::int64_t a_depth_stride, const float* b, std::int64_t b_stride,
            std::int64_t depth, float* c, std::int64_t c_stride, std::int64_t rows, std::int64_t width, bool accumulate) {
  if (accumulate)
    matmul_impl<Update::kAccumulate>(a, a_row_stride, a_depth_stride, b, b_stride, depth, c, c_stride, rows, width, nullptr);
  else
    matmul_impl<Update::kOverwrite>(a, a_row_stride, a_depth_stride, b, b_stride, depth, c, c_stride, rows, width, nullptr);
}

void matmul_rescaled(const float* a, std::int64_t a_row_stride, std::int64_t a_depth_stride, const float* b, std::int64_t b_stride,
                     std::int64_t depth, float* c, std::int64_t c_stride, std::int64_t rows, std::int64_t width,
                     const float* column_scale) {
  matmul_impl<Update::kRescaleAccumulate>(a, a_row_stride, a_depth_stride, b, b_stride, depth, c, c_stride, rows, width, column_scale);
}

void column_max(const float* s, std::int64_t stride, std::int64_t rows, std::int64_t width, float* out) {
  for (std::int64_t i = 0; i < width; i += kLanes) {
    Vec m = load(s + i);
    for (std::int64_t r = 1; r < rows; ++r) m = vmax(m, load(s + r * stride + i));
    store(out + i, m);
  }
}

void exp2_columns(float* s, std::int64_t stride, std::int64_t rows, std::int64_t width, const float* base, float* maybe_sum) {
  for (std::int64_t i = 0; i < width; i += kLanes) {
    const Vec column_base = load(base + i);
    Vec sum{};
    for (std::int64_t r = 0; r < rows; ++r) {
      const Vec p = exp2(load(s + r * stride + i) - column_base);
      store(s + r * stride + i, p);
      sum += p;
    }
    if (maybe_sum) store(maybe_sum + i, sum);
  }
}

void score_gradient(const float* p, float* ds, std::int64_t stride, std::int64_t rows, std::int64_t width, const float* delta,
                    const float* maybe_slope) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < width; i += kLanes) {
      const std::int64_t e = r * stride + i;
      Vec value = load(p + e) * (load(ds + e) - load(delta + i));
      if (maybe_slope) value *= load(maybe_slope + e);
      store(ds + e, value);
    }
}

#if FLASHATTN_CPU_VECTOR_BYTES >= 32 && defined(__F16C__)
// float16 by F16C (vcvtph2ps), bfloat16 by widening to 32 bits and shifting into the
// high half; 8 (AVX2) or 16 (AVX-512) values per step, the tail one at a time.
// GCC 12 flags the _mm512_undefined_* inside avx512fintrin.h's conversions as
// maybe-uninitialized: a false positive, silenced for this function only.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
void half_to_float(const std::uint16_t* src, bool is_bfloat16, std::int64_t count, float scale, float* dst) {
  std::int64_t e = 0;
#if FLASHATTN_CPU_VECTOR_BYTES == 64 && defined(__AVX512F__)
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (; e + 16 <= count; e += 16) {
    const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + e));
    const __m512 values = is_bfloat16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16))
                                      : _mm512_cvtph_ps(halves);
    _mm512_storeu_ps(dst + e, _mm512_mul_ps(values, scale_v));
  }
#else
  const __m256 scale_v = _mm256_set1_ps(scale);
  for (; e + 8 <= count; e += 8) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + e));
    const __m256 values = is_bfloat16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16))
                                      : _mm256_cvtph_ps(halves);
    _mm256_storeu_ps(dst + e, _mm256_mul_ps(values, scale_v));
  }
#endif
  for (; e < count; ++e) {
    float value;
    if (is_bfloat16) {
      const std::uint32_t bits = static_cast<std::uint32_t>(src[e]) << 16;
      __builtin_memcpy(&value, &bits, sizeof value);
    } else {
      value = _cvtsh_ss(src[e]);
    }
    dst[e] = value * scale;
  }
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
constexpr auto kHalfToFloat = &half_to_float;
#else
constexpr decltype(TileKernels::half_to_float) kHalfToFloat = nullptr;
#endif

constexpr TileKernels make_table(const char* isa) {
  return TileKernels{isa, &matmul, &matmul_rescaled, &column_max, &exp2_columns, kHalfToFloat, &score_gradient};
}

}  // namespace
}  // namespace flashattn::cpu
