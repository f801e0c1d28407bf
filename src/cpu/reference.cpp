// src/cpu/reference.cpp — the float64 oracle and its in-precision twin (see reference.hpp).
//
// One template computes both: Acc is the accumulator type (double for the oracle,
// float for the low-precision twin, like a GPU matmul that accumulates in fp32) and
// Rounding rounds each materialised intermediate (S, P, O, dP, dS, ...) to the
// storage precision (identity for the oracle).
#include "src/cpu/reference.hpp"

#include <cmath>
#include <limits>

#include "flashattn/dropout.hpp"
#include "flashattn/mask.hpp"
#include "flashattn/score.hpp"
#include "src/core/numeric.hpp"
#include "src/cpu/attention_mask.hpp"

namespace flashattn::cpu {
namespace {

constexpr double kNegativeInfinity = -std::numeric_limits<double>::infinity();

struct Rounding {
  bool is_exact = true;
  DType precision = DType::float32;
  double operator()(double x) const {
    if (is_exact || std::isinf(x)) return x;
    return static_cast<double>(numeric::round_to(precision, static_cast<float>(x)));
  }
};

// A dense (rows, head_dim) copy of one head of one sequence, read through strides.
std::vector<double> load_rows(const void* base, DType dtype, std::int64_t offset, std::int64_t row_stride,
                              std::int64_t rows, std::int64_t head_dim) {
  std::vector<double> tile(static_cast<std::size_t>(rows * head_dim));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t d = 0; d < head_dim; ++d)
      tile[static_cast<std::size_t>(r * head_dim + d)] = numeric::load_as_float(base, dtype, offset + r * row_stride + d);
  return tile;
}

// The three steps for one (sequence b, query head h): fills s_raw (scale*QK^T before
// softcap), p (probabilities, before dropout), keep (dropout's mask Z, when on), out
// and lse, each (rows_q, .) dense. With ALiBi and dropout:
//   S = cap(scale · Q K^T) − slope · |i + seqlen_k − seqlen_q − j|     (flashattn/score.hpp)
//   O = (P ∘ Z) V / (1 − p)                                           (flashattn/dropout.hpp)
template <class Acc>
struct HeadForward {
  std::int64_t rows_q = 0, rows_k = 0, head_dim = 0;
  std::vector<double> s_raw;  // (rows_q, rows_k): scale * q.k (before softcap); masked entries unused
  std::vector<double> p;      // (rows_q, rows_k)
  std::vector<char> keep;     // (rows_q, rows_k): dropout's Z (empty without dropout)
  // (rows_q, rows_k): 1 where row r sees key j — not masked (causal/window, block mask,
  // attn_mask) and the row sees some key (LSE not -inf). The backward's NaN rule: only
  // these entries enter dS, dQ, dK, dV (a hidden entry is skipped, never multiplied by 0).
  std::vector<char> seen;
  std::vector<double> out;    // (rows_q, head_dim)
  std::vector<double> lse;    // (rows_q)
};

// The masks beyond MaskRule of (b, h), applied to S after the score rule (attention_mask.hpp).
HeadMask head_mask(const AttentionParams& params, std::int64_t b, std::int64_t h) {
  HeadMask mask;
  mask.reset(params, b, h);
  return mask;
}

template <class Acc>
HeadForward<Acc> head_forward(const AttentionParams& params, std::int64_t b, std::int64_t h, const MaskRule& mask,
                              const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                              std::int64_t rows_q, std::int64_t row_first, const Rounding& round) {
  HeadForward<Acc> f;
  const double alibi_slope = params.has_alibi() ? params.maybe_alibi_slopes[b * params.alibi_batch_stride + h] : 0.0;
  const DropoutRule dropout = params.dropout();
  const std::uint32_t dropout_head = params.dropout_head(b, h);
  const Acc inverse_keep = static_cast<Acc>(dropout.inverse_keep);
  const std::int64_t rows_k = mask.seqlen_k, head_dim = params.head_dim;
  f.rows_q = rows_q, f.rows_k = rows_k, f.head_dim = head_dim;
  f.s_raw.assign(static_cast<std::size_t>(rows_q * rows_k), 0.0);
  f.p.assign(static_cast<std::size_t>(rows_q * rows_k), 0.0);
  f.out.assign(static_cast<std::size_t>(rows_q * head_dim), 0.0);
  f.lse.assign(static_cast<std::size_t>(rows_q), kNegativeInfinity);
  f.seen.assign(static_cast<std::size_t>(rows_q * rows_k), 0);
  const double scale = params.softmax_scale;
  std::vector<double> s(static_cast<std::size_t>(rows_k));
  // attn_mask / block mask: S += bias (natural log) or -inf where masked, after the score rule.
  const HeadMask extra = head_mask(params, b, h);
  std::vector<char> hidden(static_cast<std::size_t>(rows_k));
  for (std::int64_t r = 0; r < rows_q; ++r) {
    const std::int64_t i = row_first + r;  // the query row within its sequence (the mask's row)
    // S = Q K^T * scale, softcapped, masked.
    double row_max = kNegativeInfinity;
    bool has_nan = false;  // a NaN score makes the row NaN (std::max would skip it)
    for (std::int64_t j = 0; j < rows_k; ++j) {
      const double extra_offset = extra.is_active() && mask.allowed(i, j) ? extra.offset_of(i, j) : 0.0;
      hidden[static_cast<std::size_t>(j)] = !mask.allowed(i, j) || extra_offset == kNegativeInfinity;
      if (hidden[static_cast<std::size_t>(j)]) {
        s[static_cast<std::size_t>(j)] = kNegativeInfinity;
        continue;
      }
      Acc dot = 0;
      for (std::int64_t d = 0; d < head_dim; ++d)
        dot += static_cast<Acc>(q[static_cast<std::size_t>(r * head_dim + d)]) * static_cast<Acc>(k[static_cast<std::size_t>(j * head_dim + d)]);
      double score = round(static_cast<double>(static_cast<Acc>(dot) * static_cast<Acc>(scale)));
      f.s_raw[static_cast<std::size_t>(r * rows_k + j)] = score;
      if (params.has_softcap()) {
        const Acc cap = static_cast<Acc>(params.softcap);
        score = round(static_cast<double>(cap * std::tanh(static_cast<Acc>(score) / cap)));
      }
      if (params.has_alibi())
        score = round(static_cast<double>(static_cast<Acc>(score) + static_cast<Acc>(ScoreRule::alibi_bias(alibi_slope, i + mask.seqlen_k - mask.seqlen_q - j))));
      if (extra.has_dense()) score = round(static_cast<double>(static_cast<Acc>(score) + static_cast<Acc>(extra_offset)));
      s[static_cast<std::size_t>(j)] = score;
      row_max = std::max(row_max, score);
      has_nan = has_nan || std::isnan(score);
    }
    // Fully masked (or every visible score -inf): P = 0, O = 0, LSE = -inf.
    if (row_max == kNegativeInfinity && !has_nan) continue;
    for (std::int64_t j = 0; j < rows_k; ++j) f.seen[static_cast<std::size_t>(r * rows_k + j)] = !hidden[static_cast<std::size_t>(j)];
    // P = softmax(S), LSE = m + log(sum).
    Acc sum = 0;
    for (std::int64_t j = 0; j < rows_k; ++j)
      sum += std::exp(static_cast<Acc>(s[static_cast<std::size_t>(j)]) - static_cast<Acc>(row_max));
    f.lse[static_cast<std::size_t>(r)] = row_max + std::log(static_cast<double>(sum));
    for (std::int64_t j = 0; j < rows_k; ++j)
      f.p[static_cast<std::size_t>(r * rows_k + j)] =
          round(static_cast<double>(std::exp(static_cast<Acc>(s[static_cast<std::size_t>(j)]) - static_cast<Acc>(row_max)) / sum));
    if (dropout.enabled()) {
      if (f.keep.empty()) f.keep.assign(static_cast<std::size_t>(rows_q * rows_k), 1);
      for (std::int64_t j = 0; j < rows_k; ++j) f.keep[static_cast<std::size_t>(r * rows_k + j)] = dropout.keep(dropout_head, i, j);
    }
    // O = P V over the visible keys only: a hidden key's NaN or Inf value must not
    // reach the row through 0 * NaN (the NaN rule of README.md). Dropout: (P ∘ Z) V / (1 − p),
    // a dropped visible key multiplied by 0 (so its NaN value still propagates, as on the GPU).
    for (std::int64_t d = 0; d < head_dim; ++d) {
      Acc acc = 0;
      for (std::int64_t j = mask.col_begin(i); j < mask.col_end(i); ++j) {
        if (hidden[static_cast<std::size_t>(j)]) continue;
        const bool kept = f.keep.empty() || f.keep[static_cast<std::size_t>(r * rows_k + j)];
        acc += static_cast<Acc>(kept ? f.p[static_cast<std::size_t>(r * rows_k + j)] : 0.0) * static_cast<Acc>(v[static_cast<std::size_t>(j * head_dim + d)]);
      }
      if (dropout.enabled()) acc *= inverse_keep;
      f.out[static_cast<std::size_t>(r * head_dim + d)] = round(static_cast<double>(acc));
    }
  }
  return f;
}

template <class Acc>
ReferenceResult forward_impl(const AttentionParams& params, const Rounding& round) {
  ReferenceResult result;
  result.total_q = params.total_q, result.heads_q = params.heads_q, result.head_dim = params.head_dim;
  result.out.assign(static_cast<std::size_t>(params.total_q * params.heads_q * params.head_dim), 0.0);
  result.lse.assign(static_cast<std::size_t>(params.total_q * params.heads_q), kNegativeInfinity);
  for (std::int64_t b = 0; b < params.batch; ++b) {
    const MaskRule mask = params.mask_of(b);
    for (std::int64_t h = 0; h < params.heads_q; ++h) {
      const std::int64_t h_kv = h / params.group_size;
      const auto q = load_rows(params.q, params.dtype, params.q_offset(b, h), params.q_row_stride, mask.seqlen_q, params.head_dim);
      const auto k = load_rows(params.k, params.dtype, params.k_offset(b, h_kv), params.k_row_stride, mask.seqlen_k, params.head_dim);
      const auto v = load_rows(params.v, params.dtype, params.v_offset(b, h_kv), params.v_row_stride, mask.seqlen_k, params.head_dim);
      const auto f = head_forward<Acc>(params, b, h, mask, q, k, v, mask.seqlen_q, 0, round);
      for (std::int64_t i = 0; i < mask.seqlen_q; ++i) {
        const std::int64_t row = dense_q_row(params, b, i);
        result.lse[static_cast<std::size_t>(row * params.heads_q + h)] = f.lse[static_cast<std::size_t>(i)];
        for (std::int64_t d = 0; d < params.head_dim; ++d)
          result.out[static_cast<std::size_t>((row * params.heads_q + h) * params.head_dim + d)] =
              f.out[static_cast<std::size_t>(i * params.head_dim + d)];
      }
    }
  }
  return result;
}

template <class Acc>
ReferenceGradients backward_impl(const BackwardParams& params, const Rounding& round) {
  ReferenceGradients g;
  const std::int64_t head_dim = params.head_dim;
  g.total_q = params.total_q, g.total_k = params.total_k, g.heads_q = params.heads_q, g.heads_kv = params.heads_kv;
  g.head_dim = head_dim;
  g.dq.assign(static_cast<std::size_t>(params.total_q * params.heads_q * head_dim), 0.0);
  g.dk.assign(static_cast<std::size_t>(params.total_k * params.heads_kv * head_dim), 0.0);
  g.dv.assign(static_cast<std::size_t>(params.total_k * params.heads_kv * head_dim), 0.0);
  const Acc scale = static_cast<Acc>(params.softmax_scale);
  const DbiasIndex dbias_index{{params.dbias_shape[0], params.dbias_shape[1], params.dbias_shape[2], params.dbias_shape[3]}};
  if (params.maybe_dbias) g.dbias.assign(static_cast<std::size_t>(dbias_index.size()), 0.0);
  for (std::int64_t b = 0; b < params.batch; ++b) {
    const MaskRule mask = params.mask_of(b);
    const std::int64_t rows_q = mask.seqlen_q, rows_k = mask.seqlen_k;
    for (std::int64_t h_kv = 0; h_kv < params.heads_kv; ++h_kv) {
      const auto k = load_rows(params.k, params.dtype, params.k_offset(b, h_kv), params.k_row_stride, rows_k, head_dim);
      const auto v = load_rows(params.v, params.dtype, params.v_offset(b, h_kv), params.v_row_stride, rows_k, head_dim);
      // dK, dV summed over the group's query heads, rounded once at the end.
      std::vector<Acc> dk(static_cast<std::size_t>(rows_k * head_dim), 0), dv(static_cast<std::size_t>(rows_k * head_dim), 0);
      for (std::int64_t h = h_kv * params.group_size; h < (h_kv + 1) * params.group_size; ++h) {
        const auto q = load_rows(params.q, params.dtype, params.q_offset(b, h), params.q_row_stride, rows_q, head_dim);
        const auto dout = load_rows(params.dout, params.dtype, params.dout_offset(b, h), params.dout_row_stride, rows_q, head_dim);
        const auto f = head_forward<Acc>(params, b, h, mask, q, k, v, rows_q, 0, round);
        const bool has_dropout = !f.keep.empty();
        const Acc inverse_keep = static_cast<Acc>(params.dropout_inverse_keep);
        std::vector<double> ds(static_cast<std::size_t>(rows_q * rows_k), 0.0);
        for (std::int64_t i = 0; i < rows_q; ++i) {
          // D_i = rowsum(dO ∘ O)
          Acc dot_do_o = 0;
          for (std::int64_t d = 0; d < head_dim; ++d)
            dot_do_o += static_cast<Acc>(dout[static_cast<std::size_t>(i * head_dim + d)]) * static_cast<Acc>(f.out[static_cast<std::size_t>(i * head_dim + d)]);
          const Acc delta = static_cast<Acc>(round(static_cast<double>(dot_do_o)));
          for (std::int64_t j = 0; j < rows_k; ++j) {
            // Hidden entries: dS = 0 exactly (whatever v, dout, D hold). Visible ones follow
            // IEEE, as the forward does (a NaN dP meets even a P of 0).
            if (!f.seen[static_cast<std::size_t>(i * rows_k + j)]) continue;
            const double p = f.p[static_cast<std::size_t>(i * rows_k + j)];
            // dP = dO V^T;  dS = P ∘ (dP - D)
            Acc dp = 0;
            for (std::int64_t d = 0; d < head_dim; ++d)
              dp += static_cast<Acc>(dout[static_cast<std::size_t>(i * head_dim + d)]) * static_cast<Acc>(v[static_cast<std::size_t>(j * head_dim + d)]);
            dp = static_cast<Acc>(round(static_cast<double>(dp)));
            // Dropout: dS = P ∘ (Z ∘ dP / (1 − p) − D).
            if (has_dropout) dp = f.keep[static_cast<std::size_t>(i * rows_k + j)] ? dp * inverse_keep : Acc(0);
            Acc value = static_cast<Acc>(p) * (dp - delta);
            // dBias = dS w.r.t. the score after the softcap, summed over broadcast dimensions.
            if (params.maybe_dbias) g.dbias[static_cast<std::size_t>(dbias_index.at(b, h, i, j))] += round(static_cast<double>(value));
            if (params.has_softcap()) {
              // d/dx [c tanh(x / c)] = 1 - tanh²(x / c)
              const Acc t = std::tanh(static_cast<Acc>(f.s_raw[static_cast<std::size_t>(i * rows_k + j)]) / static_cast<Acc>(params.softcap));
              value *= Acc(1) - t * t;
            }
            ds[static_cast<std::size_t>(i * rows_k + j)] = round(static_cast<double>(value));
          }
        }
        // dQ = dS K * scale (over the keys row i sees: a hidden key's NaN/Inf k stays out)
        for (std::int64_t i = 0; i < rows_q; ++i) {
          const std::int64_t row = dense_q_row(params, b, i);
          for (std::int64_t d = 0; d < head_dim; ++d) {
            Acc acc = 0;
            for (std::int64_t j = 0; j < rows_k; ++j)
              if (f.seen[static_cast<std::size_t>(i * rows_k + j)])
                acc += static_cast<Acc>(ds[static_cast<std::size_t>(i * rows_k + j)]) * static_cast<Acc>(k[static_cast<std::size_t>(j * head_dim + d)]);
            g.dq[static_cast<std::size_t>((row * params.heads_q + h) * head_dim + d)] = round(static_cast<double>(acc * scale));
          }
        }
        // dK += dS^T Q * scale;  dV += P^T dO (over the rows that see key j: a NaN/Inf q or
        // dout of a row that cannot see j stays out; a dropped visible entry is P·0, as in
        // the forward, so a NaN dout still propagates through it)
        for (std::int64_t j = 0; j < rows_k; ++j)
          for (std::int64_t d = 0; d < head_dim; ++d) {
            Acc acc_k = 0, acc_v = 0;
            for (std::int64_t i = 0; i < rows_q; ++i) {
              if (!f.seen[static_cast<std::size_t>(i * rows_k + j)]) continue;
              acc_k += static_cast<Acc>(ds[static_cast<std::size_t>(i * rows_k + j)]) * static_cast<Acc>(q[static_cast<std::size_t>(i * head_dim + d)]);
              const bool kept = !has_dropout || f.keep[static_cast<std::size_t>(i * rows_k + j)];
              acc_v += static_cast<Acc>(kept ? f.p[static_cast<std::size_t>(i * rows_k + j)] : 0.0) * static_cast<Acc>(dout[static_cast<std::size_t>(i * head_dim + d)]);
            }
            dk[static_cast<std::size_t>(j * head_dim + d)] += acc_k * scale;
            dv[static_cast<std::size_t>(j * head_dim + d)] += has_dropout ? acc_v * inverse_keep : acc_v;
          }
      }
      for (std::int64_t j = 0; j < rows_k; ++j) {
        const std::int64_t row = dense_k_row(params, b, j);
        for (std::int64_t d = 0; d < head_dim; ++d) {
          const auto index = static_cast<std::size_t>((row * params.heads_kv + h_kv) * head_dim + d);
          g.dk[index] = round(static_cast<double>(dk[static_cast<std::size_t>(j * head_dim + d)]));
          g.dv[index] = round(static_cast<double>(dv[static_cast<std::size_t>(j * head_dim + d)]));
        }
      }
    }
  }
  return g;
}

}  // namespace

