// tests/cpu/test_fp8.cpp — FP8 (float8_e4m3) attention on the CPU: the e4m3 codec
// against a float64 decode of all 256 codes and PyTorch's rounding rule, quantize_fp8
// (descales, rounding, incoherent processing), the FP8 forward against the float64
// reference on the dequantised inputs, issue 16's accuracy goal, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "flashattn/fp8.hpp"
#include "src/core/numeric.hpp"

namespace flashattn {
namespace {

using numeric::float8_e4m3_to_float;
using numeric::float_to_float8_e4m3;

// The definition: (-1)^s * 2^(e-7) * (1 + m/8), subnormals 2^-6 * m/8, S.1111.111 NaN.
double decode_e4m3_float64(int code) {
  const int sign = code >> 7, exponent = (code >> 3) & 15, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, -6) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

TEST(E4M3, DecodesAll256CodesExactly) {
  for (int code = 0; code < 256; ++code) {
    const double expected = decode_e4m3_float64(code);
    const float got = float8_e4m3_to_float(static_cast<std::uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << code;
    } else {
      EXPECT_EQ(static_cast<double>(got), expected) << "code " << code;
      EXPECT_EQ(std::signbit(got), code >= 128) << "code " << code;
    }
  }
  EXPECT_EQ(float8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(float8_e4m3_to_float(0x01), 0x1p-9f);
}

TEST(E4M3, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code)
    if ((code & 0x7f) != 0x7f) EXPECT_EQ(float_to_float8_e4m3(float8_e4m3_to_float(static_cast<std::uint8_t>(code))), code) << code;
}

// Nearest code by brute force, ties to the even code; past 448 PyTorch's rule (NaN
// beyond the 448/480 midpoint 464) — c10's fp8e4m3fn_from_fp32_value does not saturate.
std::uint8_t nearest_code(float x) {
  const double v = x;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(v) || std::fabs(v) > 464.0) return sign | 0x7f;
  int best = 0;
  double best_distance = INFINITY;
  for (int code = 0; code < 0x7f; ++code) {
    const double distance = std::fabs(std::fabs(v) - decode_e4m3_float64(code));
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) best = code, best_distance = distance;
  }
  return static_cast<std::uint8_t>(sign | best);
}

TEST(E4M3, RoundsToNearestEvenLikePyTorch) {
  std::vector<float> values = {0.0f, -0.0f, 448.0f, 464.0f, std::nextafter(464.0f, 0.0f), std::nextafter(464.0f, 1000.0f),
                               479.0f, 480.0f, 1e30f, INFINITY, -INFINITY, NAN, 0x1p-10f, std::nextafter(0x1p-10f, 1.0f),
                               0x1.8p-9f, 0x1.4p-9f, 0x1.Cp-7f, -0.7265625f, 1.0625f, 1.1875f};
  // Every midpoint between neighbouring codes and its two float neighbours.
  for (int code = 0; code < 0x7e; ++code) {
    const float mid = static_cast<float>((decode_e4m3_float64(code) + decode_e4m3_float64(code + 1)) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)}) values.push_back(x), values.push_back(-x);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-12.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) values.push_back((i % 2 ? -1.0f : 1.0f) * std::exp2(exponent(rng)));
  for (const float x : values) EXPECT_EQ(float_to_float8_e4m3(x), nearest_code(x)) << "x = " << x;
  EXPECT_EQ(float_to_float8_e4m3(464.0f), 0x7e);  // the tie goes to even 448
  EXPECT_EQ(float_to_float8_e4m3(470.0f), 0x7f);  // PyTorch: NaN, not saturated
  EXPECT_EQ(float_to_float8_e4m3(-INFINITY), 0xff);
}

// --- helpers -------------------------------------------------------------------

struct Bf16Tensor {
  std::vector<std::uint16_t> data;
  explicit Bf16Tensor(std::size_t n) : data(n, 0x7fc1) {}  // canary: a NaN
};

