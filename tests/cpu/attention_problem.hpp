// tests/cpu/attention_problem.hpp — a random attention problem with its owning
// buffers, the public argument structs onto them, and the tolerance rule of STYLE.md.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "src/core/validate.hpp"
#include "src/cpu/reference.hpp"
#include "tests/support/host_tensor.hpp"

namespace flashattn::testing {

struct ProblemShape {
  DType dtype = DType::float32;
  std::int64_t batch = 1;
  std::int64_t seqlen_q = 16;
  std::int64_t seqlen_k = 16;
  std::int64_t heads_q = 2;
  std::int64_t heads_kv = 2;
  std::int64_t head_dim = 32;
  bool causal = false;
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  double softcap = 0.0;
  // ALiBi: 0 = off, 1 = slopes [heads_q], 2 = slopes [batch, heads_q].
  int alibi = 0;
  // Dropout probability (0 = off) and the generator's seed/offset.
  double dropout_p = 0.0;
  std::uint64_t dropout_seed = 0x5eed;
  std::uint64_t dropout_offset = 0;
  // Varlen when non-empty (batch = size): per-sequence lengths, packed along one axis.
  std::vector<std::int32_t> varlen_q;
  std::vector<std::int32_t> varlen_k;

  std::string describe() const {
    std::string s = std::string(dtype_name(dtype)) + " b" + std::to_string(batch) + " q" + std::to_string(seqlen_q) + " k" +
                    std::to_string(seqlen_k) + " h" + std::to_string(heads_q) + "/" + std::to_string(heads_kv) + " d" +
                    std::to_string(head_dim);
    if (causal) s += " causal";
    if (window_left >= 0 || window_right >= 0) s += " window(" + std::to_string(window_left) + "," + std::to_string(window_right) + ")";
    if (softcap > 0) s += " softcap" + std::to_string(softcap);
    if (alibi) s += alibi == 1 ? " alibi[h]" : " alibi[b,h]";
    if (dropout_p > 0) s += " dropout" + std::to_string(dropout_p);
    if (!varlen_q.empty()) s += " varlen";
    return s;
  }
};

// Readable test-parameter names in GoogleTest's output.
inline void PrintTo(const ProblemShape& shape, std::ostream* os) { *os << shape.describe(); }

// Shape builders for the test sweeps: make(...) then decorate, e.g. causal(make(...)).
inline ProblemShape make(DType dtype, std::int64_t batch, std::int64_t seqlen_q, std::int64_t seqlen_k,
                         std::int64_t heads_q, std::int64_t heads_kv, std::int64_t head_dim) {
  ProblemShape s;
  s.dtype = dtype, s.batch = batch, s.seqlen_q = seqlen_q, s.seqlen_k = seqlen_k;
  s.heads_q = heads_q, s.heads_kv = heads_kv, s.head_dim = head_dim;
  return s;
}
inline ProblemShape causal(ProblemShape s) { return s.causal = true, s; }
inline ProblemShape window(ProblemShape s, std::int64_t left, std::int64_t right) {
  return s.window_left = left, s.window_right = right, s;
}
inline ProblemShape softcap(ProblemShape s, double cap) { return s.softcap = cap, s; }
inline ProblemShape alibi(ProblemShape s, int per = 1) { return s.alibi = per, s; }
inline ProblemShape dropout(ProblemShape s, double p, std::uint64_t seed = 0x5eed, std::uint64_t offset = 0) {
  return s.dropout_p = p, s.dropout_seed = seed, s.dropout_offset = offset, s;
}
// Varlen: per-sequence lengths; batch and the max lengths follow from them.
inline ProblemShape varlen(ProblemShape s, std::vector<std::int32_t> q, std::vector<std::int32_t> k) {
  s.batch = static_cast<std::int64_t>(q.size());
  s.seqlen_q = *std::max_element(q.begin(), q.end());
  s.seqlen_k = *std::max_element(k.begin(), k.end());
  s.varlen_q = std::move(q), s.varlen_k = std::move(k);
  return s;
}

class AttentionProblem {
 public:
  explicit AttentionProblem(const ProblemShape& shape, std::uint64_t seed = 1) : shape_(shape) {
    const auto& s = shape;
    if (is_varlen()) {
      const std::int64_t total_q = std::accumulate(s.varlen_q.begin(), s.varlen_q.end(), std::int64_t{0});
      const std::int64_t total_k = std::accumulate(s.varlen_k.begin(), s.varlen_k.end(), std::int64_t{0});
      q = HostTensor(s.dtype, {total_q, s.heads_q, s.head_dim});
      k = HostTensor(s.dtype, {total_k, s.heads_kv, s.head_dim});
      lse = HostTensor(DType::float32, {s.heads_q, total_q});
      cu_seqlens_q = prefix_sums(s.varlen_q);
      cu_seqlens_k = prefix_sums(s.varlen_k);
    } else {
      q = HostTensor(s.dtype, {s.batch, s.seqlen_q, s.heads_q, s.head_dim});
      k = HostTensor(s.dtype, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim});
      lse = HostTensor(DType::float32, {s.batch, s.heads_q, s.seqlen_q});
    }
    v = HostTensor(s.dtype, k.shape());
    out = HostTensor(s.dtype, q.shape());
    dout = HostTensor(s.dtype, q.shape());
    dq = HostTensor(s.dtype, q.shape());
    dk = HostTensor(s.dtype, k.shape());
    dv = HostTensor(s.dtype, k.shape());
    q.fill_random(seed * 7 + 1);
    k.fill_random(seed * 7 + 2);
    v.fill_random(seed * 7 + 3);
    dout.fill_random(seed * 7 + 4);
    out.fill_canary();
    lse.fill_canary();
    if (s.alibi) {
      // Slopes like the ALiBi paper's geometric sequence (2^(-8 h / heads)), varied per batch.
      alibi_slopes = s.alibi == 1 ? HostTensor(DType::float32, {s.heads_q}) : HostTensor(DType::float32, {s.batch, s.heads_q});
      for (std::int64_t i = 0; i < alibi_slopes.numel(); ++i)
        alibi_slopes.set(i, static_cast<float>(std::exp2(-8.0 * static_cast<double>(i % s.heads_q + 1) / static_cast<double>(s.heads_q)) *
                                               (1.0 + 0.25 * static_cast<double>(i / s.heads_q))));
    }
  }

