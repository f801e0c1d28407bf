// tests/cpu/test_hostile_input.cpp — the NaN rule of README.md and the float32 range,
// on every CPU algorithm (reference, flash2, flash1) and the KV-cache path:
//  * a NaN or Inf in a row's visible scores makes that row's output and LSE NaN;
//  * a NaN/Inf value at a visible key propagates into the row's output;
//  * keys a row cannot see (causal/window mask, cache positions past cache_seqlens)
//    never influence it, not even through 0 * NaN;
//  * values near FLT_MAX / seqlen_k give the finite exact answer, not Inf;
//  * the backward follows the same rule (NanRuleBackward): a NaN/Inf in q, k, v or dout
//    reaches exactly the gradients the visible entries connect it to, and every other
//    gradient equals the clean run's — a hidden entry adds nothing, not even 0 * NaN.
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

// --- the backward: q [1, Sq, 2, 32], k/v [1, Sk, 1, 32] float32, causal with a window of
// 16 keys to the left (several 64 x 128 tiles of the flash backward, diagonal tiles,
// skipped tiles, padding lanes and keys). Row i sees keys [i + Sk - Sq - 16, i + Sk - Sq].
struct BackwardProblem {
  static constexpr std::int64_t kHeads = 2, kDim = 32, kWindow = 16;
  std::int64_t rows_q, rows_k;
  HostTensor q, k, v, dout, mask;
  bool use_mask = false;  // a boolean attn_mask [1, 1, Sq, Sk] (all true unless a test hides entries)
  BackwardProblem(std::int64_t rows_q_, std::int64_t rows_k_)
      : rows_q(rows_q_), rows_k(rows_k_), q{DType::float32, {1, rows_q_, kHeads, kDim}}, k{DType::float32, {1, rows_k_, 1, kDim}},
        v{DType::float32, {1, rows_k_, 1, kDim}}, dout{DType::float32, {1, rows_q_, kHeads, kDim}}, mask{DType::boolean, {1, 1, rows_q_, rows_k_}} {
    q.fill_random(11), k.fill_random(12), v.fill_random(13), dout.fill_random(14);
    for (std::int64_t e = 0; e < mask.numel(); ++e) mask_byte(e) = 1;
  }
  std::uint8_t& mask_byte(std::int64_t e) { return static_cast<std::uint8_t*>(mask.data())[e]; }
  std::int64_t q_index(std::int64_t row, std::int64_t head, std::int64_t d) const { return (row * kHeads + head) * kDim + d; }
  std::int64_t kv_index(std::int64_t row, std::int64_t d) const { return row * kDim + d; }
  bool sees(std::int64_t row, std::int64_t key) const {
    const std::int64_t last = row + rows_k - rows_q;
    const bool masked_out = use_mask && static_cast<const std::uint8_t*>(mask.data())[row * rows_k + key] == 0;
    return key <= last && key >= last - kWindow && !masked_out;
  }

  struct Gradients {
    std::vector<double> dq, dk, dv;
    // Whether row `row` of a gradient ([rows, heads, kDim], head -1 = every head) is
    // all finite.
    static bool finite_row(const std::vector<double>& g, std::int64_t heads, std::int64_t row, std::int64_t head) {
      for (std::int64_t h = 0; h < heads; ++h)
        if (head < 0 || h == head)
          for (std::int64_t d = 0; d < kDim; ++d)
            if (!std::isfinite(g[static_cast<std::size_t>((row * heads + h) * kDim + d)])) return false;
      return true;
    }
  };
  Gradients run(Algorithm algorithm) {
    HostTensor out{DType::float32, {1, rows_q, kHeads, kDim}}, lse{DType::float32, {1, kHeads, rows_q}};
    HostTensor dq{DType::float32, q.shape()}, dk{DType::float32, k.shape()}, dv{DType::float32, v.shape()};
    flashattn::AttentionOptions options;
    options.causal = true;
    options.window_left = kWindow;
    options.algorithm = algorithm;
    if (use_mask) options.maybe_attn_mask = mask.view();
    flashattn::ForwardArgs f;
    f.q = q.view(), f.k = k.view(), f.v = v.view(), f.out = out.view(), f.maybe_lse = lse.view(), f.options = options;
    flashattn::forward(f);
    flashattn::BackwardArgs b;
    b.q = q.view(), b.k = k.view(), b.v = v.view(), b.out = out.view(), b.dout = dout.view(), b.lse = lse.view();
    b.dq = dq.view(), b.dk = dk.view(), b.dv = dv.view(), b.options = options;
    flashattn::backward(b);
    return {dq.to_double(), dk.to_double(), dv.to_double()};
  }
};

