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

// Factor for rescaling a running sum/accumulator when the max moves m_old -> m_new
// (m_new >= m_old). From an empty row (m_old = -inf) it is 0: nothing to rescale.
template <class T>
FLASHATTN_HOST_DEVICE T rescale_factor(T m_old, T m_new) {
  return exp2_of(m_old - safe_max(m_new));
}

// Running statistics of one row, log2 domain: m = max score, l = sum of exp2(s - m).
template <class T>
struct State {
  T m = negative_infinity<T>();
  T l = T(0);

  // Raise the max to include a new block's max; returns the factor by which the
  // caller must scale its unnormalised accumulator (and which was applied to l).
  FLASHATTN_HOST_DEVICE T raise_max(T block_max) {
    const T m_new = block_max > m ? block_max : m;
    const T factor = rescale_factor(m, m_new);
    l *= factor;
    m = m_new;
    return factor;
  }
  // The exponent base to use for the current block's terms exp2(s - base).
  FLASHATTN_HOST_DEVICE T base() const { return safe_max(m); }
  FLASHATTN_HOST_DEVICE void add(T block_sum) { l += block_sum; }
  // l is a sum of exp2 terms, so >= 0 or NaN; a NaN row (a NaN or +inf score) is not
  // empty: its output and LSE stay NaN rather than a finite 0 with LSE -inf.
  FLASHATTN_HOST_DEVICE bool empty() const { return l == T(0); }
  // 1/l for the single delayed normalisation; 0 for an empty row so its output is 0.
  FLASHATTN_HOST_DEVICE T inverse_sum() const { return empty() ? T(0) : T(1) / l; }
  // Natural-log LSE of the row: (m + log2 l) * ln 2; -inf for an empty row.
  FLASHATTN_HOST_DEVICE T lse() const {
    return empty() ? negative_infinity<T>() : (m + std::log2(l)) * T(kLn2);
  }
};

// Merge two unnormalised states (e.g. two key blocks of one row). The caller scales
// its accumulators by *factor_a and *factor_b and adds them.
template <class T>
FLASHATTN_HOST_DEVICE State<T> merge(const State<T>& a, const State<T>& b, T* factor_a, T* factor_b) {
  State<T> out;
  out.m = a.m > b.m ? a.m : b.m;
  *factor_a = rescale_factor(a.m, out.m);
  *factor_b = rescale_factor(b.m, out.m);
  out.l = a.l * *factor_a + b.l * *factor_b;
  return out;
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