std::vector<float> gaussian(std::size_t n, std::uint32_t seed, double outlier_probability = 0.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f), outlier(0.0f, 10.0f);  // N(0, 100): standard deviation 10
  std::bernoulli_distribution is_outlier(outlier_probability);
  std::vector<float> x(n);
  for (auto& value : x) value = normal(rng) + (outlier_probability > 0.0 && is_outlier(rng) ? outlier(rng) : 0.0f);
  return x;
}

struct Quantised {
  std::vector<std::uint8_t> codes;
  std::vector<float> descale;  // [batch, groups]
};

Quantised quantise(std::vector<float>& x, std::int64_t batch, std::int64_t seqlen, std::int64_t heads, std::int64_t head_dim,
                   std::int64_t groups, QuantizeFp8Options options = {}) {
  Quantised q;
  q.codes.resize(x.size());
  q.descale.assign(static_cast<std::size_t>(batch * groups), -1.0f);
  quantize_fp8(TensorView::contiguous(x.data(), DType::float32, {batch, seqlen, heads, head_dim}),
               TensorView::contiguous(q.codes.data(), DType::float8_e4m3, {batch, seqlen, heads, head_dim}),
               TensorView::contiguous(q.descale.data(), DType::float32, {batch, groups}), options);
  return q;
}

// descale * decoded code, for the heads of each (batch, group).
std::vector<float> dequantise(const Quantised& q, std::int64_t batch, std::int64_t seqlen, std::int64_t heads, std::int64_t head_dim,
                              std::int64_t groups) {
  std::vector<float> x(q.codes.size());
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < seqlen; ++i)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t d = 0; d < head_dim; ++d) {
          const std::size_t at = static_cast<std::size_t>(((b * seqlen + i) * heads + h) * head_dim + d);
          x[at] = float8_e4m3_to_float(q.codes[at]) * q.descale[static_cast<std::size_t>(b * groups + h / (heads / groups))];
        }
  return x;
}

// --- quantize_fp8 ----------------------------------------------------------------

TEST(QuantizeFp8, DescaleIsAmaxOver448AndEveryElementIsRoundedToNearest) {
  const std::int64_t batch = 2, seqlen = 37, heads = 4, head_dim = 24, groups = 2;
  std::vector<float> x = gaussian(static_cast<std::size_t>(batch * seqlen * heads * head_dim), 3, 0.01);
  const Quantised q = quantise(x, batch, seqlen, heads, head_dim, groups);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t g = 0; g < groups; ++g) {
      float amax = 0.0f;
      for (std::int64_t i = 0; i < seqlen; ++i)
        for (std::int64_t h = g * 2; h < g * 2 + 2; ++h)
          for (std::int64_t d = 0; d < head_dim; ++d) amax = std::fmax(amax, std::fabs(x[static_cast<std::size_t>(((b * seqlen + i) * heads + h) * head_dim + d)]));
      const float descale = q.descale[static_cast<std::size_t>(b * groups + g)];
      EXPECT_EQ(descale, amax / 448.0f);
      for (std::int64_t i = 0; i < seqlen; ++i)
        for (std::int64_t h = g * 2; h < g * 2 + 2; ++h)
          for (std::int64_t d = 0; d < head_dim; ++d) {
            const std::size_t at = static_cast<std::size_t>(((b * seqlen + i) * heads + h) * head_dim + d);
            EXPECT_EQ(q.codes[at], nearest_code(x[at] / descale)) << at;
          }
    }
}

TEST(QuantizeFp8, ZeroGroupGetsDescaleOne) {
  std::vector<float> x(2 * 3 * 2 * 32, 0.0f);
  x[0] = 1.0f;  // batch 0 only
  const Quantised q = quantise(x, 2, 3, 2, 32, 1);
  EXPECT_EQ(q.descale[0], 1.0f / 448.0f);
  EXPECT_EQ(q.descale[1], 1.0f);
  EXPECT_EQ(q.codes[0], 0x7e);
}

