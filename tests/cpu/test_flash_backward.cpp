// tests/cpu/test_flash_backward.cpp — the flash backward (recomputation from LSE)
// against the float64 reference backward (3x rule of STYLE.md), against central
// finite differences, and its edge cases and determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/cpu/attention_problem.hpp"

namespace flashattn::testing {
namespace {


std::vector<ProblemShape> backward_shapes() {
  std::vector<ProblemShape> shapes;
  for (DType t : {DType::float32, DType::float16, DType::bfloat16}) {
    shapes.push_back(make(t, 2, 113, 113, 2, 2, 64));
    shapes.push_back(make(t, 1, 1, 17, 2, 1, 32));
    shapes.push_back(make(t, 1, 17, 1, 1, 1, 64));
    shapes.push_back(causal(make(t, 1, 113, 40, 2, 2, 64)));
    shapes.push_back(causal(make(t, 1, 40, 203, 2, 2, 40)));
    shapes.push_back(make(t, 1, 33, 70, 1, 1, 72));
    shapes.push_back(causal(make(t, 1, 20, 65, 1, 1, 128)));
    shapes.push_back(causal(make(t, 1, 20, 40, 1, 1, 256)));
    shapes.push_back(causal(make(t, 1, 30, 97, 8, 1, 32)));
    shapes.push_back(make(t, 1, 50, 50, 4, 1, 16));
    shapes.push_back(window(make(t, 1, 127, 129, 2, 2, 32), 16, 0));
    shapes.push_back(window(make(t, 1, 100, 80, 2, 1, 32), 8, 8));
    shapes.push_back(softcap(make(t, 1, 70, 90, 2, 1, 32), 5.0));
    shapes.push_back(softcap(causal(make(t, 1, 70, 90, 2, 2, 32)), 2.0));
    shapes.push_back(varlen(make(t, 0, 0, 0, 2, 1, 32), {5, 0, 1, 70}, {9, 3, 0, 64}));
  }
  shapes.push_back(causal(make(DType::float32, 1, 1023, 1023, 1, 1, 64)));
  return shapes;
}

class FlashBackwardVsReference : public ::testing::TestWithParam<ProblemShape> {};

TEST_P(FlashBackwardVsReference, WithinPrecisionRelativeTolerance) {
  AttentionProblem problem(GetParam(), 4);
  problem.run_forward(Algorithm::flash2);
  problem.dq.fill_canary(), problem.dk.fill_canary(), problem.dv.fill_canary();
  problem.run_backward();
  expect_backward_matches_reference(problem, GetParam().describe());
}

INSTANTIATE_TEST_SUITE_P(Sweep, FlashBackwardVsReference, ::testing::ValuesIn(backward_shapes()));

// One thread: the pass-1 items then hold several key blocks each.
TEST(FlashBackward, SingleThreadMultiBlockItemsMatchReference) {
  for (const ProblemShape& shape : {causal(make(DType::float32, 1, 600, 620, 2, 1, 64)), window(make(DType::bfloat16, 1, 500, 700, 2, 2, 32), 90, 30)}) {
    AttentionProblem problem(shape, 5);
    problem.run_forward(Algorithm::flash2, 1);
    problem.run_backward(1);
    expect_backward_matches_reference(problem, shape.describe() + " threads 1");
  }
}

// The flash gradients (float32 inputs) against central differences of the float64
// forward: L = sum(dO ∘ O).
TEST(FlashBackward, MatchesFiniteDifferences) {
  for (const ProblemShape& shape : {causal(make(DType::float32, 2, 5, 4, 2, 1, 3)), softcap(make(DType::float32, 1, 4, 6, 1, 1, 5), 1.5)}) {
    AttentionProblem problem(shape, 61);
    problem.run_forward(Algorithm::flash2);
    problem.run_backward();
    const auto loss = [&] {
      const AttentionParams p = problem.forward_params();
      const cpu::ReferenceResult r = cpu::reference_forward(p);
      double sum = 0.0;
      for (std::size_t e = 0; e < r.out.size(); ++e) sum += r.out[e] * problem.dout.get(static_cast<std::int64_t>(e));
      return sum;
    };
    const auto check = [&](HostTensor& input, const HostTensor& gradient, const char* name) {
      for (std::int64_t e = 0; e < input.numel(); ++e) {
        const float x = input.get(e);
        input.set(e, x + 1.0f / 256);
        const double x_up = input.get(e), up = loss();
        input.set(e, x - 1.0f / 256);
        const double x_down = input.get(e), down = loss();
        input.set(e, x);
        EXPECT_NEAR(gradient.get(e), (up - down) / (x_up - x_down), 2e-4) << name << "[" << e << "] " << shape.describe();
      }
    };
    check(problem.q, problem.dq, "dq");
    check(problem.k, problem.dk, "dk");
    check(problem.v, problem.dv, "dv");
  }
}

// Rows that see no key contribute nothing; keys that no row sees get gradient 0;
// never NaN. seqlen_k = 0 gives dq = 0.
TEST(FlashBackward, FullyMaskedRowsAndEmptyProblems) {
  AttentionProblem masked(causal(make(DType::float32, 1, 70, 20, 2, 1, 16)), 71);
  masked.run_forward(Algorithm::flash2);
  masked.dq.fill_canary(), masked.dk.fill_canary(), masked.dv.fill_canary();
  masked.run_backward();
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t i = 0; i < 70; ++i)
      for (std::int64_t d = 0; d < 16; ++d) {
        const float value = masked.dq.get((i * 2 + h) * 16 + d);
        ASSERT_FALSE(std::isnan(value));
        if (i < 50) ASSERT_EQ(value, 0.0f) << "row " << i;
      }
  for (std::int64_t e = 0; e < masked.dk.numel(); ++e) ASSERT_FALSE(std::isnan(masked.dk.get(e)) || std::isnan(masked.dv.get(e)));
  expect_backward_matches_reference(masked, "causal 70x20");