  bool is_varlen() const { return !shape_.varlen_q.empty(); }
  const ProblemShape& shape() const { return shape_; }

  AttentionOptions options(Algorithm algorithm = Algorithm::automatic) const {
    AttentionOptions o;
    o.causal = shape_.causal;
    o.window_left = shape_.window_left;
    o.window_right = shape_.window_right;
    o.softcap = shape_.softcap;
    if (shape_.alibi) o.maybe_alibi_slopes = alibi_slopes_view ? *alibi_slopes_view : const_cast<HostTensor&>(alibi_slopes).view();
    o.dropout_p = shape_.dropout_p;
    o.dropout_seed = shape_.dropout_seed;
    o.dropout_offset = shape_.dropout_offset;
    o.algorithm = algorithm;
    return o;
  }
  std::optional<VarlenArgs> varlen() {
    if (!is_varlen()) return std::nullopt;
    VarlenArgs args;
    args.cu_seqlens_q = cu_seqlens_q.view();
    args.cu_seqlens_k = cu_seqlens_k.view();
    args.max_seqlen_q = *std::max_element(shape_.varlen_q.begin(), shape_.varlen_q.end());
    args.max_seqlen_k = *std::max_element(shape_.varlen_k.begin(), shape_.varlen_k.end());
    return args;
  }
  ForwardArgs forward_args(Algorithm algorithm = Algorithm::automatic) {
    ForwardArgs args;
    args.q = q_view ? *q_view : q.view();
    args.k = k_view ? *k_view : k.view();
    args.v = v_view ? *v_view : v.view();
    args.out = out.view();
    args.maybe_lse = lse.view();
    args.maybe_varlen = varlen();
    args.options = options(algorithm);
    return args;
  }
  // Backward of the current out/lse (run forward first).
  BackwardArgs backward_args(Algorithm algorithm = Algorithm::automatic) {
    BackwardArgs args;
    args.q = q_view ? *q_view : q.view();
    args.k = k_view ? *k_view : k.view();
    args.v = v_view ? *v_view : v.view();
    args.out = out.view();
    args.dout = dout.view();
    args.lse = lse.view();
    args.dq = dq.view();
    args.dk = dk.view();
    args.dv = dv.view();
    args.maybe_varlen = varlen();
    args.options = options(algorithm);
    return args;
  }
  AttentionParams forward_params() { return validate_forward(forward_args()); }
  BackwardParams backward_params() { return validate_backward(backward_args()); }

  void run_forward(Algorithm algorithm = Algorithm::automatic, int threads = 0) {
    ExecutionContext context;
    context.num_threads = threads;
    forward(forward_args(algorithm), context);
  }
  void run_backward(int threads = 0) {
    ExecutionContext context;
    context.num_threads = threads;
    backward(backward_args(), context);
  }

  HostTensor q, k, v, out, lse, dout, dq, dk, dv;
  HostTensor cu_seqlens_q, cu_seqlens_k;
  HostTensor alibi_slopes;
  std::optional<TensorView> alibi_slopes_view;  // replaces alibi_slopes (e.g. a device copy)
  // Optional strided views replacing q/k/v (non-contiguous layouts).
  std::optional<TensorView> q_view, k_view, v_view;

 private:
  static HostTensor prefix_sums(const std::vector<std::int32_t>& lengths) {
    HostTensor t(DType::int32, {static_cast<std::int64_t>(lengths.size() + 1)});
    auto* p = static_cast<std::int32_t*>(t.data());
    p[0] = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) p[i + 1] = p[i] + lengths[i];
    return t;
  }
  ProblemShape shape_;
};

// max |a - b| over finite pairs; +inf if any value is NaN or only one of a pair is infinite.
inline double max_abs_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  return worst;
}

// Absolute error floors of the tolerance rule, per dtype (the error of one rounding of
// an O(1) value, a little more for the low-precision types).
inline double tolerance_floor(DType dtype) {
  switch (dtype) {
    case DType::float32: return 1e-6;
    case DType::float16: return 1e-4;
    default: return 5e-4;
  }
}

