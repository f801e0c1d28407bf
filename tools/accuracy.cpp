// tools/accuracy.cpp — see accuracy.hpp.
#include "tools/accuracy.hpp"

#include <cmath>
#include <cstdio>
#include <random>

#include "flashattn/mask.hpp"
#include "src/core/validate.hpp"
#include "src/cpu/reference.hpp"

namespace flashattn::tools {

namespace {

constexpr double kOutFactor = 2.0;
constexpr double kGradientFactor = 3.0;

// Absolute floors: the smallest error we never call a failure, about a few units in
// the last place of a value of magnitude 1 in the storage dtype (LSE is always float32).
double value_floor(DType dtype) {
  switch (dtype) {
    case DType::float16: return 1e-4;
    case DType::bfloat16: return 1e-3;
    default: return 1e-5;
  }
}
double lse_floor(DType dtype) { return dtype == DType::float32 ? 1e-5 : 1e-4; }

}  // namespace

void ErrorStats::add(double value, double reference, double lowprec) {
  ++count_;
  if (std::isnan(value)) {
    has_nan_ = true;
    return;
  }
  auto error_of = [reference](double x) {
    if (std::isinf(reference) || std::isinf(x)) return x == reference ? 0.0 : INFINITY;
    return std::abs(x - reference);
  };
  max_error_ = std::max(max_error_, error_of(value));
  if (!std::isnan(lowprec)) max_lowprec_error_ = std::max(max_lowprec_error_, error_of(lowprec));
}

std::string ErrorStats::summary() const {
  char text[96];
  if (has_nan_) return "NaN";
  std::snprintf(text, sizeof text, "%.2e %s %.2e", max_error_, passed() ? "<=" : ">", tolerance());
  return text;
}

ForwardAccuracy check_forward(Workload& workload) {
  const Problem& p = workload.problem();
  const AttentionParams params = validate_forward(workload.host_forward_args());
  const cpu::ReferenceResult exact = cpu::reference_forward(params);
  const cpu::ReferenceResult lowprec = cpu::naive_forward_in_precision(params, p.dtype);
  ForwardAccuracy result{ErrorStats(kOutFactor, value_floor(p.dtype)), ErrorStats(kOutFactor, lse_floor(p.dtype))};
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
      const std::int64_t row = cpu::dense_q_row(params, b, i);
      for (std::int64_t h = 0; h < p.heads; ++h) {
        // Our out is contiguous [batch, seqlen_q, heads, head_dim]: the reference's dense layout.
        for (std::int64_t d = 0; d < p.head_dim; ++d)
          result.out.add(workload.out.get((row * p.heads + h) * p.head_dim + d), exact.out_at(row, h, d),
                         lowprec.out_at(row, h, d));
        result.lse.add(workload.lse.get((b * p.heads + h) * p.seqlen_q + i), exact.lse_at(row, h), lowprec.lse_at(row, h));
      }
    }
  return result;
}