// R = H diag(s) / sqrt(d) is orthogonal: dequantised rotated q and k give the same dot
// products as the originals (up to the quantisation), and applying R^T recovers x.
TEST(QuantizeFp8, IncoherentRotationIsOrthogonal) {
  for (const std::int64_t head_dim : {32, 64, 128, 256}) {
    std::vector<float> x = gaussian(static_cast<std::size_t>(3 * head_dim), 11);
    std::vector<float> y = x;
    QuantizeFp8Options options{true, 42};
    Quantised q = quantise(y, 1, 3, 1, head_dim, 1, options);
    const std::vector<float> rotated = dequantise(q, 1, 3, 1, head_dim, 1);
    // x R R^T: undo the signs, then H / sqrt(d) again (H is symmetric, H H = d I).
    for (std::int64_t row = 0; row < 3; ++row) {
      std::vector<double> back(static_cast<std::size_t>(head_dim), 0.0);
      for (std::int64_t i = 0; i < head_dim; ++i)
        for (std::int64_t j = 0; j < head_dim; ++j) {
          const double h = (__builtin_popcountll(static_cast<unsigned long long>(i & j)) & 1) ? -1.0 : 1.0;
          back[static_cast<std::size_t>(i)] += h * rotated[static_cast<std::size_t>(row * head_dim + j)] * hadamard_sign(42, j);
        }
      double error = 0.0, norm = 0.0;
      for (std::int64_t i = 0; i < head_dim; ++i) {
        const double value = back[static_cast<std::size_t>(i)] / std::sqrt(static_cast<double>(head_dim));
        error += std::pow(value - x[static_cast<std::size_t>(row * head_dim + i)], 2);
        norm += std::pow(x[static_cast<std::size_t>(row * head_dim + i)], 2);
      }
      EXPECT_LT(std::sqrt(error / norm), 0.04) << "head_dim " << head_dim;  // e4m3: 2^-4 relative per element at most
    }
  }
  int negative = 0;
  for (int j = 0; j < 4096; ++j) negative += hadamard_sign(5, j) < 0;
  EXPECT_GT(negative, 1900);  // a fair coin
  EXPECT_LT(negative, 2196);
}

// --- the FP8 forward ---------------------------------------------------------------

struct Fp8Problem {
  std::int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  bool causal;
};

