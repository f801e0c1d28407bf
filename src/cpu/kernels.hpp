// src/cpu/kernels.hpp — the vectorised tile operations of the CPU flash paths, as a
// table of functions compiled once per ISA (kernels_avx512.cpp, kernels_avx2.cpp,
// kernels_baseline.cpp, all from tile_kernels.hpp) and chosen at run time, so one
// binary is fast on AVX-512 machines and still runs on any x86-64 (or other) CPU.
//
// Only these leaf functions are built with ISA flags, and they use no inline code
// from other headers: an inline function compiled with -mavx512f in one translation
// unit and without it in another is one symbol to the linker, which could keep the
// AVX-512 copy for everyone. The flash loops (flash2_forward.cpp, flash_backward.cpp)
// are compiled once, for the baseline, and call through the table once per tile.
//
// All tiles are float32, row-major with the given row strides (in floats).
// Unless stated otherwise, `width` must be a multiple of kTileWidthMultiple and
// `rows` of kTileRowsMultiple; callers zero-pad their tiles to meet that.
#pragma once

#include <cstdint>

namespace flashattn::cpu {

inline constexpr std::int64_t kTileWidthMultiple = 16;  // the widest vector: 16 floats (AVX-512)
inline constexpr std::int64_t kTileRowsMultiple = 4;    // the micro-tile height

struct TileKernels {
  const char* isa;
  // C (rows, width) = [C +] A (rows, depth) B (depth, width). A is read as scalars
  // at a[r * a_row_stride + k * a_depth_stride], so it may be any layout (K, V^T,
  // P^T, dS, ...); B and C are dense rows.
  void (*matmul)(const float* a, std::int64_t a_row_stride, std::int64_t a_depth_stride, const float* b,
                 std::int64_t b_stride, std::int64_t depth, float* c, std::int64_t c_stride, std::int64_t rows,
                 std::int64_t width, bool accumulate);
  // C (rows, width) = C ∘ column_scale + A (rows, depth) B (depth, width): the online
  // softmax's rescale of O^T fused into its update (column_scale has width floats).
  void (*matmul_rescaled)(const float* a, std::int64_t a_row_stride, std::int64_t a_depth_stride, const float* b,
                          std::int64_t b_stride, std::int64_t depth, float* c, std::int64_t c_stride, std::int64_t rows,
                          std::int64_t width, const float* column_scale);
  // column_max[i] = max_r s[r][i]  (rows >= 1).
  void (*column_max)(const float* s, std::int64_t stride, std::int64_t rows, std::int64_t width, float* column_max);
  // s[r][i] = 2^(s[r][i] - base[i]) in place (2^-inf = 0, exactly); maybe_column_sum[i]
  // = sum_r of the results when given.
  void (*exp2_columns)(float* s, std::int64_t stride, std::int64_t rows, std::int64_t width, const float* base,
                       float* maybe_column_sum);
  // dst[e] = float(src[e]) * scale for e < count, src float16 (or bfloat16 when
  // is_bfloat16). Null in the baseline table (tile_io.hpp then converts one by one).
  void (*half_to_float)(const std::uint16_t* src, bool is_bfloat16, std::int64_t count, float scale, float* dst);
  // ds[r][i] = p[r][i] * (ds[r][i] - delta[i]) [* maybe_slope[r][i]]: dS = P ∘ (dP - D),
  // times the softcap derivative when given. All three tiles share `stride`.
  void (*score_gradient)(const float* p, float* ds, std::int64_t stride, std::int64_t rows, std::int64_t width,
                         const float* delta, const float* maybe_slope);
};

// The table for the CPU this runs on (AVX-512 > AVX2+FMA > baseline).
const TileKernels& tile_kernels();

const TileKernels& tile_kernels_baseline();
#if defined(__x86_64__) || defined(_M_X64)
const TileKernels& tile_kernels_avx2();
const TileKernels& tile_kernels_avx512();
#endif

}  // namespace flashattn::cpu