class NanRuleBackward : public ::testing::TestWithParam<Algorithm> {
 protected:
  // The rows of dq (per head) and of dk/dv that a hostile run must turn non-finite; every
  // other row must be finite and equal to the clean run's (up to float32 rounding:
  // tiles with hidden entries and non-finite inputs sum in another order).
  static void expect(const BackwardProblem::Gradients& got, const BackwardProblem::Gradients& clean, const std::vector<std::vector<char>>& bad_dq,
                     const std::vector<char>& bad_dk, const std::vector<char>& bad_dv) {
    using G = BackwardProblem::Gradients;
    const auto check = [](const std::vector<double>& g, const std::vector<double>& c, std::int64_t heads, std::int64_t row, std::int64_t head,
                          bool bad, const char* name) {
      if (bad) {
        EXPECT_FALSE(G::finite_row(g, heads, row, head)) << name << " row " << row << " head " << head << " must be non-finite";
        return;
      }
      for (std::int64_t h = 0; h < heads; ++h) {
        if (head >= 0 && h != head) continue;
        for (std::int64_t d = 0; d < BackwardProblem::kDim; ++d) {
          const auto at = static_cast<std::size_t>((row * heads + h) * BackwardProblem::kDim + d);
          ASSERT_NEAR(g[at], c[at], 1e-4 * (1.0 + std::abs(c[at]))) << name << " row " << row << " head " << h << " d " << d;
        }
      }
    };
    for (std::int64_t h = 0; h < BackwardProblem::kHeads; ++h)
      for (std::size_t row = 0; row < bad_dq[static_cast<std::size_t>(h)].size(); ++row)
        check(got.dq, clean.dq, BackwardProblem::kHeads, static_cast<std::int64_t>(row), h, bad_dq[static_cast<std::size_t>(h)][row], "dq");
    for (std::size_t row = 0; row < bad_dk.size(); ++row) check(got.dk, clean.dk, 1, static_cast<std::int64_t>(row), -1, bad_dk[row], "dk");
    for (std::size_t row = 0; row < bad_dv.size(); ++row) check(got.dv, clean.dv, 1, static_cast<std::int64_t>(row), -1, bad_dv[row], "dv");
  }
  // The rows that see key `key`, and the keys those rows see.
  static std::vector<char> rows_seeing(const BackwardProblem& p, std::int64_t key) {
    std::vector<char> rows(static_cast<std::size_t>(p.rows_q), 0);
    for (std::int64_t i = 0; i < p.rows_q; ++i) rows[static_cast<std::size_t>(i)] = p.sees(i, key);
    return rows;
  }
  static std::vector<char> keys_seen_by(const BackwardProblem& p, const std::vector<char>& rows) {
    std::vector<char> keys(static_cast<std::size_t>(p.rows_k), 0);
    for (std::int64_t i = 0; i < p.rows_q; ++i)
      for (std::int64_t j = 0; j < p.rows_k; ++j)
        if (rows[static_cast<std::size_t>(i)] && p.sees(i, j)) keys[static_cast<std::size_t>(j)] = 1;
    return keys;
  }
};

TEST_P(NanRuleBackward, NanOrInfValueReachesOnlyTheRowsThatSeeIt) {
  for (const float bad : {kNaN, kInf}) {
    BackwardProblem p(200, 200);
    const auto clean = p.run(GetParam());
    p.v.set(p.kv_index(150, 3), bad);  // key 150: rows 150..166 see it; rows 128..149 share its tile and do not
    const auto got = p.run(GetParam());
    const auto rows = rows_seeing(p, 150);
    // D = rowsum(dO ∘ O) is non-finite on those rows: dq there, dk of every key they see; dv never reads v.
    expect(got, clean, {rows, rows}, keys_seen_by(p, rows), std::vector<char>(200, 0));
  }
}