// The output of the problem as the dense [total_q, heads_q, head_dim] layout of
// ReferenceResult (out and lse read through the test's own buffers).
inline cpu::ReferenceResult gather_output(AttentionProblem& problem) {
  const AttentionParams p = problem.forward_params();
  cpu::ReferenceResult r;
  r.total_q = p.total_q, r.heads_q = p.heads_q, r.head_dim = p.head_dim;
  r.out.assign(static_cast<std::size_t>(p.total_q * p.heads_q * p.head_dim), 0.0);
  r.lse.assign(static_cast<std::size_t>(p.total_q * p.heads_q), 0.0);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seqlen_q_of(b); ++i) {
        const std::int64_t row = cpu::dense_q_row(p, b, i);
        for (std::int64_t d = 0; d < p.head_dim; ++d)
          r.out[static_cast<std::size_t>((row * p.heads_q + h) * p.head_dim + d)] =
              problem.out.get(p.out_offset(b, h) + i * p.out_row_stride + d);
        r.lse[static_cast<std::size_t>(row * p.heads_q + h)] = problem.lse.get(p.lse_offset(b, h) + i * p.lse_row_stride);
      }
  return r;
}

// Checks out and LSE against the float64 reference with the STYLE.md rule:
// max|out - ref64| <= 2 * max|out_lowprec_ref - ref64| + floor.
inline void expect_forward_matches_reference(AttentionProblem& problem, const std::string& label) {
  const AttentionParams params = problem.forward_params();
  const cpu::ReferenceResult ref = cpu::reference_forward(params);
  const cpu::ReferenceResult low = cpu::naive_forward_in_precision(params, params.dtype);
  const cpu::ReferenceResult got = gather_output(problem);
  const double floor = tolerance_floor(params.dtype);
  const double out_error = max_abs_difference(got.out, ref.out);
  const double out_bound = 2.0 * max_abs_difference(low.out, ref.out) + floor;
  EXPECT_LE(out_error, out_bound) << label << " (out)";
  const double lse_error = max_abs_difference(got.lse, ref.lse);
  const double lse_bound = 2.0 * max_abs_difference(low.lse, ref.lse) + floor;
  EXPECT_LE(lse_error, lse_bound) << label << " (lse)";
}

// dq/dk/dv of the problem in ReferenceGradients' dense layout.
inline cpu::ReferenceGradients gather_gradients(AttentionProblem& problem) {
  const BackwardParams p = problem.backward_params();
  cpu::ReferenceGradients g;
  g.total_q = p.total_q, g.total_k = p.total_k, g.heads_q = p.heads_q, g.heads_kv = p.heads_kv, g.head_dim = p.head_dim;
  g.dq.assign(static_cast<std::size_t>(p.total_q * p.heads_q * p.head_dim), 0.0);
  g.dk.assign(static_cast<std::size_t>(p.total_k * p.heads_kv * p.head_dim), 0.0);
  g.dv.assign(g.dk.size(), 0.0);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seqlen_q_of(b); ++i)
        for (std::int64_t d = 0; d < p.head_dim; ++d)
          g.dq[static_cast<std::size_t>((cpu::dense_q_row(p, b, i) * p.heads_q + h) * p.head_dim + d)] =
              problem.dq.get(p.dq_offset(b, h) + i * p.dq_row_stride + d);
    for (std::int64_t h = 0; h < p.heads_kv; ++h)
      for (std::int64_t j = 0; j < p.seqlen_k_of(b); ++j)
        for (std::int64_t d = 0; d < p.head_dim; ++d) {
          const auto index = static_cast<std::size_t>((cpu::dense_k_row(p, b, j) * p.heads_kv + h) * p.head_dim + d);
          g.dk[index] = problem.dk.get(p.dk_offset(b, h) + j * p.dk_row_stride + d);
          g.dv[index] = problem.dv.get(p.dv_offset(b, h) + j * p.dv_row_stride + d);
        }
  }
  return g;
}

// Gradients against the float64 reference: 3x the low-precision reference's error.
inline void expect_backward_matches_reference(AttentionProblem& problem, const std::string& label) {
  const BackwardParams params = problem.backward_params();
  const cpu::ReferenceGradients ref = cpu::reference_backward(params);
  const cpu::ReferenceGradients low = cpu::naive_backward_in_precision(params, params.dtype);
  const cpu::ReferenceGradients got = gather_gradients(problem);
  const double floor = tolerance_floor(params.dtype);
  EXPECT_LE(max_abs_difference(got.dq, ref.dq), 3.0 * max_abs_difference(low.dq, ref.dq) + floor) << label << " (dq)";
  EXPECT_LE(max_abs_difference(got.dk, ref.dk), 3.0 * max_abs_difference(low.dk, ref.dk) + floor) << label << " (dk)";
  EXPECT_LE(max_abs_difference(got.dv, ref.dv), 3.0 * max_abs_difference(low.dv, ref.dv) + floor) << label << " (dv)";
}

}  // namespace flashattn::testing
