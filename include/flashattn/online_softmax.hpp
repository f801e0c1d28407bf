// flashattn/online_softmax.hpp — the online-softmax state and its merge, free of
// any hardware detail. The CPU backend, the CUDA kernels, the split-KV combine and
// merge_attention_states() all use these functions, so there is one definition of
// the rescaling rule and of its -inf corner cases.
//
// Notation (seeds 000/003): for a row x split into blocks x1, x2,
//   m  = max(m1, m2)
//   l  = e^(m1 - m) l1 + e^(m2 - m) l2
//   o  = (e^(m1 - m) l1 o1 + e^(m2 - m) l2 o2) / l       (normalised outputs)
// Worked example: x = [1,3 | 2,4 | 3,2] gives m = 4, l = e^-3+e^-1+e^-2+1+e^-1+e^-2.
//
// The kernels keep m in log2 units (scores pre-multiplied by scale*log2(e)) so each
// exponential is one exp2; Lse values crossing the API are natural logs.
#pragma once

#include <cmath>
#include <limits>

#include "flashattn/config.hpp"

namespace flashattn::online_softmax {

inline constexpr double kLog2e = 1.4426950408889634074;
inline constexpr double kLn2 = 0.6931471805599453094;

template <class T>
FLASHATTN_HOST_DEVICE T negative_infinity() {
  return -std::numeric_limits<T>::infinity();
}

// The exponent base for a row whose running max is m. A row that has seen only
// masked scores has m = -inf, and exp2(s - m) would compute (-inf) - (-inf) = NaN;
// using 0 instead makes every term exp2(-inf) = 0, so the row stays empty.
template <class T>
FLASHATTN_HOST_DEVICE T safe_max(T m) {
  return m == negative_infinity<T>() ? T(0) : m;
}

template <class T>
FLASHATTN_HOST_DEVICE T exp2_of(T x) {
  return std::exp2(x);
}

// The arithmetic the rules below are computed with: a policy of three functions.
// ExactMath (the default) is the C++ library's, for the host, the reference and every
// caller that wants the accurate routines; a kernel passes the special-function unit's
// (cuda::SfuMath in src/cuda/common/sfu_math.cuh: ex2.approx.ftz, lg2.approx, rcp.rn),
// so its fast path and the host rules are one definition with two exponentials.
struct ExactMath {
  template <class T>
  FLASHATTN_HOST_DEVICE static T exp2(T x) {
    return exp2_of(x);
  }
  template <class T>
  FLASHATTN_HOST_DEVICE static T log2(T x) {
    return std::log2(x);
  }
  template <class T>
  FLASHATTN_HOST_DEVICE static T reciprocal(T x) {
    return T(1) / x;
  }
};

// Factor for rescaling a running sum/accumulator when the max moves m_old -> m_new
// (m_new >= m_old). From an empty row (m_old = -inf) it is 0: nothing to rescale.
// Also the weight 2^(x - m) of a partial whose log2-LSE is x in a total of log2-LSE m.
template <class Math = ExactMath, class T>
FLASHATTN_HOST_DEVICE T rescale_factor(T m_old, T m_new) {
  return Math::exp2(m_old - safe_max(m_new));
}

// Running statistics of one row, log2 domain: m = max score, l = sum of exp2(s - m).
// Math: how exp2 (and, at the end, log2 and 1/l) are computed — see ExactMath.
template <class T, class Math = ExactMath>
struct State {
  T m = negative_infinity<T>();
  T l = T(0);

  // Raise the max to include a new block's max; returns the factor by which the
  // caller must scale its unnormalised accumulator (and which was applied to l).
  FLASHATTN_HOST_DEVICE T raise_max(T block_max) {
    const T m_new = block_max > m ? block_max : m;
    const T factor = rescale_factor<Math>(m, m_new);
    l *= factor;
    m = m_new;
    return factor;
  }
  // The exponent base to use for the current block's terms exp2(s - base).
  FLASHATTN_HOST_DEVICE T base() const { return safe_max(m); }
  // The block's term exp2(s - base()) of a score s (log2 units): the unnormalised P.
  FLASHATTN_HOST_DEVICE T term(T s) const { return Math::exp2(s - base()); }
  FLASHATTN_HOST_DEVICE void add(T block_sum) { l += block_sum; }
  // l is a sum of exp2 terms, so >= 0 or NaN; a NaN row (a NaN or +inf score) is not
  // empty: its output and LSE stay NaN rather than a finite 0 with LSE -inf.
  FLASHATTN_HOST_DEVICE bool empty() const { return l == T(0); }
  // output_scale / l for the single delayed normalisation (output_scale: a factor the
  // output carries, e.g. dropout's 1/(1 - p) or an FP8 V descale; 1 by default); 0 for
  // an empty row so its output is 0.
  FLASHATTN_HOST_DEVICE T inverse_sum(T output_scale = T(1)) const {
    return empty() ? T(0) : output_scale * Math::reciprocal(l);
  }
  // Natural-log LSE of the row: (m + log2 l) * ln 2; -inf for an empty row.
  FLASHATTN_HOST_DEVICE T lse() const {
    return empty() ? negative_infinity<T>() : (m + Math::log2(l)) * T(kLn2);
  }
};

// Merge two unnormalised states (e.g. two key blocks of one row). The caller scales
// its accumulators by *factor_a and *factor_b and adds them.
template <class T, class Math>
FLASHATTN_HOST_DEVICE State<T, Math> merge(const State<T, Math>& a, const State<T, Math>& b, T* factor_a, T* factor_b) {
  State<T, Math> out;
  out.m = a.m > b.m ? a.m : b.m;
  *factor_a = rescale_factor<Math>(a.m, out.m);
  *factor_b = rescale_factor<Math>(b.m, out.m);
  out.l = a.l * *factor_a + b.l * *factor_b;
  return out;
}

// log(sum_s e^lse_s) of N natural-log LSEs (the N-way form of merge_weights' lse, for
// merging N normalised partials at once); -inf when all are -inf, never NaN.
template <class Math = ExactMath, class T, int N>
FLASHATTN_HOST_DEVICE T lse_of(const T (&lse)[N]) {
  T m = lse[0];
  for (int s = 1; s < N; ++s) m = lse[s] > m ? lse[s] : m;
  if (m == negative_infinity<T>()) return m;
  T sum = T(0);
  for (int s = 0; s < N; ++s) sum += Math::exp2((lse[s] - m) * T(kLog2e));
  return m + Math::log2(sum) * T(kLn2);
}

// Weights for merging two *normalised* partial outputs by their natural-log LSEs:
// out = weight_a * out_a + weight_b * out_b, lse = log(e^lse_a + e^lse_b).
// Both -inf (no key seen by either part): weights 0, lse -inf — never NaN. A NaN LSE
// (a row that met a NaN or +inf score) gives NaN weights and a NaN lse.
template <class T>
struct MergeWeights {
  T weight_a;
  T weight_b;
  T lse;
};

template <class T>
FLASHATTN_HOST_DEVICE MergeWeights<T> merge_weights(T lse_a, T lse_b) {
  const T m = lse_a > lse_b ? lse_a : lse_b;
  // Both -inf (lse_a == lse_b): an empty row. A NaN part (a NaN row) fails the
  // equality and propagates NaN through the weights.
  if (m == negative_infinity<T>() && lse_a == lse_b) return {T(0), T(0), negative_infinity<T>()};
  const T ea = std::exp(lse_a - m);
  const T eb = std::exp(lse_b - m);
  const T sum = ea + eb;
  return {ea / sum, eb / sum, m + std::log(sum)};
}

}  // namespace flashattn::online_softmax
