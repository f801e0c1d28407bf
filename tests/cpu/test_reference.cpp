// tests/cpu/test_reference.cpp — the float64 oracle against values computed by hand,
// and its backward against central finite differences of its own forward.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/cpu/attention_problem.hpp"

namespace flashattn::testing {
namespace {

// Seed 003's worked example: one query row whose scores are x = [1, 3, 2, 4, 3, 2]
// (head_dim 1, q = 1, k_j = x_j, scale 1), so P = softmax(x) and O = sum_j P_j v_j.
TEST(Reference, SeedWorkedExampleByHand) {
  ProblemShape shape;
  shape.seqlen_q = 1, shape.seqlen_k = 6, shape.heads_q = 1, shape.heads_kv = 1, shape.head_dim = 1;
  AttentionProblem problem(shape);
  const float scores[6] = {1, 3, 2, 4, 3, 2};
  const float values[6] = {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -2.0f};
  problem.q.set(0, 1.0f);
  for (int j = 0; j < 6; ++j) problem.k.set(j, scores[j]), problem.v.set(j, values[j]);
  ForwardArgs args = problem.forward_args();
  args.options.softmax_scale = 1.0;
  const cpu::ReferenceResult r = cpu::reference_forward(validate_forward(args));

  // m = 4, l = e^-3 + e^-1 + e^-2 + 1 + e^-1 + e^-2 (seed 003).
  const double l = std::exp(-3.0) + std::exp(-1.0) + std::exp(-2.0) + 1.0 + std::exp(-1.0) + std::exp(-2.0);
  double expected = 0.0;
  for (int j = 0; j < 6; ++j) expected += std::exp(scores[j] - 4.0) / l * values[j];
  EXPECT_NEAR(r.lse_at(0, 0), 4.0 + std::log(l), 1e-12);
  EXPECT_NEAR(r.out_at(0, 0, 0), expected, 1e-12);
}

// Two rows, causal with seqlen_q = seqlen_k = 2: row 0 sees only key 0 (output v_0
// exactly), row 1 sees both.
TEST(Reference, CausalTwoByTwoByHand) {
  ProblemShape shape;
  shape.seqlen_q = 2, shape.seqlen_k = 2, shape.heads_q = 1, shape.heads_kv = 1, shape.head_dim = 2, shape.causal = true;
  AttentionProblem problem(shape);
  const float q[4] = {1, 0, 0.5f, 2}, k[4] = {1, 1, -1, 0.5f}, v[4] = {1, 2, 3, -4};
  for (int e = 0; e < 4; ++e) problem.q.set(e, q[e]), problem.k.set(e, k[e]), problem.v.set(e, v[e]);
  ForwardArgs args = problem.forward_args();
  args.options.softmax_scale = 0.5;
  const cpu::ReferenceResult r = cpu::reference_forward(validate_forward(args));
  EXPECT_DOUBLE_EQ(r.out_at(0, 0, 0), 1.0);
  EXPECT_DOUBLE_EQ(r.out_at(0, 0, 1), 2.0);
  EXPECT_NEAR(r.lse_at(0, 0), 0.5 * (1 * 1 + 0 * 1), 1e-15);
  const double s0 = 0.5 * (0.5 * 1 + 2 * 1), s1 = 0.5 * (0.5 * -1 + 2 * 0.5);
  const double p0 = std::exp(s0) / (std::exp(s0) + std::exp(s1)), p1 = 1.0 - p0;
  EXPECT_NEAR(r.out_at(1, 0, 0), p0 * 1 + p1 * 3, 1e-14);
  EXPECT_NEAR(r.out_at(1, 0, 1), p0 * 2 + p1 * -4, 1e-14);
  EXPECT_NEAR(r.lse_at(1, 0), std::log(std::exp(s0) + std::exp(s1)), 1e-14);
}

TEST(Reference, SoftcapByHand) {
  ProblemShape shape;
  shape.seqlen_q = 1, shape.seqlen_k = 2, shape.heads_q = 1, shape.heads_kv = 1, shape.head_dim = 1, shape.softcap = 2.0;
  AttentionProblem problem(shape);
  problem.q.set(0, 3.0f);
  problem.k.set(0, 1.0f), problem.k.set(1, -0.5f);
  problem.v.set(0, 1.0f), problem.v.set(1, 0.0f);
  ForwardArgs args = problem.forward_args();
  args.options.softmax_scale = 1.0;
  const cpu::ReferenceResult r = cpu::reference_forward(validate_forward(args));
  const double s0 = 2.0 * std::tanh(3.0 / 2.0), s1 = 2.0 * std::tanh(-1.5 / 2.0);
  EXPECT_NEAR(r.out_at(0, 0, 0), std::exp(s0) / (std::exp(s0) + std::exp(s1)), 1e-14);
}

// L = sum(dO ∘ O(q, k, v)); dL/dx by central differences of the float64 forward.
double loss(AttentionProblem& problem) {
  const cpu::ReferenceResult r = cpu::reference_forward(problem.forward_params());
  const AttentionParams p = problem.forward_params();
  double sum = 0.0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seqlen_q_of(b); ++i)
        for (std::int64_t d = 0; d < p.head_dim; ++d)
          sum += r.out_at(cpu::dense_q_row(p, b, i), h, d) * problem.dout.get(p.out_offset(b, h) + i * p.out_row_stride + d);
  return sum;
}

void expect_gradient_matches_differences(AttentionProblem& problem, HostTensor& input, const std::vector<double>& gradient,
                                         const char* name) {
  // Inputs and the dense gradient share the contiguous [rows, heads, head_dim] order here.
  double worst = 0.0, scale = 0.0;
  for (std::int64_t e = 0; e < input.numel(); ++e) {
    const float x = input.get(e);
    const float step = 1.0f / 256.0f;
    input.set(e, x + step);
    const double x_up = input.get(e), up = loss(problem);
    input.set(e, x - step);
    const double x_down = input.get(e), down = loss(problem);
    input.set(e, x);
    const double numeric = (up - down) / (x_up - x_down);  // the steps actually taken in float32
    worst = std::max(worst, std::abs(numeric - gradient[static_cast<std::size_t>(e)]));
    scale = std::max(scale, std::abs(numeric));
  }
  EXPECT_LE(worst, 1e-4 * std::max(1.0, scale)) << name;
}

class ReferenceBackwardFiniteDifferences : public ::testing::TestWithParam<ProblemShape> {};

TEST_P(ReferenceBackwardFiniteDifferences, MatchesCentralDifferences) {
  AttentionProblem problem(GetParam(), 11);
  problem.run_forward(Algorithm::reference);
  const cpu::ReferenceGradients g = cpu::reference_backward(problem.backward_params());
  expect_gradient_matches_differences(problem, problem.q, g.dq, "dq");
  expect_gradient_matches_differences(problem, problem.k, g.dk, "dk");
  expect_gradient_matches_differences(problem, problem.v, g.dv, "dv");
}

ProblemShape tiny(std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t heads_q, std::int64_t heads_kv, bool causal,
                  double softcap, std::int64_t window_left = -1) {
  ProblemShape s;
  s.batch = 2, s.seqlen_q = seqlen_q, s.seqlen_k = seqlen_k, s.heads_q = heads_q, s.heads_kv = heads_kv, s.head_dim = 3;
  s.causal = causal, s.softcap = softcap, s.window_left = window_left;
  return s;
}

INSTANTIATE_TEST_SUITE_P(TinyShapes, ReferenceBackwardFiniteDifferences,
                         ::testing::Values(tiny(3, 4, 1, 1, false, 0.0), tiny(4, 3, 2, 1, true, 0.0), tiny(3, 3, 2, 2, false, 1.5),
                                           tiny(4, 4, 2, 1, true, 0.0, 1)));

}  // namespace
}  // namespace flashattn::testing
