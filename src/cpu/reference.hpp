// src/cpu/reference.hpp — the oracle: standard three-step attention in float64.
//
//   S = Q K^T * scale          (softcap: S = softcap * tanh(S / softcap), ALiBi), masked by MaskRule;
//                              then + attn_mask bias, -inf where a boolean attn_mask or the block mask hides it
//   P = softmax(S)             (row-wise; a fully masked row gives P = 0, LSE = -inf)
//   O = P V
//
// S and P are materialised per (sequence, head); nothing is blocked or fused, so
// this is the definition every other path (CPU flash, CUDA) is checked against.
// Inputs are read through the params' strides and dtype (varlen-aware); these
// functions never write params.out / params.maybe_lse / dq / dk / dv.
//
// Result layout (dense, independent of the inputs' strides):
//   out   [total_q, heads_q, head_dim]   lse [total_q, heads_q] (natural log)
//   dq    [total_q, heads_q, head_dim]   dk, dv [total_k, heads_kv, head_dim]
// where the dense row of query i of sequence b is dense_q_row(params, b, i):
// b * seqlen_q + i for padded batches, cu_seqlens_q[b] + i for varlen (likewise
// for keys). params.total_q / total_k give the row counts in both cases.
#pragma once

#include <cstdint>
#include <vector>

#include "flashattn/tensor.hpp"
#include "src/core/params.hpp"

namespace flashattn::cpu {

inline std::int64_t dense_q_row(const AttentionParams& params, std::int64_t b, std::int64_t i) {
  return params.is_varlen() ? params.q_start(b) + i : b * params.seqlen_q + i;
}
inline std::int64_t dense_k_row(const AttentionParams& params, std::int64_t b, std::int64_t j) {
  return params.is_varlen() ? params.k_start(b) + j : b * params.seqlen_k + j;
}

struct ReferenceResult {
  std::int64_t total_q = 0, heads_q = 0, head_dim = 0;
  std::vector<double> out;  // [total_q, heads_q, head_dim]
  std::vector<double> lse;  // [total_q, heads_q], natural log, -inf for a fully masked row

  double out_at(std::int64_t row, std::int64_t h, std::int64_t d) const {
    return out[static_cast<std::size_t>((row * heads_q + h) * head_dim + d)];
  }
  double lse_at(std::int64_t row, std::int64_t h) const { return lse[static_cast<std::size_t>(row * heads_q + h)]; }
};

struct ReferenceGradients {
  std::int64_t total_q = 0, total_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  std::vector<double> dq;  // [total_q, heads_q, head_dim]
  std::vector<double> dk;  // [total_k, heads_kv, head_dim], summed over each GQA group
  std::vector<double> dv;  // [total_k, heads_kv, head_dim]
  std::vector<double> dbias;  // dense in dbias's shape [B|1, H|1, Sq|1, Sk|1] (when params.maybe_dbias)

  double dq_at(std::int64_t row, std::int64_t h, std::int64_t d) const {
    return dq[static_cast<std::size_t>((row * heads_q + h) * head_dim + d)];
  }
  double dk_at(std::int64_t row, std::int64_t h_kv, std::int64_t d) const {
    return dk[static_cast<std::size_t>((row * heads_kv + h_kv) * head_dim + d)];
  }
  double dv_at(std::int64_t row, std::int64_t h_kv, std::int64_t d) const {
    return dv[static_cast<std::size_t>((row * heads_kv + h_kv) * head_dim + d)];
  }
};

// The float64 oracle.
ReferenceResult reference_forward(const AttentionParams& params);

// One query row (sequence b, head h, row i) of the oracle, for spot checks of big
// problems: writes head_dim values to out_row and returns the natural-log LSE.
double reference_forward_row(const AttentionParams& params, std::int64_t b, std::int64_t h, std::int64_t i,
                             double* out_row);

// The same three steps computed the way a framework does them in the input
// precision: products accumulated in float32, and every materialised intermediate
// (each score, each probability, each output) rounded to `precision` — the
// "out_lowprec_ref" of the tolerance rule in STYLE.md:
//   max|out - ref64| <= 2 * max|out_lowprec_ref - ref64| + floor.
// Values are returned as float64 in the ReferenceResult layout.
ReferenceResult naive_forward_in_precision(const AttentionParams& params, DType precision);

// Gradients of the oracle given params.dout, recomputed from q, k, v in float64
// (params.out and params.lse are not read: the exact O and LSE are used):
//   D  = rowsum(dO ∘ O),  dV = P^T dO,  dP = dO V^T,  dS = P ∘ (dP - D)
//   (softcap: dS *= 1 - tanh²(S_raw / softcap)),  dQ = dS K * scale,  dK = dS^T Q * scale
ReferenceGradients reference_backward(const BackwardParams& params);

// The backward counterpart of naive_forward_in_precision: every intermediate
// rounded to `precision` (the low-precision reference for the 3x gradient rule).
ReferenceGradients naive_backward_in_precision(const BackwardParams& params, DType precision);

// Algorithm::reference through flashattn::forward() / backward(): the float64 results
// rounded to the output dtype (and the LSE written when requested).
void reference_forward_into(const AttentionParams& params);
void reference_backward_into(const BackwardParams& params);

}  // namespace flashattn::cpu
