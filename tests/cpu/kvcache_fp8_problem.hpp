// tests/cpu/kvcache_fp8_problem.hpp — a decoding problem over an FP8 (e4m3) KV cache:
// DecodeProblem's 16-bit problem with its cache quantised by float8::quantize_e4m3 under
// per-(sequence, kv head) or per-tensor descales, and its oracles — the exact bytes an
// append must write, and the float64 attention over the dequantised cache
// (key = k_descale * decode(byte)). Shared by the CPU and CUDA FP8 KV-cache tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "src/core/float8.hpp"
#include "tests/cpu/kvcache_problem.hpp"

namespace flashattn::testing {

struct Fp8DecodeShape {
  DecodeShape base;  // dtype: q's (float16 or bfloat16); softcap and causal are in the reference, window/ALiBi are not
  enum class Descale { none, per_tensor, per_head };
  Descale descale = Descale::per_head;
  bool fp8_new = false;  // k_new/v_new given in e4m3 (copied) rather than q's dtype (quantised)

  std::string describe() const {
    const char* d = descale == Descale::none ? " descale(none)" : (descale == Descale::per_tensor ? " descale(tensor)" : " descale(b,h)");
    return "fp8 " + base.describe() + d + (fp8_new ? " new(e4m3)" : "");
  }
};
inline void PrintTo(const Fp8DecodeShape& shape, std::ostream* os) { *os << shape.describe(); }

class Fp8DecodeProblem {
 public:
  explicit Fp8DecodeProblem(Fp8DecodeShape shape, std::uint64_t seed = 1) : shape_(std::move(shape)), base(shape_.base, seed) {
    const auto& s = base.shape();
    base.snapshot();  // dense() reads the 16-bit cache snapshot for q's rotation only
    // Descales near amax / 448 for N(0, 1) data (values past ~4 saturate: exercised).
    std::mt19937_64 rng(seed * 13 + 7);
    std::uniform_real_distribution<float> spread(0.5f, 1.5f);
    const bool per_tensor = shape_.descale == Fp8DecodeShape::Descale::per_tensor;
    k_descale = HostTensor(DType::float32, per_tensor ? std::vector<std::int64_t>{1, 1} : std::vector<std::int64_t>{s.batch, s.heads_kv});
    v_descale = HostTensor(DType::float32, k_descale.shape());
    for (std::int64_t i = 0; i < k_descale.numel(); ++i) {
      k_descale.set(i, 4.0f / 448.0f * spread(rng));
      v_descale.set(i, 4.0f / 448.0f * spread(rng));
    }
    // The FP8 caches: NaN (0x7f) everywhere a read must not reach, quantised values at
    // every cached position.
    k_cache = HostTensor(DType::float8_e4m3, base.k_cache.shape());
    v_cache = HostTensor(DType::float8_e4m3, base.v_cache.shape());
    fill_bytes(k_cache, float8::kE4m3NanBits);
    fill_bytes(v_cache, float8::kE4m3NanBits);
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t pos = 0; pos < s.cache_seqlens[static_cast<std::size_t>(b)]; ++pos)
        for (std::int64_t h = 0; h < s.heads_kv; ++h)
          for (std::int64_t d = 0; d < s.head_dim; ++d) {
            const std::int64_t i = base.cache_index(b, pos, h) + d;
            bytes(k_cache)[i] = float8::quantize_e4m3(base.k_cache.get(i), descale_of(k_descale, b, h));
            bytes(v_cache)[i] = float8::quantize_e4m3(base.v_cache.get(i), descale_of(v_descale, b, h));
          }
    if (s.seqlen_new > 0 && shape_.fp8_new) {
      k_new = HostTensor(DType::float8_e4m3, base.k_new.shape());
      v_new = HostTensor(DType::float8_e4m3, base.v_new.shape());
      for (std::int64_t b = 0; b < s.batch; ++b)
        for (std::int64_t j = 0; j < s.seqlen_new; ++j)
          for (std::int64_t h = 0; h < s.heads_kv; ++h)
            for (std::int64_t d = 0; d < s.head_dim; ++d) {
              const std::int64_t i = ((b * s.seqlen_new + j) * s.heads_kv + h) * s.head_dim + d;
              bytes(k_new)[i] = float8::quantize_e4m3(base.k_new.get(i), descale_of(k_descale, b, h));
              bytes(v_new)[i] = float8::quantize_e4m3(base.v_new.get(i), descale_of(v_descale, b, h));
            }
    }
    k_cache_initial = k_cache;
    v_cache_initial = v_cache;
  }

  const Fp8DecodeShape& shape() const { return shape_; }

