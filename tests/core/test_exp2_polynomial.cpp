// The FMA-pipe exp2 (src/cuda/common/exp2_polynomial.hpp) against std::exp2 in double:
// its stated relative errors over [-0.5, 0.5] (every float there) and over the kernels'
// range, exact zero at -127 and below (-inf and NaN included), powers of two exact up to
// the polynomial's error at r = 0, and monotone where softmax relies on order (max first).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "src/cuda/common/exp2_polynomial.hpp"

namespace flashattn::cuda {
namespace {

template <int kDegree>
double max_relative_error(float low, float high, float step) {
  double worst = 0.0;
  for (float x = low; x <= high; x += step) {
    const double exact = std::exp2(static_cast<double>(x));
    worst = std::max(worst, std::abs(static_cast<double>(exp2_polynomial<kDegree>(x)) / exact - 1.0));
  }
  return worst;
}

// Every float of [0.25, 0.5] and of [-0.5, -0.25] (the error peaks at the ends; 2^24
// points), and a sweep of [-0.25, 0.25] in steps of 2^-16.
template <int kDegree>
double max_relative_error_on_the_reduced_interval() {
  double worst = max_relative_error<kDegree>(-0.25f, 0.25f, 1.0f / 65536);
  for (float x = 0.25f; x <= 0.5f; x = std::nextafter(x, 1.0f)) {
    for (const float signed_x : {x, -x}) {
      const double exact = std::exp2(static_cast<double>(signed_x));
      worst = std::max(worst, std::abs(static_cast<double>(exp2_polynomial<kDegree>(signed_x)) / exact - 1.0));
    }
  }
  return worst;
}

TEST(Exp2Polynomial, RelativeErrorOnTheReducedInterval) {
  EXPECT_LT(max_relative_error_on_the_reduced_interval<3>(), 7.6e-5);
  EXPECT_LT(max_relative_error_on_the_reduced_interval<4>(), 2.8e-6);
  EXPECT_LT(max_relative_error_on_the_reduced_interval<5>(), 3.4e-7);
}

TEST(Exp2Polynomial, RelativeErrorOverTheKernelsRange) {
  // Softmax exponents are <= 0 (FP8's <= 8); results are normal floats from -125.
  EXPECT_LT(max_relative_error<3>(-125.0f, 8.0f, 0.000731f), 7.6e-5);
  EXPECT_LT(max_relative_error<4>(-125.0f, 8.0f, 0.000731f), 2.8e-6);
  EXPECT_LT(max_relative_error<5>(-125.0f, 8.0f, 0.000731f), 3.4e-7);
}

TEST(Exp2Polynomial, ZeroAtAndBelowTheClampLikeTheFtzInstruction) {
  for (const float x : {-127.0f, -127.5f, -200.0f, -1e30f, -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()}) {
    const float y3 = exp2_polynomial<3>(x), y4 = exp2_polynomial<4>(x), y5 = exp2_polynomial<5>(x);
    EXPECT_EQ(y3, 0.0f) << x;
    EXPECT_EQ(y4, 0.0f) << x;
    EXPECT_EQ(y5, 0.0f) << x;
    EXPECT_FALSE(std::signbit(y3)) << x;  // +0, as ex2.approx.ftz(-inf)
  }
  // Just above the clamp the result is tiny and finite, never negative or NaN.
  for (float x = -127.0f; x < -125.0f; x += 0.01f) {
    const float y = exp2_polynomial<3>(x);
    EXPECT_GE(y, 0.0f) << x;
    EXPECT_LT(y, 1e-37f) << x;
  }
}

TEST(Exp2Polynomial, MonotoneAcrossTheRoundingSeams) {
  // Seams at half-integers, where r jumps from 0.5 to -0.5 and j steps by one.
  for (int j = -120; j <= 8; ++j) {
    const float seam = static_cast<float>(j) + 0.5f;
    float previous = exp2_polynomial<3>(std::nextafter(seam, -1000.0f));
    for (float x = seam; x < seam + 1e-4f; x = std::nextafter(x, 1000.0f)) {
      const float y = exp2_polynomial<3>(x);
      // Degree 3 is not exactly monotone at a seam (its two ends differ by up to 2 * 7.5e-5
      // relative), but never by more than its error bound.
      EXPECT_GE(y, previous * (1.0f - 2 * 7.6e-5f)) << x;
      previous = y;
    }
  }
}

TEST(Exp2Polynomial, IntegerPowersWithinTheErrorAtZero) {
  for (int j = -125; j <= 8; ++j) {
    const double exact = std::ldexp(1.0, j);
    EXPECT_NEAR(exp2_polynomial<3>(static_cast<float>(j)) / exact, 1.0, 7.6e-5) << j;
    EXPECT_NEAR(exp2_polynomial<4>(static_cast<float>(j)) / exact, 1.0, 2.8e-6) << j;
  }
}

}  // namespace
}  // namespace flashattn::cuda