ReferenceResult reference_forward(const AttentionParams& params) { return forward_impl<double>(params, Rounding{}); }

ReferenceResult naive_forward_in_precision(const AttentionParams& params, DType precision) {
  return forward_impl<float>(params, Rounding{false, precision});
}

double reference_forward_row(const AttentionParams& params, std::int64_t b, std::int64_t h, std::int64_t i, double* out_row) {
  const MaskRule mask = params.mask_of(b);
  const std::int64_t h_kv = h / params.group_size;
  const auto q = load_rows(params.q, params.dtype, params.q_offset(b, h) + i * params.q_row_stride, params.q_row_stride, 1, params.head_dim);
  const auto k = load_rows(params.k, params.dtype, params.k_offset(b, h_kv), params.k_row_stride, mask.seqlen_k, params.head_dim);
  const auto v = load_rows(params.v, params.dtype, params.v_offset(b, h_kv), params.v_row_stride, mask.seqlen_k, params.head_dim);
  const auto f = head_forward<double>(params, b, h, mask, q, k, v, 1, i, Rounding{});
  for (std::int64_t d = 0; d < params.head_dim; ++d) out_row[d] = f.out[static_cast<std::size_t>(d)];
  return f.lse[0];
}

ReferenceGradients reference_backward(const BackwardParams& params) { return backward_impl<double>(params, Rounding{}); }

