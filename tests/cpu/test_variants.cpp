// tests/cpu/test_variants.cpp — ALiBi and dropout on every CPU path: the flash forward
// (flash2, flash1), the flash backward and the KV-cache path against the float64
// reference (STYLE.md's 2x/3x rule), plus dropout's replay properties.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/cpu/attention_problem.hpp"

namespace flashattn::testing {
namespace {

std::vector<ProblemShape> variant_shapes() {
  std::vector<ProblemShape> shapes;
  for (DType t : {DType::float32, DType::bfloat16}) {
    shapes.push_back(alibi(make(t, 2, 113, 113, 2, 2, 64)));
    shapes.push_back(alibi(causal(make(t, 1, 40, 203, 4, 2, 40)), 2));
    shapes.push_back(alibi(causal(make(t, 1, 113, 40, 2, 1, 32))));
    shapes.push_back(alibi(window(make(t, 1, 127, 129, 2, 2, 32), 16, 4)));
    shapes.push_back(alibi(softcap(make(t, 1, 70, 90, 2, 1, 32), 5.0), 2));
    shapes.push_back(alibi(varlen(make(t, 0, 0, 0, 2, 1, 32), {5, 0, 1, 70}, {9, 3, 0, 64}), 2));
    shapes.push_back(dropout(make(t, 2, 113, 113, 2, 2, 64), 0.1));
    shapes.push_back(dropout(causal(make(t, 1, 40, 203, 4, 2, 40)), 0.5));
    shapes.push_back(dropout(window(make(t, 1, 127, 129, 2, 2, 32), 16, 4), 0.3));
    shapes.push_back(dropout(softcap(make(t, 1, 70, 90, 2, 1, 32), 5.0), 0.2));
    shapes.push_back(dropout(varlen(make(t, 0, 0, 0, 2, 1, 32), {5, 0, 1, 70}, {9, 3, 0, 64}), 0.25));
    shapes.push_back(dropout(alibi(causal(make(t, 1, 97, 97, 2, 1, 64)), 2), 0.15, 99, 12345678901ULL));
  }
  return shapes;
}

class VariantsVsReference : public ::testing::TestWithParam<ProblemShape> {};

TEST_P(VariantsVsReference, Flash2Forward) {
  AttentionProblem problem(GetParam());
  problem.run_forward(Algorithm::flash2);
  expect_forward_matches_reference(problem, "flash2 " + GetParam().describe());
}

TEST_P(VariantsVsReference, Flash1Forward) {
  AttentionProblem problem(GetParam());
  problem.run_forward(Algorithm::flash1);
  expect_forward_matches_reference(problem, "flash1 " + GetParam().describe());
}

TEST_P(VariantsVsReference, Backward) {
  AttentionProblem problem(GetParam());
  problem.run_forward(Algorithm::flash2);
  problem.run_backward();
  expect_backward_matches_reference(problem, GetParam().describe());
}

INSTANTIATE_TEST_SUITE_P(AlibiAndDropout, VariantsVsReference, ::testing::ValuesIn(variant_shapes()));

std::vector<std::uint8_t> bytes_of(const HostTensor& t) {
  const auto* p = static_cast<const std::uint8_t*>(t.data());
  return std::vector<std::uint8_t>(p, p + t.numel() * static_cast<std::int64_t>(dtype_size(t.dtype())));
}

// Same (seed, offset): bitwise-identical outputs and gradients, whatever the thread
// count; another offset: another mask.
TEST(Dropout, ReplaysBitwiseAndDependsOnOffset) {
  const ProblemShape shape = dropout(causal(make(DType::float32, 2, 150, 150, 2, 1, 32)), 0.3, 7, 11);
  AttentionProblem a(shape), b(shape);
  a.run_forward(Algorithm::flash2, 1);
  a.run_backward(1);
  b.run_forward(Algorithm::flash2, 2);
  b.run_backward(2);
  EXPECT_EQ(bytes_of(a.out), bytes_of(b.out));
  EXPECT_EQ(bytes_of(a.dq), bytes_of(b.dq));
  EXPECT_EQ(bytes_of(a.dk), bytes_of(b.dk));
  EXPECT_EQ(bytes_of(a.dv), bytes_of(b.dv));

  AttentionProblem c(dropout(causal(make(DType::float32, 2, 150, 150, 2, 1, 32)), 0.3, 7, 12));
  c.run_forward(Algorithm::flash2);
  EXPECT_NE(bytes_of(a.out), bytes_of(c.out));
  // The LSE is that of the undropped softmax: identical.
  EXPECT_EQ(bytes_of(a.lse), bytes_of(c.lse));
}

// A varlen batch and its padded form draw the same mask (rows and columns are
// positions within each sequence).
TEST(Dropout, VarlenMatchesPadded) {
  const std::vector<std::int32_t> lengths{37, 64};
  AttentionProblem packed(dropout(varlen(make(DType::float32, 0, 0, 0, 2, 2, 32), lengths, lengths), 0.4));
  AttentionProblem padded(dropout(make(DType::float32, 2, 64, 64, 2, 2, 32), 0.4));
  // Copy the packed inputs into the padded layout (sequence 0's tail rows stay random but
  // are then masked out by using the reference rows only up to each length).
  for (std::int64_t b = 0, start = 0; b < 2; start += lengths[static_cast<std::size_t>(b)], ++b)
    for (std::int64_t i = 0; i < lengths[static_cast<std::size_t>(b)]; ++i)
      for (std::int64_t x = 0; x < 2 * 32; ++x) {
        padded.q.set((b * 64 + i) * 64 + x, packed.q.get((start + i) * 64 + x));
        padded.k.set((b * 64 + i) * 64 + x, packed.k.get((start + i) * 64 + x));
        padded.v.set((b * 64 + i) * 64 + x, packed.v.get((start + i) * 64 + x));
      }
  packed.run_forward(Algorithm::flash2);
  padded.run_forward(Algorithm::flash2);
  // Sequence 1 has the full length in both: same mask, same output.
  for (std::int64_t i = 0; i < 64; ++i)
    for (std::int64_t x = 0; x < 2 * 32; ++x)
      EXPECT_NEAR(packed.out.get((37 + i) * 64 + x), padded.out.get((64 + i) * 64 + x), 1e-5) << i << " " << x;
}

}  // namespace
}  // namespace flashattn::testing