// out of FP8 inputs vs the float64 reference of their dequantised values: exact up to
// float32 arithmetic and out's one bfloat16 rounding.
TEST(Fp8Forward, MatchesReferenceOnDequantisedInputs) {
  for (const Fp8Problem& s : {Fp8Problem{2, 45, 77, 4, 2, 64, false}, Fp8Problem{1, 97, 60, 6, 3, 40, true},
                              Fp8Problem{3, 1, 129, 2, 1, 128, false}}) {
    const std::int64_t groups = s.heads_kv;
    std::vector<float> q = gaussian(static_cast<std::size_t>(s.batch * s.seqlen_q * s.heads_q * s.head_dim), 1, 0.01);
    std::vector<float> k = gaussian(static_cast<std::size_t>(s.batch * s.seqlen_k * s.heads_kv * s.head_dim), 2, 0.01);
    std::vector<float> v = gaussian(static_cast<std::size_t>(s.batch * s.seqlen_k * s.heads_kv * s.head_dim), 3, 0.01);
    const Quantised q8 = quantise(q, s.batch, s.seqlen_q, s.heads_q, s.head_dim, groups);
    const Quantised k8 = quantise(k, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, groups);
    const Quantised v8 = quantise(v, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, groups);
    std::vector<float> qd = dequantise(q8, s.batch, s.seqlen_q, s.heads_q, s.head_dim, groups);
    std::vector<float> kd = dequantise(k8, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, groups);
    std::vector<float> vd = dequantise(v8, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, groups);
    const std::size_t out_size = q.size();
    const std::int64_t lse_size = s.batch * s.heads_q * s.seqlen_q;

    ForwardArgs ref;
    std::vector<float> ref_out(out_size), ref_lse(static_cast<std::size_t>(lse_size));
    ref.q = TensorView::contiguous(qd.data(), DType::float32, {s.batch, s.seqlen_q, s.heads_q, s.head_dim});
    ref.k = TensorView::contiguous(kd.data(), DType::float32, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim});
    ref.v = TensorView::contiguous(vd.data(), DType::float32, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim});
    ref.out = TensorView::contiguous(ref_out.data(), DType::float32, {s.batch, s.seqlen_q, s.heads_q, s.head_dim});
    ref.maybe_lse = TensorView::contiguous(ref_lse.data(), DType::float32, {s.batch, s.heads_q, s.seqlen_q});
    ref.options.causal = s.causal;
    ref.options.algorithm = Algorithm::reference;
    forward(ref);

    for (const Algorithm algorithm : {Algorithm::reference, Algorithm::flash2, Algorithm::flash1}) {
      std::vector<std::uint8_t> q_codes = q8.codes, k_codes = k8.codes, v_codes = v8.codes;
      std::vector<float> q_descale = q8.descale, k_descale = k8.descale, v_descale = v8.descale;
      Bf16Tensor out(out_size);
      std::vector<float> lse(static_cast<std::size_t>(lse_size));
      ForwardArgs args;
      args.q = TensorView::contiguous(q_codes.data(), DType::float8_e4m3, {s.batch, s.seqlen_q, s.heads_q, s.head_dim});
      args.k = TensorView::contiguous(k_codes.data(), DType::float8_e4m3, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim});
      args.v = TensorView::contiguous(v_codes.data(), DType::float8_e4m3, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim});
      args.out = TensorView::contiguous(out.data.data(), DType::bfloat16, {s.batch, s.seqlen_q, s.heads_q, s.head_dim});
      args.maybe_lse = TensorView::contiguous(lse.data(), DType::float32, {s.batch, s.heads_q, s.seqlen_q});
      args.options.maybe_q_descale = TensorView::contiguous(q_descale.data(), DType::float32, {s.batch, s.heads_kv});
      args.options.maybe_k_descale = TensorView::contiguous(k_descale.data(), DType::float32, {s.batch, s.heads_kv});
      args.options.maybe_v_descale = TensorView::contiguous(v_descale.data(), DType::float32, {s.batch, s.heads_kv});
      args.options.causal = s.causal;
      args.options.algorithm = algorithm;
      forward(args);
      for (std::size_t i = 0; i < out_size; ++i) {
        const float got = numeric::bfloat16_to_float(out.data[i]);
        ASSERT_NEAR(got, ref_out[i], std::fabs(ref_out[i]) * 0x1p-8f + 1e-5f) << algorithm_name(algorithm) << " element " << i;
      }
      for (std::int64_t i = 0; i < lse_size; ++i) {
        const float got = lse[static_cast<std::size_t>(i)], expected = ref_lse[static_cast<std::size_t>(i)];
        if (std::isinf(expected)) {
          ASSERT_EQ(got, expected) << algorithm_name(algorithm);  // a row that sees no key
        } else {
          ASSERT_NEAR(got, expected, 1e-4f) << algorithm_name(algorithm);
        }
      }
    }
  }
}

