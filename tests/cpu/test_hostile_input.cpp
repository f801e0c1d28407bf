// tests/cpu/test_hostile_input.cpp — the NaN rule of README.md and the float32 range,
// on every CPU algorithm (reference, flash2, flash1) and the KV-cache path:
//  * a NaN or Inf in a row's visible scores makes that row's output and LSE NaN;
//  * a NaN/Inf value at a visible key propagates into the row's output;
//  * keys a row cannot see (causal/window mask, cache positions past cache_seqlens)
//    never influence it, not even through 0 * NaN;
//  * values near FLT_MAX / seqlen_k give the finite exact answer, not Inf.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "tests/support/host_tensor.hpp"

namespace {

using flashattn::Algorithm;
using flashattn::DType;
using flashattn::testing::HostTensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// q [1, 64, 2, 32], k/v [1, 64, 1, 32] float32 (GQA 2:1): one head of rows per kv head.
struct Problem {
  static constexpr std::int64_t kRows = 64, kHeads = 2, kDim = 32;
  HostTensor q{DType::float32, {1, kRows, kHeads, kDim}};
  HostTensor k{DType::float32, {1, kRows, 1, kDim}};
  HostTensor v{DType::float32, {1, kRows, 1, kDim}};
  Problem() {
    q.fill_random(1);
    k.fill_random(2);
    v.fill_random(3);
  }
  std::int64_t q_index(std::int64_t row, std::int64_t head, std::int64_t d) const { return (row * kHeads + head) * kDim + d; }
  std::int64_t kv_index(std::int64_t row, std::int64_t d) const { return row * kDim + d; }

