// src/cpu/tile_io.hpp — moving tiles between the strided, typed tensors of the
// params and the dense float32 tiles the TileKernels (kernels.hpp) work on. Each tile
// is converted once per block, so the micro-kernels see only float32 whatever the
// input dtype. The dtype switches have no error branch: cpu::forward/backward reject
// anything but the three float dtypes before any of this runs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "src/core/numeric.hpp"
#include "src/cpu/kernels.hpp"

namespace flashattn::cpu {

inline std::int64_t round_up(std::int64_t x, std::int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// One row of a typed tensor (head_dim elements at base + offset) into float dst,
// times `scale`.
inline void load_row(const void* base, DType dtype, std::int64_t offset, std::int64_t head_dim, float scale, float* dst) {
  switch (dtype) {
    case DType::float32: {
      const float* src = static_cast<const float*>(base) + offset;
      for (std::int64_t d = 0; d < head_dim; ++d) dst[d] = src[d] * scale;
      break;
    }
    case DType::float16:
    case DType::bfloat16: {
      const auto* src = static_cast<const std::uint16_t*>(base) + offset;
      const bool is_bfloat16 = dtype == DType::bfloat16;
      if (const auto convert = tile_kernels().half_to_float) {
        convert(src, is_bfloat16, head_dim, scale, dst);
      } else if (is_bfloat16) {
        for (std::int64_t d = 0; d < head_dim; ++d) dst[d] = numeric::bfloat16_to_float(src[d]) * scale;
      } else {
        for (std::int64_t d = 0; d < head_dim; ++d) dst[d] = numeric::float16_to_float(src[d]) * scale;
      }
      break;
    }
    default: break;
  }
}

// head_dim floats of src, times `scale`, into one row of a typed tensor (rounded to
// its dtype).
inline void store_row(const float* src, std::int64_t head_dim, float scale, void* base, DType dtype, std::int64_t offset) {
  switch (dtype) {
    case DType::float32: {
      float* dst = static_cast<float*>(base) + offset;
      for (std::int64_t d = 0; d < head_dim; ++d) dst[d] = src[d] * scale;
      break;
    }
    case DType::float16: {
      auto* dst = static_cast<std::uint16_t*>(base) + offset;
      for (std::int64_t d = 0; d < head_dim; ++d) dst[d] = numeric::float_to_float16(src[d] * scale);
      break;
    }
    case DType::bfloat16: {
      auto* dst = static_cast<std::uint16_t*>(base) + offset;
      for (std::int64_t d = 0; d < head_dim; ++d) dst[d] = numeric::float_to_bfloat16(src[d] * scale);
      break;
    }
    default: break;
  }
}

// (tile_rows, head_dim_padded) = rows [0, rows) of a head starting at offset, times
// scale; rows [rows, tile_rows) and columns past head_dim are zero.
inline void load_tile(const void* base, DType dtype, std::int64_t offset, std::int64_t row_stride, std::int64_t rows,
                      std::int64_t tile_rows, std::int64_t head_dim, std::int64_t head_dim_padded, float scale, float* tile) {
  for (std::int64_t r = 0; r < rows; ++r) {
    load_row(base, dtype, offset + r * row_stride, head_dim, scale, tile + r * head_dim_padded);
    std::fill(tile + r * head_dim_padded + head_dim, tile + (r + 1) * head_dim_padded, 0.0f);
  }
  std::fill(tile + rows * head_dim_padded, tile + tile_rows * head_dim_padded, 0.0f);
}

// The transpose (head_dim, tile_cols) of a (rows, head_dim) tile, times scale; columns
// [rows, tile_cols) are zero. `row_buffer` holds head_dim floats.
inline void load_tile_transposed(const void* base, DType dtype, std::int64_t offset, std::int64_t row_stride,
                                 std::int64_t rows, std::int64_t tile_cols, std::int64_t head_dim, float scale,
                                 float* tile_t, float* row_buffer) {
  std::fill(tile_t, tile_t + head_dim * tile_cols, 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    load_row(base, dtype, offset + r * row_stride, head_dim, scale, row_buffer);
    for (std::int64_t d = 0; d < head_dim; ++d) tile_t[d * tile_cols + r] = row_buffer[d];
  }
}

// Asks the cache for the next block's rows while this block computes: the rows of a
// head are heads·head_dim elements apart, one page each for typical sizes, which the
// hardware stream prefetchers do not follow.
inline void prefetch_rows(const void* base, DType dtype, std::int64_t offset, std::int64_t row_stride, std::int64_t rows,
                          std::int64_t head_dim) {
  const std::size_t element = dtype_size(dtype);
  const auto* bytes = static_cast<const char*>(base);
  const std::size_t row_bytes = static_cast<std::size_t>(head_dim) * element;
  for (std::int64_t r = 0; r < rows; ++r) {
    const char* row = bytes + static_cast<std::size_t>(offset + r * row_stride) * element;
    for (std::size_t line = 0; line < row_bytes; line += 64) __builtin_prefetch(row + line, 0, 2);
  }
}

// Zero-initialised float scratch aligned to 64 bytes (one cache line, the widest
// vector); std::vector<float> only promises 16.
class AlignedBuffer {
 public:
  static constexpr std::int64_t kAlignFloats = 16;
  explicit AlignedBuffer(std::int64_t count)
      : storage_(static_cast<std::size_t>(count + kAlignFloats)), data_(align(storage_.data())) {}
  float* data() { return data_; }
  const float* data() const { return data_; }

 private:
  static float* align(float* p) {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    const auto aligned = (address + 63) / 64 * 64;
    return reinterpret_cast<float*>(aligned);
  }
  std::vector<float> storage_;
  float* data_;
};

}  // namespace flashattn::cpu