  KVCacheArgs args() {
    KVCacheArgs a = base.args();
    a.k_cache = k_cache.view();
    a.v_cache = v_cache.view();
    if (shape_.fp8_new && base.shape().seqlen_new > 0) a.maybe_k_new = k_new.view(), a.maybe_v_new = v_new.view();
    if (shape_.descale != Fp8DecodeShape::Descale::none) {
      a.options.maybe_k_descale = k_descale.view();
      a.options.maybe_v_descale = v_descale.view();
    }
    return a;
  }

  float k_descale_of(std::int64_t b, std::int64_t h) const { return descale_of(k_descale, b, h); }
  float v_descale_of(std::int64_t b, std::int64_t h) const { return descale_of(v_descale, b, h); }

  // The bytes the append must write at new row j of (b, h): e4m3 rows as given; rows in
  // q's dtype quantised after the rotary (computed in float64 here, in float32 by the
  // library: the rounded key may be one unit of q's dtype apart, so rotated keys are
  // compared to one e4m3 code, unrotated ones bitwise).
  std::uint8_t expected_new_byte(bool is_key, std::int64_t b, std::int64_t j, std::int64_t h, std::int64_t d) const {
    const auto& s = base.shape();
    const std::int64_t i = ((b * s.seqlen_new + j) * s.heads_kv + h) * s.head_dim + d;
    if (shape_.fp8_new) return is_key ? bytes(k_new)[i] : bytes(v_new)[i];
    if (!is_key) return float8::quantize_e4m3(base.v_new.get(i), descale_of(v_descale, b, h));
    const float key = static_cast<float>(base.expected_new_key(b, j, h)[static_cast<std::size_t>(d)]);
    return float8::quantize_e4m3(key, descale_of(k_descale, b, h));
  }