// One descale per tensor: a zero-stride [batch, heads_kv] view (and [1, 1] broadcast)
// of one float; out in float16; varlen with per-sequence descales.
TEST(Fp8Forward, BroadcastDescalesVarlenAndFloat16Out) {
  const std::int64_t heads = 2, head_dim = 32;
  const std::vector<std::int32_t> cu = {0, 5, 5, 17};  // an empty sequence in the middle
  const std::int64_t batch = 3, total = 17;
  std::vector<float> x = gaussian(static_cast<std::size_t>(total * heads * head_dim), 9);
  std::vector<std::uint8_t> codes(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) codes[i] = float_to_float8_e4m3(x[i] * 64.0f);
  const float per_batch[3] = {1.0f / 64, 0.5f, 1.0f / 128};
  std::vector<float> k_descale = {per_batch[0], per_batch[0], per_batch[1], per_batch[1], per_batch[2], per_batch[2]};
  float one_value = 1.0f / 64;
  std::vector<std::uint16_t> out(x.size(), 0x7e01);
  ForwardArgs args;
  args.q = TensorView::contiguous(codes.data(), DType::float8_e4m3, {total, heads, head_dim});
  args.k = args.q, args.v = args.q;
  args.out = TensorView::contiguous(out.data(), DType::float16, {total, heads, head_dim});
  args.maybe_varlen = VarlenArgs{TensorView::contiguous(const_cast<std::int32_t*>(cu.data()), DType::int32, {batch + 1}),
                                 TensorView::contiguous(const_cast<std::int32_t*>(cu.data()), DType::int32, {batch + 1}), 12, 12};
  args.options.maybe_q_descale = TensorView::strided(&one_value, DType::float32, {batch, heads}, {0, 0});
  args.options.maybe_k_descale = TensorView::contiguous(k_descale.data(), DType::float32, {batch, heads});
  args.options.maybe_v_descale = TensorView::contiguous(&one_value, DType::float32, {1, 1});
  args.options.causal = true;
  forward(args);
  // The float32 problem the FP8 one means: k's rows carry their sequence's descale.
  std::vector<float> q_only(x.size()), k_only(x.size());
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t row = cu[static_cast<std::size_t>(b)]; row < cu[static_cast<std::size_t>(b + 1)]; ++row)
      for (std::int64_t e = 0; e < heads * head_dim; ++e) {
        const std::size_t at = static_cast<std::size_t>(row * heads * head_dim + e);
        q_only[at] = float8_e4m3_to_float(codes[at]) * one_value;
        k_only[at] = float8_e4m3_to_float(codes[at]) * per_batch[b];
      }
  std::vector<float> ref_out(x.size());
  ForwardArgs ref;
  ref.q = TensorView::contiguous(q_only.data(), DType::float32, {total, heads, head_dim});
  ref.k = TensorView::contiguous(k_only.data(), DType::float32, {total, heads, head_dim});
  ref.v = ref.q;  // v_descale = one_value, like q
  ref.out = TensorView::contiguous(ref_out.data(), DType::float32, {total, heads, head_dim});
  ref.maybe_varlen = VarlenArgs{TensorView::contiguous(const_cast<std::int32_t*>(cu.data()), DType::int32, {batch + 1}),
                                TensorView::contiguous(const_cast<std::int32_t*>(cu.data()), DType::int32, {batch + 1}), 12, 12};
  ref.options.causal = true;
  ref.options.algorithm = Algorithm::reference;
  forward(ref);
  for (std::size_t i = 0; i < x.size(); ++i)
    ASSERT_NEAR(numeric::float16_to_float(out[i]), ref_out[i], std::fabs(ref_out[i]) * 0x1p-11f + 1e-6f) << i;
}