ForwardAccuracy check_forward_rows(Workload& workload, const std::vector<RowIndex>& rows) {
  const Problem& p = workload.problem();
  ForwardAccuracy result{ErrorStats(kOutFactor, value_floor(p.dtype)), ErrorStats(kOutFactor, lse_floor(p.dtype))};
  const MaskRule rule{p.seqlen_q, p.seqlen_k, p.window_left, p.causal ? 0 : p.window_right};
  const std::int64_t group = p.heads / p.heads_kv;
  const auto element = static_cast<std::int64_t>(dtype_size(p.dtype));
  for (const RowIndex& r : rows) {
    // The row as a problem of its own: one query, the keys [col_begin, col_end) it
    // may see, no mask. Views point into the host inputs with their strides.
    const std::int64_t col_begin = rule.col_begin(r.row);
    const std::int64_t keys = std::max<std::int64_t>(0, rule.col_end(r.row) - col_begin);
    const std::int64_t kv_head = r.head / group;
    auto* q_base = static_cast<char*>(workload.q.data());
    auto* k_base = static_cast<char*>(workload.k.data());
    auto* v_base = static_cast<char*>(workload.v.data());
    const std::int64_t q_offset = ((r.batch * p.seqlen_q + r.row) * p.heads + r.head) * p.head_dim;
    const std::int64_t kv_offset = ((r.batch * p.seqlen_k + col_begin) * p.heads_kv + kv_head) * p.head_dim;
    const std::int64_t kv_row_stride = p.heads_kv * p.head_dim;
    HostTensor row_out(p.dtype, {1, 1, 1, p.head_dim});
    ForwardArgs args;
    args.q = TensorView::contiguous(q_base + q_offset * element, p.dtype, {1, 1, 1, p.head_dim});
    args.k = TensorView::strided(k_base + kv_offset * element, p.dtype, {1, keys, 1, p.head_dim},
                                 {keys * kv_row_stride, kv_row_stride, p.head_dim, 1});
    args.v = TensorView::strided(v_base + kv_offset * element, p.dtype, {1, keys, 1, p.head_dim},
                                 {keys * kv_row_stride, kv_row_stride, p.head_dim, 1});
    args.out = row_out.view();
    args.options.softmax_scale = 1.0 / std::sqrt(static_cast<double>(p.head_dim));
    args.options.softcap = p.softcap;
    args.options.algorithm = Algorithm::reference;
    const AttentionParams params = validate_forward(args);
    const cpu::ReferenceResult exact = cpu::reference_forward(params);
    const cpu::ReferenceResult lowprec = cpu::naive_forward_in_precision(params, p.dtype);
    for (std::int64_t d = 0; d < p.head_dim; ++d)
      result.out.add(workload.out.get(q_offset + d), exact.out_at(0, 0, d), lowprec.out_at(0, 0, d));
    result.lse.add(workload.lse.get((r.batch * p.heads + r.head) * p.seqlen_q + r.row), exact.lse_at(0, 0),
                   lowprec.lse_at(0, 0));
  }
  return result;
}

std::vector<RowIndex> sample_rows(const Problem& p, std::int64_t count, std::uint64_t seed) {
  std::vector<RowIndex> rows;
  if (p.batch == 0 || p.heads == 0 || p.seqlen_q == 0 || count <= 0) return rows;
  rows.push_back({0, 0, 0});
  if (count >= 2) rows.push_back({p.batch - 1, p.heads - 1, p.seqlen_q - 1});
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> batch(0, p.batch - 1), head(0, p.heads - 1), row(0, p.seqlen_q - 1);
  while (static_cast<std::int64_t>(rows.size()) < count) rows.push_back({batch(rng), head(rng), row(rng)});
  return rows;
}

BackwardAccuracy check_backward(Workload& workload) {
  const Problem& p = workload.problem();
  const BackwardParams params = validate_backward(workload.host_backward_args());
  const cpu::ReferenceGradients exact = cpu::reference_backward(params);
  const cpu::ReferenceGradients lowprec = cpu::naive_backward_in_precision(params, p.dtype);
  const double floor = value_floor(p.dtype);
  BackwardAccuracy result{ErrorStats(kGradientFactor, floor), ErrorStats(kGradientFactor, floor),
                          ErrorStats(kGradientFactor, floor)};
  // dq is [batch, seqlen_q, heads, head_dim] and dk/dv [batch, seqlen_k, heads_kv,
  // head_dim], contiguous: the same flat order as the reference's dense layout.
  for (std::int64_t i = 0; i < workload.dq.numel(); ++i)
    result.dq.add(workload.dq.get(i), exact.dq[static_cast<std::size_t>(i)], lowprec.dq[static_cast<std::size_t>(i)]);
  for (std::int64_t i = 0; i < workload.dk.numel(); ++i) {
    result.dk.add(workload.dk.get(i), exact.dk[static_cast<std::size_t>(i)], lowprec.dk[static_cast<std::size_t>(i)]);
    result.dv.add(workload.dv.get(i), exact.dv[static_cast<std::size_t>(i)], lowprec.dv[static_cast<std::size_t>(i)]);
  }
  return result;
}

}  // namespace flashattn::tools
