// tests/cpu/test_tile_kernels.cpp — every TileKernels table this CPU can run
// (baseline always; AVX2 and AVX-512 when present) against plain scalar loops, so a
// machine with AVX-512 also checks the code paths other machines will take.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "src/core/numeric.hpp"
#include "src/cpu/kernels.hpp"

namespace flashattn::cpu {
namespace {

std::vector<const TileKernels*> runnable_tables() {
  std::vector<const TileKernels*> tables{&tile_kernels_baseline()};
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    tables.push_back(&tile_kernels_avx2());
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c"))
    tables.push_back(&tile_kernels_avx512());
#endif
  return tables;
}

std::vector<float> random_values(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& x : values) x = normal(rng);
  return values;
}

TEST(TileKernels, ChosenTableIsOneOfTheRunnable) {
  const auto tables = runnable_tables();
  EXPECT_NE(std::find(tables.begin(), tables.end(), &tile_kernels()), tables.end()) << tile_kernels().isa;
}

// C (rows, width) [+]= A B with A read through both stride orders.
TEST(TileKernels, MatmulMatchesScalarLoops) {
  const std::int64_t rows = 12, depth = 37, width = 80;
  const auto a = random_values(static_cast<std::size_t>(rows * depth), 1);
  const auto b = random_values(static_cast<std::size_t>(depth * width), 2);
  const auto c0 = random_values(static_cast<std::size_t>(rows * width), 3);
  for (const TileKernels* kernels : runnable_tables()) {
    for (bool accumulate : {false, true}) {
      for (bool a_transposed : {false, true}) {
        // A stored (rows, depth) or (depth, rows).
        std::vector<float> a_stored(a.size());
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t k = 0; k < depth; ++k)
            a_stored[static_cast<std::size_t>(a_transposed ? k * rows + r : r * depth + k)] = a[static_cast<std::size_t>(r * depth + k)];
        std::vector<float> c = c0;
        kernels->matmul(a_stored.data(), a_transposed ? 1 : depth, a_transposed ? rows : 1, b.data(), width, depth, c.data(), width, rows,
                        width, accumulate);
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t col = 0; col < width; ++col) {
            double expected = accumulate ? c0[static_cast<std::size_t>(r * width + col)] : 0.0;
            for (std::int64_t k = 0; k < depth; ++k)
              expected += static_cast<double>(a[static_cast<std::size_t>(r * depth + k)]) * b[static_cast<std::size_t>(k * width + col)];
            ASSERT_NEAR(c[static_cast<std::size_t>(r * width + col)], expected, 1e-4) << kernels->isa << " r " << r << " c " << col;
          }
      }
    }
  }
}

TEST(TileKernels, MatmulRescaledScalesOldColumnsFirst) {
  const std::int64_t rows = 8, depth = 19, width = 48;
  const auto a = random_values(static_cast<std::size_t>(rows * depth), 11);
  const auto b = random_values(static_cast<std::size_t>(depth * width), 12);
  const auto c0 = random_values(static_cast<std::size_t>(rows * width), 13);
  auto scale = random_values(static_cast<std::size_t>(width), 14);
  scale[0] = 0.0f, scale[1] = 1.0f;
  for (const TileKernels* kernels : runnable_tables()) {
    std::vector<float> c = c0;
    kernels->matmul_rescaled(a.data(), depth, 1, b.data(), width, depth, c.data(), width, rows, width, scale.data());
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t col = 0; col < width; ++col) {
        double expected = static_cast<double>(c0[static_cast<std::size_t>(r * width + col)]) * scale[static_cast<std::size_t>(col)];
        for (std::int64_t k = 0; k < depth; ++k)
          expected += static_cast<double>(a[static_cast<std::size_t>(r * depth + k)]) * b[static_cast<std::size_t>(k * width + col)];
        ASSERT_NEAR(c[static_cast<std::size_t>(r * width + col)], expected, 1e-4) << kernels->isa;
      }
  }
}