// Paged K/V (varlen prefill over page pools): the same bits as the packed call, with
// per-sequence k/v descales (the CPU dequantises after gathering each sequence's pages).
TEST(Fp8Forward, PagedKVEqualsPackedBitwise) {
  const std::int64_t heads = 2, head_dim = 16, page_size = 4, num_blocks = 7;
  const std::vector<std::int32_t> cu_q = {0, 3, 8}, cu_k = {0, 5, 14};
  const std::vector<std::int32_t> table = {5, 1, 6, 0,   // sequence 0: 5 keys, pages 5, 1
                                           2, 4, 3, 6};  // sequence 1: 9 keys, pages 2, 4, 3
  std::vector<float> x = gaussian(static_cast<std::size_t>(num_blocks * page_size * heads * head_dim), 21);
  std::vector<std::uint8_t> pool(x.size()), packed_k(static_cast<std::size_t>(14 * heads * head_dim));
  for (std::size_t i = 0; i < x.size(); ++i) pool[i] = float_to_float8_e4m3(x[i] * 32.0f);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t j = 0; j < cu_k[b + 1] - cu_k[b]; ++j) {
      const std::int64_t page = table[static_cast<std::size_t>(b * 4 + j / page_size)];
      std::memcpy(packed_k.data() + (cu_k[b] + j) * heads * head_dim, pool.data() + (page * page_size + j % page_size) * heads * head_dim,
                  static_cast<std::size_t>(heads * head_dim));
    }
  std::vector<std::uint8_t> q(static_cast<std::size_t>(8 * heads * head_dim));
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = float_to_float8_e4m3(x[i + 3] * 16.0f);
  std::vector<float> k_descale = {1.0f / 32, 1.0f / 16, 1.0f / 64, 1.0f / 32}, q_descale = {1.0f / 16};
  auto run = [&](bool is_paged) {
    std::vector<std::uint16_t> out(q.size(), 0x7fc1);
    ForwardArgs args;
    args.q = TensorView::contiguous(q.data(), DType::float8_e4m3, {8, heads, head_dim});
    args.k = is_paged ? TensorView::contiguous(pool.data(), DType::float8_e4m3, {num_blocks, page_size, heads, head_dim})
                      : TensorView::contiguous(packed_k.data(), DType::float8_e4m3, {14, heads, head_dim});
    args.v = args.k;
    args.out = TensorView::contiguous(out.data(), DType::bfloat16, {8, heads, head_dim});
    VarlenArgs varlen{TensorView::contiguous(const_cast<std::int32_t*>(cu_q.data()), DType::int32, {3}),
                      TensorView::contiguous(const_cast<std::int32_t*>(cu_k.data()), DType::int32, {3}), 5, 9};
    if (is_paged) varlen.maybe_block_table = TensorView::contiguous(const_cast<std::int32_t*>(table.data()), DType::int32, {2, 4});
    args.maybe_varlen = varlen;
    args.options.maybe_q_descale = TensorView::contiguous(q_descale.data(), DType::float32, {1, 1});
    args.options.maybe_k_descale = TensorView::contiguous(k_descale.data(), DType::float32, {2, heads});
    args.options.maybe_v_descale = args.options.maybe_k_descale;
    args.options.causal = true;
    forward(args);
    return out;
  };
  const std::vector<std::uint16_t> packed = run(false);
  EXPECT_EQ(run(true), packed);
  for (const std::uint16_t value : packed) EXPECT_FALSE(std::isnan(numeric::bfloat16_to_float(value)));
}

// --- issue 16's accuracy goal ----------------------------------------------------------
//
// FA3's experiment (paper, section 4.3): q, k, v ~ N(0, 1) + N(0, 100) * Bernoulli(0.001),
// RMSE of the output against float64 attention of the *unquantised* inputs; FA3 reports
// 2.4e-2 for plain per-tensor FP8 and 9.1e-3 with block quantisation + incoherent
// processing. Here batch 1, heads 2, seqlen 512, head_dim 128 (the CPU's budget; FA3's
// table does not fix the shape), per-(batch, head) descales, out in bfloat16.
// Measured (x86 CPU, 2026-11-25), per input seed 101/202/303/404: plain 7.9e-3, 1.50e-2,
// 1.15e-2, 1.05e-2; incoherent 6.5e-3, 8.3e-3, 6.5e-3, 7.0e-3. The incoherent margin
// is thin (v is never rotated, and its per-(batch, head) scale is set by its outliers);
// FA3's per-block scaling, in the GPU kernel's hands, is what would lower it further.
double fp8_rmse(bool incoherent, std::uint32_t seed) {
  const std::int64_t batch = 1, seqlen = 512, heads = 2, head_dim = 128;
  const std::size_t n = static_cast<std::size_t>(batch * seqlen * heads * head_dim);
  std::vector<float> q = gaussian(n, seed, 0.001), k = gaussian(n, seed + 1, 0.001), v = gaussian(n, seed + 2, 0.001);

  std::vector<float> ref_out(n);
  ForwardArgs ref;
  ref.q = TensorView::contiguous(q.data(), DType::float32, {batch, seqlen, heads, head_dim});
  ref.k = TensorView::contiguous(k.data(), DType::float32, {batch, seqlen, heads, head_dim});
  ref.v = TensorView::contiguous(v.data(), DType::float32, {batch, seqlen, heads, head_dim});
  ref.out = TensorView::contiguous(ref_out.data(), DType::float32, {batch, seqlen, heads, head_dim});
  ref.options.algorithm = Algorithm::reference;  // float64 arithmetic on the exact float32 inputs
  forward(ref);

  const QuantizeFp8Options rotate{incoherent, 1234};
  Quantised q8 = quantise(q, batch, seqlen, heads, head_dim, heads, rotate);
  Quantised k8 = quantise(k, batch, seqlen, heads, head_dim, heads, rotate);
  Quantised v8 = quantise(v, batch, seqlen, heads, head_dim, heads);  // never rotated
  std::vector<std::uint16_t> out(n);
  ForwardArgs args;
  args.q = TensorView::contiguous(q8.codes.data(), DType::float8_e4m3, {batch, seqlen, heads, head_dim});
  args.k = TensorView::contiguous(k8.codes.data(), DType::float8_e4m3, {batch, seqlen, heads, head_dim});
  args.v = TensorView::contiguous(v8.codes.data(), DType::float8_e4m3, {batch, seqlen, heads, head_dim});
  args.out = TensorView::contiguous(out.data(), DType::bfloat16, {batch, seqlen, heads, head_dim});
  args.options.maybe_q_descale = TensorView::contiguous(q8.descale.data(), DType::float32, {batch, heads});
  args.options.maybe_k_descale = TensorView::contiguous(k8.descale.data(), DType::float32, {batch, heads});
  args.options.maybe_v_descale = TensorView::contiguous(v8.descale.data(), DType::float32, {batch, heads});
  forward(args);
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) sum += std::pow(static_cast<double>(numeric::bfloat16_to_float(out[i])) - ref_out[i], 2);
  return std::sqrt(sum / static_cast<double>(n));
}

