// tests/cpu/test_flash_forward.cpp — the FA2 and FA1 forward paths against the
// float64 reference (STYLE.md tolerance rule), their properties and edge cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tests/cpu/attention_problem.hpp"

namespace flashattn::testing {
namespace {


// Awkward shapes on purpose: tails of every tile size, seqlen_q != seqlen_k both ways
// (causal then has fully masked rows), head dims off the vector width, GQA/MQA.
std::vector<ProblemShape> shapes_for(DType t) {
  return {
      make(t, 2, 113, 113, 2, 2, 64),
      make(t, 1, 1, 1, 2, 2, 32),
      make(t, 2, 1, 17, 2, 1, 64),
      make(t, 1, 17, 1, 1, 1, 64),
      causal(make(t, 1, 113, 40, 2, 2, 64)),
      causal(make(t, 1, 40, 203, 2, 2, 64)),
      make(t, 1, 33, 70, 1, 1, 40),
      causal(make(t, 1, 33, 70, 1, 1, 72)),
      make(t, 1, 65, 129, 1, 1, 128),
      causal(make(t, 1, 20, 65, 1, 1, 256)),
      make(t, 1, 30, 97, 8, 1, 32),
      causal(make(t, 2, 64, 64, 4, 1, 16)),
      window(make(t, 1, 127, 129, 2, 2, 32), 16, 0),
      window(make(t, 1, 100, 80, 2, 2, 32), 8, 8),
      window(make(t, 1, 90, 90, 1, 1, 32), -1, 5),
      window(make(t, 1, 90, 150, 1, 1, 32), 20, -1),
      softcap(make(t, 1, 70, 90, 2, 1, 32), 5.0),
      softcap(causal(make(t, 1, 70, 90, 2, 2, 32)), 2.0),
      varlen(make(t, 0, 0, 0, 2, 1, 32), {5, 0, 1, 70}, {9, 3, 0, 64}),
      causal(varlen(make(t, 0, 0, 0, 2, 2, 32), {65, 1, 30}, {70, 1, 12})),
  };
}

struct ForwardCase {
  Algorithm algorithm;
  ProblemShape shape;
  int threads = 0;  // 0 = all; 1 makes the flash2 tiling put several query tiles in one item
};

std::vector<ForwardCase> forward_cases() {
  std::vector<ForwardCase> cases;
  for (Algorithm algorithm : {Algorithm::flash2, Algorithm::flash1})
    for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
      for (const auto& shape : shapes_for(dtype)) cases.push_back({algorithm, shape});
  // One long sequence (both paths, float32 only: the reference is O(N^2) in float64).
  cases.push_back({Algorithm::flash2, causal(make(DType::float32, 1, 1023, 1023, 1, 1, 64))});
  cases.push_back({Algorithm::flash2, make(DType::bfloat16, 1, 1023, 1023, 1, 1, 64)});
  cases.push_back({Algorithm::flash1, make(DType::float32, 1, 1023, 1023, 1, 1, 64)});
  // Enough query rows per thread for the largest tiles (256 rows, several per item).
  cases.push_back({Algorithm::flash2, causal(make(DType::float32, 1, 600, 300, 4, 2, 64)), 1});
  cases.push_back({Algorithm::flash2, causal(make(DType::float32, 1, 700, 900, 2, 1, 64)), 1});
  cases.push_back({Algorithm::flash2, make(DType::float16, 1, 520, 700, 4, 4, 32), 1});
  cases.push_back({Algorithm::flash2, window(make(DType::bfloat16, 1, 900, 900, 2, 2, 32), 100, 50), 1});
  return cases;
}

void PrintTo(const ForwardCase& c, std::ostream* os) {
  *os << algorithm_name(c.algorithm) << " " << c.shape.describe() << " threads " << c.threads;
}

class FlashForwardVsReference : public ::testing::TestWithParam<ForwardCase> {};

TEST_P(FlashForwardVsReference, WithinPrecisionRelativeTolerance) {
  const ForwardCase& c = GetParam();
  AttentionProblem problem(c.shape, 3);
  problem.run_forward(c.algorithm, c.threads);
  expect_forward_matches_reference(problem, std::string(algorithm_name(c.algorithm)) + " " + c.shape.describe());
}

INSTANTIATE_TEST_SUITE_P(Sweep, FlashForwardVsReference, ::testing::ValuesIn(forward_cases()));

TEST(FlashForward, ReferenceAlgorithmWritesRoundedReference) {
  AttentionProblem problem(causal(make(DType::bfloat16, 2, 37, 41, 2, 1, 24)));
  problem.run_forward(Algorithm::reference);
  const cpu::ReferenceResult ref = cpu::reference_forward(problem.forward_params());
  const cpu::ReferenceResult got = gather_output(problem);
  for (std::size_t e = 0; e < ref.out.size(); ++e)
    ASSERT_EQ(got.out[e], static_cast<double>(numeric::round_to(DType::bfloat16, static_cast<float>(ref.out[e]))));
  for (std::size_t e = 0; e < ref.lse.size(); ++e) ASSERT_EQ(got.lse[e], static_cast<double>(static_cast<float>(ref.lse[e])));
}

// Scores of several hundred (in log2 units) across a row: the running max must keep
// every exponent <= 0, and rows dominated by one key stay exact.
TEST(FlashForward, LargeLogitsStayFinite) {
  for (Algorithm algorithm : {Algorithm::flash2, Algorithm::flash1}) {
    AttentionProblem problem(causal(make(DType::float32, 1, 150, 300, 2, 1, 32)), 61);
    for (std::int64_t e = 0; e < problem.q.numel(); ++e) problem.q.set(e, 12.0f * problem.q.get(e));
    for (std::int64_t e = 0; e < problem.k.numel(); ++e) problem.k.set(e, 12.0f * problem.k.get(e));
    problem.run_forward(algorithm);
    for (std::int64_t e = 0; e < problem.out.numel(); ++e) ASSERT_TRUE(std::isfinite(problem.out.get(e))) << algorithm_name(algorithm);
    expect_forward_matches_reference(problem, std::string(algorithm_name(algorithm)) + " large logits");
  }
}

// Permuting the K/V rows together permutes the terms of each row's sums only.
TEST(FlashForward, KeyValuePermutationInvariance) {
  const ProblemShape shape = make(DType::float32, 1, 50, 77, 2, 1, 32);
  AttentionProblem original(shape, 5), permuted(shape, 5);
  const std::int64_t row_elems = shape.heads_kv * shape.head_dim;
  for (std::int64_t j = 0; j < shape.seqlen_k; ++j) {
    const std::int64_t from = (j * 31 + 7) % shape.seqlen_k;  // 31 is coprime with 77: a permutation
    for (std::int64_t e = 0; e < row_elems; ++e) {
      permuted.k.set(j * row_elems + e, original.k.get(from * row_elems + e));
      permuted.v.set(j * row_elems + e, original.v.get(from * row_elems + e));
    }
  }
  for (Algorithm algorithm : {Algorithm::flash2, Algorithm::flash1}) {
    original.run_forward(algorithm);
    permuted.run_forward(algorithm);
    const auto a = original.out.to_double(), b = permuted.out.to_double();
    EXPECT_LE(max_abs_difference(a, b), 2e-6) << algorithm_name(algorithm);
    EXPECT_LE(max_abs_difference(original.lse.to_double(), permuted.lse.to_double()), 2e-6) << algorithm_name(algorithm);
  }
}

// A batch item's output does not depend on the other items, bit for bit.
TEST(FlashForward, BatchItemsAreIndependentBitwise) {
  for (Algorithm algorithm : {Algorithm::flash2, Algorithm::flash1}) {
    const ProblemShape shape = causal(make(DType::float16, 3, 70, 90, 2, 1, 40));
    AttentionProblem batch(shape, 9);
    ProblemShape single_shape = shape;
    single_shape.batch = 1;
    AttentionProblem single(single_shape, 10);
    const auto copy_item = [](const HostTensor& from, HostTensor& to, std::int64_t item) {
      const std::size_t bytes = static_cast<std::size_t>(to.numel()) * dtype_size(to.dtype());
      std::memcpy(to.data(), static_cast<const char*>(from.data()) + static_cast<std::size_t>(item) * bytes, bytes);
    };
    copy_item(batch.q, single.q, 1), copy_item(batch.k, single.k, 1), copy_item(batch.v, single.v, 1);
    batch.run_forward(algorithm);
    single.run_forward(algorithm);
    HostTensor item_out(single.out.dtype(), single.out.shape()), item_lse(single.lse.dtype(), single.lse.shape());
    copy_item(batch.out, item_out, 1), copy_item(batch.lse, item_lse, 1);
    EXPECT_EQ(0, std::memcmp(item_out.data(), single.out.data(), static_cast<std::size_t>(single.out.numel()) * 2)) << algorithm_name(algorithm);
    EXPECT_EQ(0, std::memcmp(item_lse.data(), single.lse.data(), static_cast<std::size_t>(single.lse.numel()) * 4)) << algorithm_name(algorithm);
  }
}

// Attention over [K1; K2] equals merge_attention_states of the attentions over K1 and K2.
TEST(FlashForward, SplitKeysMergeToTheWhole) {
  const ProblemShape whole_shape = make(DType::float32, 2, 45, 100, 2, 2, 32);
  AttentionProblem whole(whole_shape, 12);
  ProblemShape half_shape = whole_shape;
  half_shape.seqlen_k = 50;
  AttentionProblem first(half_shape, 13), second(half_shape, 14);
  const std::int64_t row_elems = whole_shape.heads_kv * whole_shape.head_dim;
  for (std::int64_t b = 0; b < whole_shape.batch; ++b)
    for (std::int64_t j = 0; j < whole_shape.seqlen_k; ++j)
      for (std::int64_t e = 0; e < row_elems; ++e) {
        AttentionProblem& half = j < 50 ? first : second;
        const std::int64_t from = (b * whole_shape.seqlen_k + j) * row_elems + e;
        const std::int64_t to = (b * 50 + j % 50) * row_elems + e;
        half.k.set(to, whole.k.get(from));
        half.v.set(to, whole.v.get(from));
      }
  std::memcpy(first.q.data(), whole.q.data(), static_cast<std::size_t>(whole.q.numel()) * 4);
  std::memcpy(second.q.data(), whole.q.data(), static_cast<std::size_t>(whole.q.numel()) * 4);
  whole.run_forward(Algorithm::flash2);
  first.run_forward(Algorithm::flash2);
  second.run_forward(Algorithm::flash2);
  HostTensor merged(DType::float32, whole.out.shape()), merged_lse(DType::float32, whole.lse.shape());
  merge_attention_states(first.out.view(), first.lse.view(), second.out.view(), second.lse.view(), merged.view(), merged_lse.view());
  EXPECT_LE(max_abs_difference(merged.to_double(), whole.out.to_double()), 2e-6);
  EXPECT_LE(max_abs_difference(merged_lse.to_double(), whole.lse.to_double()), 2e-6);
}

// Equal-length varlen packing is the padded layout itself: bitwise equal results.
// Unequal lengths: each packed sequence equals the same sequence run alone.
TEST(FlashForward, VarlenEqualsPadded) {
  for (Algorithm algorithm : {Algorithm::flash2, Algorithm::flash1}) {
    AttentionProblem padded(causal(make(DType::float32, 3, 40, 52, 2, 1, 32)), 21);
    AttentionProblem packed(causal(varlen(make(DType::float32, 0, 0, 0, 2, 1, 32), {40, 40, 40}, {52, 52, 52})), 21);
    std::memcpy(packed.q.data(), padded.q.data(), static_cast<std::size_t>(padded.q.numel()) * 4);
    std::memcpy(packed.k.data(), padded.k.data(), static_cast<std::size_t>(padded.k.numel()) * 4);
    std::memcpy(packed.v.data(), padded.v.data(), static_cast<std::size_t>(padded.v.numel()) * 4);
    padded.run_forward(algorithm);
    packed.run_forward(algorithm);
    EXPECT_EQ(0, std::memcmp(padded.out.data(), packed.out.data(), static_cast<std::size_t>(padded.out.numel()) * 4));
    // LSE layouts differ: [batch, heads, seqlen] vs [heads, total_q].
    for (std::int64_t b = 0; b < 3; ++b)
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t i = 0; i < 40; ++i) ASSERT_EQ(padded.lse.get((b * 2 + h) * 40 + i), packed.lse.get(h * 120 + b * 40 + i));
  }
  const std::vector<std::int32_t> lengths_q{5, 0, 1, 70}, lengths_k{9, 3, 0, 64};
  AttentionProblem packed(varlen(make(DType::bfloat16, 0, 0, 0, 2, 2, 32), lengths_q, lengths_k), 22);
  packed.run_forward(Algorithm::flash2);
  std::int64_t q_row = 0, k_row = 0;
  for (std::size_t b = 0; b < lengths_q.size(); ++b) {
    AttentionProblem alone(make(DType::bfloat16, 1, lengths_q[b], lengths_k[b], 2, 2, 32), 23);
    const std::size_t q_bytes = static_cast<std::size_t>(lengths_q[b]) * 2 * 32 * 2, k_bytes = static_cast<std::size_t>(lengths_k[b]) * 2 * 32 * 2;
    std::memcpy(alone.q.data(), static_cast<char*>(packed.q.data()) + q_row * 2 * 32 * 2, q_bytes);
    std::memcpy(alone.k.data(), static_cast<char*>(packed.k.data()) + k_row * 2 * 32 * 2, k_bytes);
    std::memcpy(alone.v.data(), static_cast<char*>(packed.v.data()) + k_row * 2 * 32 * 2, k_bytes);
    alone.run_forward(Algorithm::flash2);
    EXPECT_EQ(0, std::memcmp(alone.out.data(), static_cast<char*>(packed.out.data()) + q_row * 2 * 32 * 2, q_bytes)) << "sequence " << b;
    q_row += lengths_q[b], k_row += lengths_k[b];
  }
}

// GQA reads kv head h / group_size: the same as MHA with each KV head repeated.
TEST(FlashForward, GqaEqualsMhaWithRepeatedKvHeads) {
  AttentionProblem gqa(causal(make(DType::float32, 2, 33, 47, 6, 2, 32)), 31);
  AttentionProblem mha(causal(make(DType::float32, 2, 33, 47, 6, 6, 32)), 32);
  std::memcpy(mha.q.data(), gqa.q.data(), static_cast<std::size_t>(gqa.q.numel()) * 4);
  for (std::int64_t row = 0; row < 2 * 47; ++row)
    for (std::int64_t h = 0; h < 6; ++h)
      for (std::int64_t d = 0; d < 32; ++d) {
        mha.k.set((row * 6 + h) * 32 + d, gqa.k.get((row * 2 + h / 3) * 32 + d));
        mha.v.set((row * 6 + h) * 32 + d, gqa.v.get((row * 2 + h / 3) * 32 + d));
      }
  for (Algorithm algorithm : {Algorithm::flash2, Algorithm::flash1}) {
    gqa.run_forward(algorithm);
    mha.run_forward(algorithm);
    EXPECT_EQ(0, std::memcmp(gqa.out.data(), mha.out.data(), static_cast<std::size_t>(gqa.out.numel()) * 4)) << algorithm_name(algorithm);
  }
}

// q, k, v as slices of one packed qkv tensor [batch, seqlen, 3, heads, head_dim].
TEST(FlashForward, NonContiguousPackedQkv) {
  const std::int64_t batch = 2, seqlen = 75, heads = 2, head_dim = 40;
  HostTensor qkv(DType::float16, {batch, seqlen, 3, heads, head_dim});
  qkv.fill_random(41);
  AttentionProblem dense(causal(make(DType::float16, batch, seqlen, seqlen, heads, heads, head_dim)), 42);
  AttentionProblem strided(causal(make(DType::float16, batch, seqlen, seqlen, heads, heads, head_dim)), 43);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t s = 0; s < seqlen; ++s)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t d = 0; d < head_dim; ++d) {
          const std::int64_t dense_index = ((b * seqlen + s) * heads + h) * head_dim + d;
          const auto packed_index = [&](std::int64_t which) { return (((b * seqlen + s) * 3 + which) * heads + h) * head_dim + d; };
          dense.q.set(dense_index, qkv.get(packed_index(0)));
          dense.k.set(dense_index, qkv.get(packed_index(1)));
          dense.v.set(dense_index, qkv.get(packed_index(2)));
        }
  const auto slice = [&](std::int64_t which) {
    return TensorView::strided(static_cast<std::uint16_t*>(qkv.data()) + which * heads * head_dim, DType::float16,
                               {batch, seqlen, heads, head_dim}, {seqlen * 3 * heads * head_dim, 3 * heads * head_dim, head_dim, 1});
  };
  strided.q_view = slice(0), strided.k_view = slice(1), strided.v_view = slice(2);
  for (Algorithm algorithm : {Algorithm::flash2, Algorithm::flash1, Algorithm::reference}) {
    dense.run_forward(algorithm);
    strided.run_forward(algorithm);
    EXPECT_EQ(0, std::memcmp(dense.out.data(), strided.out.data(), static_cast<std::size_t>(dense.out.numel()) * 2)) << algorithm_name(algorithm);
  }
}

