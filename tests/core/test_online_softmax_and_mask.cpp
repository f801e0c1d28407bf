// tests/core/test_online_softmax_and_mask.cpp — online-softmax state, merge and mask rule (hardware-free layer).
#include <gtest/gtest.h>

#include <cmath>

#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"

namespace os = flashattn::online_softmax;

// Seed 003's worked example: x = [1,3 | 2,4 | 3,2] processed block by block.
TEST(OnlineSoftmax, SeedWorkedExample) {
  const double blocks[3][2] = {{1, 3}, {2, 4}, {3, 2}};
  os::State<double> state;
  for (const auto& block : blocks) {
    // log2 domain: scores pre-multiplied by log2(e), as the kernels do.
    const double s0 = block[0] * os::kLog2e, s1 = block[1] * os::kLog2e;
    state.raise_max(std::max(s0, s1));
    state.add(std::exp2(s0 - state.base()) + std::exp2(s1 - state.base()));
  }
  EXPECT_NEAR(state.m / os::kLog2e, 4.0, 1e-12);
  const double expected_l = std::exp(-3.0) + std::exp(-1.0) + std::exp(-2.0) + 1.0 + std::exp(-1.0) + std::exp(-2.0);
  EXPECT_NEAR(state.l, expected_l, 1e-12);
  double direct = 0;
  for (const auto& block : blocks) direct += std::exp(block[0]) + std::exp(block[1]);
  EXPECT_NEAR(state.lse(), std::log(direct), 1e-12);
}

TEST(OnlineSoftmax, EmptyRowsNeverProduceNaN) {
  os::State<float> state;
  const float inf = os::negative_infinity<float>();
  EXPECT_EQ(state.raise_max(inf), 0.0f);
  state.add(std::exp2(inf - state.base()));
  EXPECT_TRUE(state.empty());
  EXPECT_EQ(state.inverse_sum(), 0.0f);
  EXPECT_EQ(state.lse(), inf);
  const auto w = os::merge_weights(inf, inf);
  EXPECT_EQ(w.weight_a, 0.0f);
  EXPECT_EQ(w.weight_b, 0.0f);
  EXPECT_EQ(w.lse, inf);
}

TEST(OnlineSoftmax, MergeIsAssociativeAndOrderIndependent) {
  const double lse[3] = {0.3, -1.7, 2.2};
  auto merged_lse = [](double a, double b) { return os::merge_weights(a, b).lse; };
  const double left = merged_lse(merged_lse(lse[0], lse[1]), lse[2]);
  const double right = merged_lse(lse[0], merged_lse(lse[1], lse[2]));
  const double swapped = merged_lse(lse[2], merged_lse(lse[1], lse[0]));
  const double direct = std::log(std::exp(lse[0]) + std::exp(lse[1]) + std::exp(lse[2]));
  EXPECT_NEAR(left, direct, 1e-12);
  EXPECT_NEAR(right, direct, 1e-12);
  EXPECT_NEAR(swapped, direct, 1e-12);
}

// A Math policy that counts its calls and rounds exp2 to float: State, merge and
// rescale_factor take every exponential (and log2, 1/l) from the policy they are given,
// as the kernels' State<float, SfuMath> does with the SFU.
struct CountingMath {
  static inline int exp2_calls = 0, log2_calls = 0, reciprocal_calls = 0;
  static double exp2(double x) { return ++exp2_calls, static_cast<float>(std::exp2(x)); }
  static double log2(double x) { return ++log2_calls, std::log2(x); }
  static double reciprocal(double x) { return ++reciprocal_calls, 1.0 / x; }
};