TEST(Fp8Accuracy, OutlierInputsMeetIssue16Goals) {
  // The worst of four draws: where the 0.1% outliers land moves the RMSE by 2x.
  double plain = 0.0, incoherent = 0.0;
  for (std::uint32_t seed : {101u, 202u, 303u, 404u}) {
    const double plain_seed = fp8_rmse(false, seed), incoherent_seed = fp8_rmse(true, seed);
    std::printf("inputs seed %u: RMSE plain %.3e, incoherent %.3e\n", seed, plain_seed, incoherent_seed);
    plain = std::max(plain, plain_seed), incoherent = std::max(incoherent, incoherent_seed);
  }
  RecordProperty("rmse_plain", std::to_string(plain));
  RecordProperty("rmse_incoherent", std::to_string(incoherent));
  EXPECT_LE(plain, 2.4e-2);
  EXPECT_LE(incoherent, 9.1e-3);
  EXPECT_LT(incoherent, plain);
}

// --- errors name the argument and write nothing -----------------------------------------

struct ErrorCase {
  std::vector<std::uint8_t> q = std::vector<std::uint8_t>(2 * 3 * 2 * 16, 0x38), k = q, v = q;
  std::vector<std::uint16_t> out = std::vector<std::uint16_t>(2 * 3 * 2 * 16, 0x7fc1);
  std::vector<float> descale = std::vector<float>(4, 1.0f);
  ForwardArgs args;
  ErrorCase() {
    args.q = TensorView::contiguous(q.data(), DType::float8_e4m3, {2, 3, 2, 16});
    args.k = TensorView::contiguous(k.data(), DType::float8_e4m3, {2, 3, 2, 16});
    args.v = TensorView::contiguous(v.data(), DType::float8_e4m3, {2, 3, 2, 16});
    args.out = TensorView::contiguous(out.data(), DType::bfloat16, {2, 3, 2, 16});
    args.options.maybe_q_descale = TensorView::contiguous(descale.data(), DType::float32, {2, 2});
  }
  void expect_error(const std::string& needle, bool is_not_supported = false) {
    const std::vector<std::uint16_t> before = out;
    try {
      forward(args);
      ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
    } catch (const NotSupported& e) {
      EXPECT_TRUE(is_not_supported) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    } catch (const Error& e) {
      EXPECT_FALSE(is_not_supported) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(out, before);
  }
};

TEST(Fp8Errors, NameTheArgument) {
  { ErrorCase c; c.args.k.dtype = DType::bfloat16; c.expect_error("k: dtype mismatch"); }
  { ErrorCase c; c.args.v.dtype = DType::uint8; c.expect_error("v: dtype mismatch"); }
  { ErrorCase c; c.args.q.dtype = DType::bfloat16; c.expect_error("k: dtype mismatch"); }  // q bf16, k fp8
  { ErrorCase c; c.args.out.dtype = DType::float32; c.expect_error("out: unsupported dtype"); }
  { ErrorCase c; c.args.out.dtype = DType::float8_e4m3; c.expect_error("out: unsupported dtype"); }
  { ErrorCase c; c.args.options.maybe_q_descale.dtype = DType::float16; c.expect_error("q_descale: dtype mismatch"); }
  { ErrorCase c; c.args.options.maybe_k_descale = TensorView::contiguous(c.descale.data(), DType::float32, {2, 3}); c.expect_error("k_descale: not broadcastable"); }
  { ErrorCase c; c.args.options.maybe_v_descale = TensorView::contiguous(c.descale.data(), DType::float32, {4}); c.expect_error("v_descale: wrong rank"); }
  { ErrorCase c; c.args.options.maybe_v_descale = TensorView::contiguous(c.descale.data(), DType::float32, {2, 2}, Device::cuda(0)); c.expect_error("v_descale: device mismatch"); }
  {
    ErrorCase c;  // a descale with bf16 inputs
    c.args.q.dtype = c.args.k.dtype = c.args.v.dtype = DType::bfloat16;
    c.expect_error("q_descale: given, but the inputs are not float8_e4m3fn");
  }
}

TEST(Fp8Errors, BackwardRefusesFp8NamingTheDtype) {
  ErrorCase c;
  std::vector<float> lse(2 * 2 * 3);
  std::vector<std::uint8_t> grads(c.q.size(), 0xaa);
  BackwardArgs b;
  b.q = c.args.q, b.k = c.args.k, b.v = c.args.v, b.out = c.args.out, b.dout = c.args.out;
  b.lse = TensorView::contiguous(lse.data(), DType::float32, {2, 2, 3});
  b.dq = TensorView::contiguous(grads.data(), DType::float8_e4m3, {2, 3, 2, 16});
  b.dk = b.dq, b.dv = b.dq;
  try {
    backward(b);
    ADD_FAILURE() << "backward ran on FP8 inputs";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("q: float8_e4m3fn: the backward pass does not support FP8"), std::string::npos) << e.what();
  }
  EXPECT_EQ(grads, std::vector<std::uint8_t>(c.q.size(), 0xaa));
}