  struct Result {
    std::vector<double> out, lse;
    double out_at(std::int64_t row, std::int64_t head, std::int64_t d) const {
      return out[static_cast<std::size_t>((row * kHeads + head) * kDim + d)];
    }
    double lse_at(std::int64_t row, std::int64_t head) const { return lse[static_cast<std::size_t>(head * kRows + row)]; }
  };
  Result run(Algorithm algorithm, bool causal, std::int64_t window_left = -1) {
    HostTensor out{DType::float32, {1, kRows, kHeads, kDim}}, lse{DType::float32, {1, kHeads, kRows}};
    flashattn::ForwardArgs args;
    args.q = q.view(), args.k = k.view(), args.v = v.view(), args.out = out.view(), args.maybe_lse = lse.view();
    args.options.causal = causal;
    args.options.window_left = window_left;
    args.options.algorithm = algorithm;
    flashattn::forward(args);
    return {out.to_double(), lse.to_double()};
  }
};

class NanRule : public ::testing::TestWithParam<Algorithm> {};

bool row_is_nan(const Problem::Result& r, std::int64_t row, std::int64_t head) {
  if (!std::isnan(r.lse_at(row, head))) return false;
  for (std::int64_t d = 0; d < Problem::kDim; ++d)
    if (!std::isnan(r.out_at(row, head, d))) return false;
  return true;
}
// Rows [begin, end) of both heads agree with the clean run to float32 rounding.
void expect_rows_match(const Problem::Result& got, const Problem::Result& clean, std::int64_t begin, std::int64_t end) {
  for (std::int64_t row = begin; row < end; ++row)
    for (std::int64_t h = 0; h < Problem::kHeads; ++h) {
      EXPECT_NEAR(got.lse_at(row, h), clean.lse_at(row, h), 1e-5) << "row " << row << " head " << h;
      for (std::int64_t d = 0; d < Problem::kDim; ++d)
        ASSERT_NEAR(got.out_at(row, h, d), clean.out_at(row, h, d), 1e-5) << "row " << row << " head " << h << " d " << d;
    }
}

TEST_P(NanRule, HiddenNanAndInfValuesNeverLeak) {
  Problem p;
  const auto clean = p.run(GetParam(), true);
  p.v.set(p.kv_index(40, 3), kNaN);  // causal: rows < 40 cannot see key 40
  p.v.set(p.kv_index(41, 5), kInf);
  const auto r = p.run(GetParam(), true);
  expect_rows_match(r, clean, 0, 40);
  EXPECT_TRUE(std::isnan(r.out_at(40, 0, 3)));     // visible: propagates
  EXPECT_TRUE(std::isfinite(r.out_at(40, 0, 5)));  // key 41 still hidden from row 40
  EXPECT_TRUE(std::isnan(r.out_at(50, 1, 3)));
  EXPECT_TRUE(std::isinf(r.out_at(50, 1, 5)) || std::isnan(r.out_at(50, 1, 5)));
  EXPECT_TRUE(std::isfinite(r.lse_at(50, 1)));  // values never touch the LSE
}

TEST_P(NanRule, HiddenNanValueOfASlidingWindowNeverLeaks) {
  Problem p;
  const auto clean = p.run(GetParam(), false, 8);
  p.v.set(p.kv_index(5, 0), kNaN);  // window (8, -1): rows >= 14 no longer see key 5
  const auto r = p.run(GetParam(), false, 8);
  expect_rows_match(r, clean, 14, Problem::kRows);
  EXPECT_TRUE(std::isnan(r.out_at(13, 0, 0)));
  EXPECT_TRUE(std::isnan(r.out_at(0, 1, 0)));
}

TEST_P(NanRule, HiddenNanKeyNeverLeaks) {
  Problem p;
  const auto clean = p.run(GetParam(), true);
  p.k.set(p.kv_index(20, 7), kNaN);
  const auto r = p.run(GetParam(), true);
  expect_rows_match(r, clean, 0, 20);
  for (std::int64_t row = 20; row < Problem::kRows; ++row) EXPECT_TRUE(row_is_nan(r, row, 0)) << "row " << row;
}

TEST_P(NanRule, NanOrInfQueryMakesItsRowNan) {
  Problem p;
  const auto clean = p.run(GetParam(), false);
  for (std::int64_t d = 0; d < Problem::kDim; ++d) p.q.set(p.q_index(10, 0, d), kNaN);  // a whole NaN row
  p.q.set(p.q_index(12, 1, 0), kInf);                                                  // one +Inf element
  const auto r = p.run(GetParam(), false);
  EXPECT_TRUE(row_is_nan(r, 10, 0));
  EXPECT_TRUE(row_is_nan(r, 12, 1));
  expect_rows_match(r, clean, 0, 10);
  expect_rows_match(r, clean, 13, Problem::kRows);
}

TEST_P(NanRule, ValuesNearTheFloatMaximumDoNotOverflow) {
  Problem p;
  for (std::int64_t i = 0; i < p.v.numel(); ++i) p.v.set(i, 1e38f);  // 64 keys * 1e38 > FLT_MAX
  for (bool causal : {false, true}) {
    const auto r = p.run(GetParam(), causal);
    for (std::int64_t row = 0; row < Problem::kRows; ++row)
      for (std::int64_t d = 0; d < Problem::kDim; ++d) ASSERT_NEAR(r.out_at(row, 1, d), 1e38, 1e33) << "row " << row;
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, NanRule, ::testing::Values(Algorithm::automatic, Algorithm::reference, Algorithm::flash1),
                         [](const auto& info) { return std::string(flashattn::algorithm_name(info.param)); });

// KV cache: q [1, 4, 2, 32], cache [1, 64, 1, 32] float32, 40 cached keys, causal.
struct Cache {
  HostTensor q{DType::float32, {1, 4, 2, 32}};
  HostTensor k_cache{DType::float32, {1, 64, 1, 32}};
  HostTensor v_cache{DType::float32, {1, 64, 1, 32}};
  HostTensor out{DType::float32, {1, 4, 2, 32}}, lse{DType::float32, {1, 2, 4}};
  Cache() {
    q.fill_random(4);
    k_cache.fill_random(5);
    v_cache.fill_random(6);
  }
  std::vector<double> run(int num_splits) {
    flashattn::KVCacheArgs args;
    args.q = q.view(), args.k_cache = k_cache.view(), args.v_cache = v_cache.view();
    args.out = out.view(), args.maybe_lse = lse.view();
    args.maybe_uniform_cache_seqlen = 40;
    args.options.causal = true;
    args.num_splits = num_splits;
    flashattn::forward_with_kvcache(args);
    return out.to_double();
  }
};

TEST(NanRuleKVCache, PositionsPastTheLengthAndHiddenKeysNeverLeak) {
  for (int splits : {1, 3}) {
    SCOPED_TRACE(splits);
    Cache c;
    const auto clean = c.run(splits);
    for (std::int64_t position = 40; position < 64; ++position) {  // past cache_seqlens
      c.v_cache.set(position * 32, kNaN);
      c.k_cache.set(position * 32 + 1, kInf);
    }
    c.v_cache.set(39 * 32 + 2, kNaN);  // causal: only query row 3 (at key 39) sees key 39
    const auto r = c.run(splits);
    for (std::int64_t row = 0; row < 3; ++row)
      for (std::int64_t e = 0; e < 2 * 32; ++e) ASSERT_NEAR(r[static_cast<std::size_t>(row * 64 + e)], clean[static_cast<std::size_t>(row * 64 + e)], 1e-5);
    EXPECT_TRUE(std::isnan(r[3 * 64 + 2]));
  }
}

TEST(NanRuleKVCache, NanQueryRowIsNanWithNanLse) {
  Cache c;
  for (std::int64_t d = 0; d < 32; ++d) c.q.set(d, kNaN);  // row 0, head 0
  c.run(2);
  EXPECT_TRUE(std::isnan(c.lse.get(0)));
  EXPECT_TRUE(std::isnan(c.out.get(0)));
  EXPECT_TRUE(std::isfinite(c.lse.get(1)));
}

TEST(NanRuleKVCache, ValuesNearTheFloatMaximumDoNotOverflow) {
  Cache c;
  for (std::int64_t i = 0; i < c.v_cache.numel(); ++i) c.v_cache.set(i, 1e38f);
  const auto r = c.run(1);
  for (double x : r) ASSERT_NEAR(x, 1e38, 1e33);
}

}  // namespace