  // After a run: the appended slots hold the expected bytes, every other byte is unchanged.
  void expect_append_exact(const std::string& label) const {
    const auto& s = base.shape();
    HostTensor k_expected = k_cache_initial, v_expected = v_cache_initial;
    int off_by_one = 0, wrong = 0;
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t j = 0; j < s.seqlen_new; ++j)
        for (std::int64_t h = 0; h < s.heads_kv; ++h)
          for (std::int64_t d = 0; d < s.head_dim; ++d) {
            const std::int64_t i = base.cache_index(b, s.cache_seqlens[static_cast<std::size_t>(b)] + j, h) + d;
            const std::uint8_t key = expected_new_byte(true, b, j, h, d), got = bytes(k_cache)[i];
            const bool is_rotated = !shape_.fp8_new && d < s.rotary_dim;
            if (got != key) {
              // Same sign, adjacent codes: adjacent e4m3 values.
              const bool adjacent = ((got ^ key) & 0x80) == 0 && std::abs(static_cast<int>(got & 0x7f) - static_cast<int>(key & 0x7f)) == 1;
              (is_rotated && adjacent ? off_by_one : wrong) += 1;
            }
            bytes(k_expected)[i] = is_rotated ? got : key;
            bytes(v_expected)[i] = expected_new_byte(false, b, j, h, d);
          }
    EXPECT_EQ(wrong, 0) << label << " (appended key bytes)";
    EXPECT_LE(off_by_one, std::max<std::int64_t>(2, s.batch * s.seqlen_new * s.heads_kv * s.rotary_dim / 50)) << label << " (rotated keys one code apart)";
    EXPECT_TRUE(k_cache.bitwise_equal(k_expected)) << label << " (k_cache: appended bytes, nothing else)";
    EXPECT_TRUE(v_cache.bitwise_equal(v_expected)) << label << " (v_cache: appended bytes, nothing else)";
  }

  // The float64 attention over the dequantised cache as it is now (after the append):
  // out (batch, seqlen_q, heads_q, head_dim) and LSE (batch, heads_q, seqlen_q).
  void reference(std::vector<double>& out, std::vector<double>& lse) const {
    const auto& s = base.shape();
    const DecodeProblem::Dense dense = base.dense();  // q rotated and rounded like the library's
    const std::int64_t group = s.heads_q / s.heads_kv;
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    out.assign(static_cast<std::size_t>(s.batch * s.seqlen_q * s.heads_q * s.head_dim), 0.0);
    lse.assign(static_cast<std::size_t>(s.batch * s.heads_q * s.seqlen_q), -std::numeric_limits<double>::infinity());
    for (std::int64_t b = 0; b < s.batch; ++b) {
      const std::int64_t pad = s.leftpad.empty() ? 0 : s.leftpad[static_cast<std::size_t>(b)];
      const std::int64_t seqlen_k = s.cache_seqlens[static_cast<std::size_t>(b)] + s.seqlen_new - pad;
      for (std::int64_t i = 0; i < s.seqlen_q; ++i)
        for (std::int64_t h = 0; h < s.heads_q; ++h) {
          const std::int64_t h_kv = h / group;
          const double kd = descale_of(k_descale, b, h_kv), vd = descale_of(v_descale, b, h_kv);
          // Bottom-right causal: query row i sees keys j <= i + seqlen_k - seqlen_q.
          const std::int64_t end = s.causal ? std::min(seqlen_k, i + seqlen_k - s.seqlen_q + 1) : seqlen_k;
          std::vector<double> scores;
          double max = -std::numeric_limits<double>::infinity();
          for (std::int64_t j = 0; j < end; ++j) {
            const std::int64_t k_base = base.cache_index(b, pad + j, h_kv);
            double dot = 0.0;
            for (std::int64_t d = 0; d < s.head_dim; ++d)
              dot += dense.q.get(((b * s.seqlen_q + i) * s.heads_q + h) * s.head_dim + d) * kd * float8::decode_e4m3(bytes(k_cache)[k_base + d]);
            const double score = dot * scale;
            scores.push_back(s.softcap > 0 ? s.softcap * std::tanh(score / s.softcap) : score);
            max = std::max(max, scores.back());
          }
          if (scores.empty()) continue;  // no keys: out 0, LSE -inf
          double sum = 0.0;
          std::vector<double> acc(static_cast<std::size_t>(s.head_dim), 0.0);
          for (std::int64_t j = 0; j < end; ++j) {
            const double p = std::exp(scores[static_cast<std::size_t>(j)] - max);
            sum += p;
            const std::int64_t v_base = base.cache_index(b, pad + j, h_kv);
            for (std::int64_t d = 0; d < s.head_dim; ++d) acc[static_cast<std::size_t>(d)] += p * vd * float8::decode_e4m3(bytes(v_cache)[v_base + d]);
          }
          for (std::int64_t d = 0; d < s.head_dim; ++d)
            out[static_cast<std::size_t>(((b * s.seqlen_q + i) * s.heads_q + h) * s.head_dim + d)] = acc[static_cast<std::size_t>(d)] / sum;
          lse[static_cast<std::size_t>((b * s.heads_q + h) * s.seqlen_q + i)] = max + std::log(sum);
        }
    }
  }

  // out/LSE against reference(): |out - ref| <= relative * |ref| + absolute per element,
  // |lse - ref| <= lse_tolerance (both -inf for a row without keys).
  void expect_matches_reference(double relative, double absolute, double lse_tolerance, const std::string& label) const {
    std::vector<double> ref_out, ref_lse;
    reference(ref_out, ref_lse);
    double worst_out = 0.0, worst_lse = 0.0;
    bool finite = true;
    for (std::size_t e = 0; e < ref_out.size(); ++e) {
      const double got = base.out.get(static_cast<std::int64_t>(e));
      if (!std::isfinite(got)) finite = false;
      worst_out = std::max(worst_out, std::abs(got - ref_out[e]) - relative * std::abs(ref_out[e]));
    }
    for (std::size_t r = 0; r < ref_lse.size(); ++r) {
      const double got = base.lse.get(static_cast<std::int64_t>(r));
      if (std::isinf(ref_lse[r])) {
        if (got != ref_lse[r]) worst_lse = INFINITY;
        continue;
      }
      worst_lse = std::max(worst_lse, std::isfinite(got) ? std::abs(got - ref_lse[r]) : INFINITY);
    }
    EXPECT_TRUE(finite) << label << " (out not finite)";
    EXPECT_LE(worst_out, absolute) << label << " (out, beyond " << relative << " * |ref|)";
    EXPECT_LE(worst_lse, lse_tolerance) << label << " (lse)";
  }

  static std::uint8_t* bytes(HostTensor& t) { return static_cast<std::uint8_t*>(t.data()); }
  static const std::uint8_t* bytes(const HostTensor& t) { return static_cast<const std::uint8_t*>(t.data()); }
  static void fill_bytes(HostTensor& t, std::uint8_t value) { std::fill(bytes(t), bytes(t) + t.numel(), value); }

 private:
  float descale_of(const HostTensor& t, std::int64_t b, std::int64_t h) const {
    if (shape_.descale == Fp8DecodeShape::Descale::none) return 1.0f;
    return t.shape()[0] == 1 ? t.get(0) : t.get(b * t.shape()[1] + h);
  }

  Fp8DecodeShape shape_;

 public:
  DecodeProblem base;  // q, lengths, tables, 16-bit k_new/v_new, out and LSE
  HostTensor k_cache, v_cache, k_new, v_new, k_descale, v_descale;
  HostTensor k_cache_initial, v_cache_initial;
};

}  // namespace flashattn::testing