TEST(Fp8Errors, QuantizeNamesTheArgument) {
  std::vector<float> x(2 * 3 * 2 * 96, 1.0f), descale(4, -1.0f);
  std::vector<std::uint8_t> codes(x.size(), 0xaa);
  const auto x_view = TensorView::contiguous(x.data(), DType::float32, {2, 3, 2, 96});
  const auto out_view = TensorView::contiguous(codes.data(), DType::float8_e4m3, {2, 3, 2, 96});
  const auto descale_view = TensorView::contiguous(descale.data(), DType::float32, {2, 2});
  auto expect = [&](auto call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "no error; expected '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(codes, std::vector<std::uint8_t>(x.size(), 0xaa));
    EXPECT_EQ(descale, std::vector<float>(4, -1.0f));
  };
  expect([&] { quantize_fp8(x_view, out_view, descale_view, QuantizeFp8Options{true, 0}); }, "x: head_dim must be a power of two");
  expect([&] { quantize_fp8(x_view, out_view, TensorView::contiguous(descale.data(), DType::float32, {2, 3})); }, "descale: shape mismatch");
  expect([&] { quantize_fp8(x_view, TensorView::contiguous(codes.data(), DType::uint8, {2, 3, 2, 96}), descale_view); }, "out: dtype mismatch");
  expect([&] { quantize_fp8(TensorView::contiguous(codes.data(), DType::float8_e4m3, {2, 3, 2, 96}), out_view, descale_view); }, "x: unsupported dtype");
}

}  // namespace
}  // namespace flashattn