// The thread count changes the tiling (tiles per item, tile width); each row's
// arithmetic must stay the same.
TEST(FlashForward, ThreadCountDoesNotChangeResultsBitwise) {
  AttentionProblem one(causal(make(DType::float32, 2, 700, 650, 3, 1, 64)), 51), two(causal(make(DType::float32, 2, 700, 650, 3, 1, 64)), 51);
  one.run_forward(Algorithm::flash2, 1);
  two.run_forward(Algorithm::flash2, 2);
  EXPECT_EQ(0, std::memcmp(one.out.data(), two.out.data(), static_cast<std::size_t>(one.out.numel()) * 4));
}

// Defined edge behaviour: empty problems write nothing; rows that see no key give
// output 0 and LSE -inf, never NaN.
TEST(FlashForward, EmptyAndFullyMaskedRows) {
  for (Algorithm algorithm : {Algorithm::flash2, Algorithm::flash1, Algorithm::reference}) {
    for (const ProblemShape& shape : {make(DType::float32, 0, 8, 8, 2, 2, 16), make(DType::float32, 2, 0, 8, 2, 2, 16)}) {
      AttentionProblem problem(shape);
      EXPECT_NO_THROW(problem.run_forward(algorithm)) << algorithm_name(algorithm);
    }
    AttentionProblem no_keys(make(DType::float16, 2, 9, 0, 2, 1, 16));
    no_keys.run_forward(algorithm);
    for (std::int64_t e = 0; e < no_keys.out.numel(); ++e) ASSERT_EQ(no_keys.out.get(e), 0.0f) << algorithm_name(algorithm);
    for (std::int64_t e = 0; e < no_keys.lse.numel(); ++e) ASSERT_EQ(no_keys.lse.get(e), -std::numeric_limits<float>::infinity());
    // causal with seqlen_q = 70 > seqlen_k = 20: rows 0..49 see nothing.
    AttentionProblem masked(causal(make(DType::float32, 1, 70, 20, 1, 1, 16)));
    masked.run_forward(algorithm);
    for (std::int64_t i = 0; i < 70; ++i) {
      const float lse = masked.lse.get(i);
      if (i < 50) {
        ASSERT_EQ(lse, -std::numeric_limits<float>::infinity()) << algorithm_name(algorithm) << " row " << i;
        for (std::int64_t d = 0; d < 16; ++d) ASSERT_EQ(masked.out.get(i * 16 + d), 0.0f);
      } else {
        ASSERT_TRUE(std::isfinite(lse)) << algorithm_name(algorithm) << " row " << i;
      }
    }
  }
}

}  // namespace
}  // namespace flashattn::testing
