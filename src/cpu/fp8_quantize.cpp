// src/cpu/fp8_quantize.cpp — quantize_fp8 on the CPU (flashattn/fp8.hpp): pass 1 takes
// the amax of every (batch, group) over the (rotated) rows, pass 2 rotates each row
// again and stores its e4m3 codes. The arithmetic is the CUDA kernel's, operation for
// operation (src/cuda/fp8_quantize.cu), so both give the same bits.
#include <cmath>
#include <cstdint>
#include <vector>

#include "flashattn/fp8.hpp"
#include "src/core/fp8_quantize_params.hpp"
#include "src/core/numeric.hpp"

namespace flashattn::cpu {
namespace {

// y = x R, R = H diag(s) / sqrt(d), in place: the fast Walsh–Hadamard transform
// (log2(d) butterfly stages, strides 1, 2, 4, ...: O(d log d)), then the scale and signs.
void rotate(float* row, std::int64_t head_dim, std::uint64_t seed) {
  for (std::int64_t half = 1; half < head_dim; half *= 2)
    for (std::int64_t block = 0; block < head_dim; block += 2 * half)
      for (std::int64_t j = block; j < block + half; ++j) {
        const float a = row[j], b = row[j + half];
        row[j] = a + b;
        row[j + half] = a - b;
      }
  const float inverse_sqrt = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (std::int64_t j = 0; j < head_dim; ++j) row[j] = row[j] * inverse_sqrt * hadamard_sign(seed, j);
}

// Row (b, i, h) of x as float32, rotated when asked.
void load_row(const QuantizeFp8Params& p, std::int64_t b, std::int64_t i, std::int64_t h, float* row) {
  const std::int64_t offset = p.x_offset(b, i, h);
  for (std::int64_t j = 0; j < p.head_dim; ++j) row[j] = numeric::load_as_float(p.x, p.dtype, offset + j);
  if (p.incoherent) rotate(row, p.head_dim, p.seed);
}

}  // namespace

void quantize_fp8(const QuantizeFp8Params& p) {
  const std::int64_t tasks = p.batch * p.groups;
#pragma omp parallel
  {
    std::vector<float> row(static_cast<std::size_t>(p.head_dim));
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / p.groups, group = task % p.groups;
      const std::int64_t first_head = group * p.heads_per_group;
      float amax = 0.0f;
      for (std::int64_t i = 0; i < p.seqlen; ++i)
        for (std::int64_t h = first_head; h < first_head + p.heads_per_group; ++h) {
          load_row(p, b, i, h, row.data());
          for (const float y : row) amax = std::fmax(amax, std::fabs(y));
        }
      const float descale = amax > 0.0f ? amax / kFloat8E4M3Max : 1.0f;
      for (std::int64_t i = 0; i < p.seqlen; ++i)
        for (std::int64_t h = first_head; h < first_head + p.heads_per_group; ++h) {
          load_row(p, b, i, h, row.data());
          std::uint8_t* codes = p.out + p.out_offset(b, i, h);
          for (std::int64_t j = 0; j < p.head_dim; ++j) codes[j] = numeric::float_to_float8_e4m3(row[static_cast<std::size_t>(j)] / descale);
        }
      p.descale[p.descale_offset(b, group)] = descale;
    }
  }
}

}  // namespace flashattn::cpu