  AttentionProblem no_keys(make(DType::bfloat16, 2, 9, 0, 2, 1, 16), 72);
  no_keys.run_forward(Algorithm::flash2);
  no_keys.dq.fill_canary();
  no_keys.run_backward();
  for (std::int64_t e = 0; e < no_keys.dq.numel(); ++e) ASSERT_EQ(no_keys.dq.get(e), 0.0f);

  // A sliding window that leaves the first keys unseen: row i sees keys [i + 25, i + 30],
  // so keys 0..24 get dK = dV = 0 exactly.
  AttentionProblem unseen(window(make(DType::float32, 1, 30, 60, 1, 1, 16), 5, 0), 73);
  unseen.run_forward(Algorithm::flash2);
  unseen.dk.fill_canary(), unseen.dv.fill_canary();
  unseen.run_backward();
  for (std::int64_t e = 0; e < unseen.dk.numel(); ++e) {
    ASSERT_FALSE(std::isnan(unseen.dk.get(e)) || std::isnan(unseen.dv.get(e)));
    if (e / 16 < 25) {
      ASSERT_EQ(unseen.dk.get(e), 0.0f);
      ASSERT_EQ(unseen.dv.get(e), 0.0f);
    }
  }

  for (const ProblemShape& shape : {make(DType::float32, 0, 8, 8, 2, 2, 16), make(DType::float32, 2, 0, 8, 2, 2, 16)}) {
    AttentionProblem empty(shape, 74);
    empty.run_forward(Algorithm::flash2);
    EXPECT_NO_THROW(empty.run_backward());
    for (std::int64_t e = 0; e < empty.dk.numel(); ++e) ASSERT_EQ(empty.dk.get(e), 0.0f);
  }
}

// No atomics, a fixed reduction order: repeatable bit for bit, at any thread count.
TEST(FlashBackward, DeterministicAcrossRunsAndThreadCounts) {
  AttentionProblem problem(causal(make(DType::float32, 2, 150, 170, 4, 2, 32)), 81);
  problem.run_forward(Algorithm::flash2);
  problem.run_backward(1);
  const HostTensor dq = problem.dq, dk = problem.dk, dv = problem.dv;
  problem.run_backward(2);
  EXPECT_TRUE(dq.bitwise_equal(problem.dq));
  EXPECT_TRUE(dk.bitwise_equal(problem.dk));
  EXPECT_TRUE(dv.bitwise_equal(problem.dv));
}

TEST(FlashBackward, ReferenceAlgorithmWritesRoundedReference) {
  AttentionProblem problem(causal(make(DType::float32, 1, 20, 25, 2, 1, 8)), 91);
  problem.run_forward(Algorithm::reference);
  ExecutionContext context;
  backward(problem.backward_args(Algorithm::reference), context);
  const cpu::ReferenceGradients ref = cpu::reference_backward(problem.backward_params());
  const cpu::ReferenceGradients got = gather_gradients(problem);
  for (std::size_t e = 0; e < ref.dq.size(); ++e) ASSERT_EQ(got.dq[e], static_cast<double>(static_cast<float>(ref.dq[e])));
  for (std::size_t e = 0; e < ref.dk.size(); ++e) ASSERT_EQ(got.dk[e], static_cast<double>(static_cast<float>(ref.dk[e])));
}

}  // namespace
}  // namespace flashattn::testing