TEST_P(NanRuleBackward, NanKeyReachesOnlyTheRowsThatSeeIt) {
  // (An Inf key is a -Inf score, a visible weight 0, on some rows: which gradients turn
  // non-finite then depends on signs; the NaN key makes every row that sees it NaN.)
  for (const float bad : {kNaN}) {
    BackwardProblem p(200, 200);
    const auto clean = p.run(GetParam());
    p.k.set(p.kv_index(140, 0), bad);
    const auto got = p.run(GetParam());
    const auto rows = rows_seeing(p, 140);
    const auto keys = keys_seen_by(p, rows);
    expect(got, clean, {rows, rows}, keys, keys);
  }
}

TEST_P(NanRuleBackward, NanOrInfQueryReachesOnlyWhatItsRowSees) {
  for (const float bad : {kNaN, kInf}) {
    BackwardProblem p(200, 200);
    const auto clean = p.run(GetParam());
    p.q.set(p.q_index(70, 1, 5), bad);  // row 70 of head 1 only
    const auto got = p.run(GetParam());
    std::vector<char> row(200, 0), none(200, 0);
    row[70] = 1;
    const auto keys = keys_seen_by(p, row);
    expect(got, clean, {none, row}, keys, keys);
  }
}

TEST_P(NanRuleBackward, NanOrInfOutputGradientReachesOnlyWhatItsRowSees) {
  for (const float bad : {kNaN, kInf}) {
    BackwardProblem p(200, 200);
    const auto clean = p.run(GetParam());
    p.dout.set(p.q_index(130, 0, 7), bad);  // row 130 of head 0: in the key-128 tile's first lanes
    const auto got = p.run(GetParam());
    std::vector<char> row(200, 0), none(200, 0);
    row[130] = 1;
    const auto keys = keys_seen_by(p, row);
    expect(got, clean, {row, none}, keys, keys);
  }
}

TEST_P(NanRuleBackward, RowsThatSeeNoKeyContributeNothing) {
  // Sq 240 > Sk 200 with causal: rows 0..39 see no key (output 0, LSE -inf).
  BackwardProblem p(240, 200);
  const auto clean = p.run(GetParam());
  for (std::int64_t d = 0; d < BackwardProblem::kDim; ++d) {
    p.q.set(p.q_index(10, 0, d), kNaN);
    p.dout.set(p.q_index(20, 1, d), kInf);
  }
  const auto got = p.run(GetParam());
  expect(got, clean, {std::vector<char>(240, 0), std::vector<char>(240, 0)}, std::vector<char>(200, 0), std::vector<char>(200, 0));
  for (std::int64_t d = 0; d < BackwardProblem::kDim; ++d) EXPECT_EQ(got.dq[static_cast<std::size_t>((10 * 2 + 0) * 32 + d)], 0.0);
}

TEST_P(NanRuleBackward, KeysHiddenByAnAttnMaskContributeNothing) {
  // attn_mask hides key 100 from rows 100..108 (rows 109..116 still see it); a NaN value
  // there and a NaN dout on row 104 reach only what the visible entries connect.
  BackwardProblem p(200, 200);
  p.use_mask = true;
  for (std::int64_t i = 100; i <= 108; ++i) p.mask_byte(i * 200 + 100) = 0;
  const auto clean = p.run(GetParam());
  p.v.set(p.kv_index(100, 0), kNaN);
  for (std::int64_t d = 0; d < BackwardProblem::kDim; ++d) p.dout.set(p.q_index(104, 0, d), kNaN);
  const auto got = p.run(GetParam());
  auto rows = rows_seeing(p, 100);  // 109..116
  ASSERT_TRUE(rows[109] && rows[116] && !rows[108] && !rows[117]);
  rows[104] = 1;                    // dout's row (head 0 only)
  auto rows_head1 = rows_seeing(p, 100);
  const auto keys = keys_seen_by(p, rows);
  std::vector<char> dv_bad(200, 0);
  for (std::int64_t j = 0; j < 200; ++j) dv_bad[static_cast<std::size_t>(j)] = p.sees(104, j);  // P[104, j] * NaN dout
  EXPECT_FALSE(p.sees(104, 100));
  expect(got, clean, {rows, rows_head1}, keys, dv_bad);
}

INSTANTIATE_TEST_SUITE_P(Cpu, NanRuleBackward, ::testing::Values(Algorithm::automatic, Algorithm::reference),
                         [](const ::testing::TestParamInfo<Algorithm>& info) { return std::string(flashattn::algorithm_name(info.param)); });

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