ReferenceGradients naive_backward_in_precision(const BackwardParams& params, DType precision) {
  return backward_impl<float>(params, Rounding{false, precision});
}

void reference_forward_into(const AttentionParams& params) {
  const ReferenceResult result = reference_forward(params);
  for (std::int64_t b = 0; b < params.batch; ++b)
    for (std::int64_t h = 0; h < params.heads_q; ++h)
      for (std::int64_t i = 0; i < params.seqlen_q_of(b); ++i) {
        const std::int64_t row = dense_q_row(params, b, i);
        const std::int64_t out_index = params.out_offset(b, h) + i * params.out_row_stride;
        for (std::int64_t d = 0; d < params.head_dim; ++d)
          numeric::store_from_float(params.out, params.dtype, out_index + d, static_cast<float>(result.out_at(row, h, d)));
        if (params.maybe_lse) params.maybe_lse[params.lse_offset(b, h) + i * params.lse_row_stride] = static_cast<float>(result.lse_at(row, h));
      }
}

void reference_backward_into(const BackwardParams& params) {
  const ReferenceGradients g = reference_backward(params);
  if (params.maybe_dbias) store_dbias(params, g.dbias);
  for (std::int64_t b = 0; b < params.batch; ++b) {
    for (std::int64_t h = 0; h < params.heads_q; ++h)
      for (std::int64_t i = 0; i < params.seqlen_q_of(b); ++i) {
        const std::int64_t row = dense_q_row(params, b, i), index = params.dq_offset(b, h) + i * params.dq_row_stride;
        for (std::int64_t d = 0; d < params.head_dim; ++d)
          numeric::store_from_float(params.dq, params.dtype, index + d, static_cast<float>(g.dq_at(row, h, d)));
      }
    for (std::int64_t h_kv = 0; h_kv < params.heads_kv; ++h_kv)
      for (std::int64_t j = 0; j < params.seqlen_k_of(b); ++j) {
        const std::int64_t row = dense_k_row(params, b, j);
        const std::int64_t dk_index = params.dk_offset(b, h_kv) + j * params.dk_row_stride;
        const std::int64_t dv_index = params.dv_offset(b, h_kv) + j * params.dv_row_stride;
        for (std::int64_t d = 0; d < params.head_dim; ++d) {
          numeric::store_from_float(params.dk, params.dtype, dk_index + d, static_cast<float>(g.dk_at(row, h_kv, d)));
          numeric::store_from_float(params.dv, params.dtype, dv_index + d, static_cast<float>(g.dv_at(row, h_kv, d)));
        }
      }
  }
}

}  // namespace flashattn::cpu