TEST(OnlineSoftmax, StateUsesItsMathPolicyAndScalesTheOutput) {
  os::State<double, CountingMath> state;
  EXPECT_EQ(state.raise_max(3.0), 0.0);  // from an empty row: exp2(-inf) through the policy
  state.add(state.term(3.0) + state.term(1.0));
  const double factor = state.raise_max(4.0);
  EXPECT_EQ(factor, static_cast<float>(std::exp2(-1.0)));
  EXPECT_EQ(CountingMath::exp2_calls, 4);
  const double l = (1.0 + static_cast<float>(std::exp2(-2.0))) * factor;
  EXPECT_DOUBLE_EQ(state.l, l);
  EXPECT_DOUBLE_EQ(state.inverse_sum(), 1.0 / l);
  EXPECT_DOUBLE_EQ(state.inverse_sum(0.25), 0.25 / l);  // an output scale (e.g. an FP8 V descale)
  EXPECT_DOUBLE_EQ(state.lse(), (4.0 + std::log2(l)) * os::kLn2);
  EXPECT_EQ(CountingMath::reciprocal_calls, 2);
  EXPECT_EQ(CountingMath::log2_calls, 1);
  double factor_a = 0, factor_b = 0;
  const os::State<double, CountingMath> merged = os::merge(state, os::State<double, CountingMath>{}, &factor_a, &factor_b);
  EXPECT_EQ(CountingMath::exp2_calls, 6);
  EXPECT_EQ(factor_b, 0.0);  // the empty side adds nothing
  EXPECT_DOUBLE_EQ(merged.l, state.l);
}

TEST(OnlineSoftmax, LseOfManyEqualsPairwiseMerges) {
  const double lse[4] = {0.3, -1.7, os::negative_infinity<double>(), 2.2};
  double pairwise = os::negative_infinity<double>();
  for (double x : lse) pairwise = os::merge_weights(pairwise, x).lse;
  EXPECT_NEAR(os::lse_of(lse), pairwise, 1e-12);
  const double empty[2] = {os::negative_infinity<double>(), os::negative_infinity<double>()};
  EXPECT_EQ(os::lse_of(empty), os::negative_infinity<double>());  // never NaN
}

TEST(MaskRule, CausalIsBottomRightAligned) {
  const flashattn::MaskRule rule{2, 5, -1, 0};  // seqlen_q 2, seqlen_k 5, causal
  EXPECT_EQ(rule.col_end(0), 4);
  EXPECT_EQ(rule.col_end(1), 5);
  const flashattn::MaskRule tall{5, 2, -1, 0};  // more queries than keys
  EXPECT_EQ(tall.col_end(0), 0);               // fully masked row
  EXPECT_EQ(tall.col_end(4), 2);
}

TEST(MaskRule, RowAndColumnRangesAgreeWithElementMask) {
  for (std::int64_t sq : {1, 7, 13}) for (std::int64_t sk : {1, 6, 15})
    for (std::int64_t left : {-1, 0, 3}) for (std::int64_t right : {-1, 0, 2}) {
      const flashattn::MaskRule rule{sq, sk, left, right};
      for (std::int64_t c0 = 0; c0 < sk; c0 += 4) {
        const std::int64_t c1 = std::min(sk, c0 + 4);
        const auto rows = rule.rows_of_columns(c0, c1);
        for (std::int64_t r = 0; r < sq; ++r) {
          bool any = false;
          for (std::int64_t c = c0; c < c1; ++c) any = any || rule.allowed(r, c);
          EXPECT_EQ(any, r >= rows.begin && r < rows.end) << sq << " " << sk << " " << left << " " << right << " r" << r;
        }
      }
      for (std::int64_t r0 = 0; r0 < sq; r0 += 3) {
        const std::int64_t r1 = std::min(sq, r0 + 3);
        const auto cols = rule.columns_of_rows(r0, r1);
        const auto common = rule.columns_of_all_rows(r0, r1);
        for (std::int64_t c = 0; c < sk; ++c) {
          bool any = false, all = true;
          for (std::int64_t r = r0; r < r1; ++r) any = any || rule.allowed(r, c), all = all && rule.allowed(r, c);
          EXPECT_EQ(any, c >= cols.begin && c < cols.end);
          EXPECT_EQ(all, c >= common.begin && c < common.end) << sq << " " << sk << " " << left << " " << right << " c" << c;
        }
      }
    }
}