TEST(TileKernels, ColumnMaxAndExp2Columns) {
  const std::int64_t rows = 5, width = 48;
  auto s = random_values(static_cast<std::size_t>(rows * width), 4);
  for (float& x : s) x *= 30.0f;  // exponents from about -120 to 0 after subtracting the max
  s[3] = -std::numeric_limits<float>::infinity();  // masked
  s[static_cast<std::size_t>(2 * width + 7)] = -200.0f;  // underflows to exactly 0
  for (const TileKernels* kernels : runnable_tables()) {
    std::vector<float> column_max(static_cast<std::size_t>(width)), sums(static_cast<std::size_t>(width));
    kernels->column_max(s.data(), width, rows, width, column_max.data());
    std::vector<float> p = s;
    kernels->exp2_columns(p.data(), width, rows, width, column_max.data(), sums.data());
    for (std::int64_t i = 0; i < width; ++i) {
      float expected_max = -std::numeric_limits<float>::infinity();
      double expected_sum = 0.0;
      for (std::int64_t r = 0; r < rows; ++r) expected_max = std::max(expected_max, s[static_cast<std::size_t>(r * width + i)]);
      ASSERT_EQ(column_max[static_cast<std::size_t>(i)], expected_max) << kernels->isa;
      for (std::int64_t r = 0; r < rows; ++r) {
        const float x = s[static_cast<std::size_t>(r * width + i)] - expected_max;
        const double expected = x < -126.0f ? 0.0 : std::exp2(static_cast<double>(x));
        const float got = p[static_cast<std::size_t>(r * width + i)];
        if (expected == 0.0)
          ASSERT_EQ(got, 0.0f) << kernels->isa;
        else
          ASSERT_NEAR(got / expected, 1.0, 3e-7) << kernels->isa << " x " << x;
        expected_sum += got;
      }
      ASSERT_NEAR(sums[static_cast<std::size_t>(i)], expected_sum, 1e-5 * expected_sum) << kernels->isa;
    }
  }
}

// Bitwise the host conversions of numeric.hpp (both are exact), subnormals, infinities
// and a count that leaves a tail after the vector steps.
TEST(TileKernels, HalfToFloatMatchesHostConversions) {
  const std::int64_t count = 53;
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(count));
  for (std::int64_t e = 0; e < count; ++e) bits[static_cast<std::size_t>(e)] = static_cast<std::uint16_t>(e * 1237 + 11);
  bits[0] = 0x0001, bits[1] = 0x7c00, bits[2] = 0x8000, bits[3] = 0x03ff;  // fp16: smallest subnormal, +inf, -0, largest subnormal
  for (const TileKernels* kernels : runnable_tables()) {
    if (!kernels->half_to_float) continue;  // the baseline converts in tile_io.hpp
    for (bool is_bfloat16 : {false, true}) {
      std::vector<float> got(static_cast<std::size_t>(count));
      kernels->half_to_float(bits.data(), is_bfloat16, count, 0.5f, got.data());
      for (std::int64_t e = 0; e < count; ++e) {
        const std::uint16_t h = bits[static_cast<std::size_t>(e)];
        const float expected = (is_bfloat16 ? numeric::bfloat16_to_float(h) : numeric::float16_to_float(h)) * 0.5f;
        if (std::isnan(expected))
          ASSERT_TRUE(std::isnan(got[static_cast<std::size_t>(e)])) << kernels->isa;
        else
          ASSERT_EQ(got[static_cast<std::size_t>(e)], expected) << kernels->isa << " bits " << h << (is_bfloat16 ? " bf16" : " fp16");
      }
    }
  }
}

TEST(TileKernels, ScoreGradient) {
  const std::int64_t rows = 3, width = 32;
  const auto p = random_values(static_cast<std::size_t>(rows * width), 5);
  const auto dp = random_values(static_cast<std::size_t>(rows * width), 6);
  const auto delta = random_values(static_cast<std::size_t>(width), 7);
  const auto slope = random_values(static_cast<std::size_t>(rows * width), 8);
  for (const TileKernels* kernels : runnable_tables())
    for (bool with_slope : {false, true}) {
      std::vector<float> ds = dp;
      kernels->score_gradient(p.data(), ds.data(), width, rows, width, delta.data(), with_slope ? slope.data() : nullptr);
      for (std::int64_t e = 0; e < rows * width; ++e) {
        const auto u = static_cast<std::size_t>(e);
        const double expected = static_cast<double>(p[u]) * (dp[u] - delta[u % width]) * (with_slope ? slope[u] : 1.0f);
        ASSERT_NEAR(ds[u], expected, 1e-5) << kernels->isa;
      }
    }
}

}  // namespace
}  // namespace flashattn::cpu
