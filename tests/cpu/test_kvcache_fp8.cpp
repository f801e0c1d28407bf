// forward_with_kvcache over an FP8 (e4m3) cache on the CPU: the e4m3 conversions
// themselves (every code), attention against the float64 attention over the
// dequantised cache, the append's quantisation byte for byte, paged and contiguous,
// GQA, splits, descale forms, and the arguments it rejects.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "flashattn/error.hpp"
#include "flashattn/kvcache.hpp"
#include "src/core/float8.hpp"
#include "tests/cpu/kvcache_fp8_problem.hpp"

namespace flashattn::testing {
namespace {

// The value of code c by the definition: (-1)^s 2^(e-7) (1 + m/8), subnormal 2^-6 (m/8).
double e4m3_value(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double magnitude = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -magnitude : magnitude;
}

TEST(Float8, DecodesEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const float x = float8::decode_e4m3(static_cast<std::uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(x)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(x), e4m3_value(c)) << c;
    EXPECT_EQ(std::signbit(x), c >= 128) << c;  // -0 included
  }
  EXPECT_EQ(float8::decode_e4m3(float8::kE4m3MaxBits), float8::kE4m3Max);
}

TEST(Float8, EncodesRoundToNearestEvenWithSaturation) {
  // Every finite code round-trips; the midpoint between neighbours goes to the even code,
  // anything past it to the far one.
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const float x = float8::decode_e4m3(static_cast<std::uint8_t>(c));
    EXPECT_EQ(float8::encode_e4m3(x), c == 0x80 ? 0x80 : c) << c;
    if ((c & 0x7f) >= 0x7e) continue;
    const double next = e4m3_value(c + 1), midpoint = (e4m3_value(c) + next) / 2;
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(float8::encode_e4m3(static_cast<float>(midpoint)), even) << "midpoint above code " << c;
    EXPECT_EQ(float8::encode_e4m3(std::nextafter(static_cast<float>(midpoint), static_cast<float>(next))), c + 1) << c;
    EXPECT_EQ(float8::encode_e4m3(std::nextafter(static_cast<float>(midpoint), 0.0f * static_cast<float>(next))), c) << c;
  }
  // Saturation: past 448 (464 is a tie that rounds to even = 448 anyway), infinities.
  for (float x : {448.0f, 460.0f, 464.0f, 470.0f, 480.0f, 1e6f, INFINITY}) {
    EXPECT_EQ(float8::encode_e4m3(x), 0x7e) << x;
    EXPECT_EQ(float8::encode_e4m3(-x), 0xfe) << x;
  }
  EXPECT_EQ(float8::encode_e4m3(NAN), 0x7f);
  EXPECT_EQ(float8::encode_e4m3(std::ldexp(1.0f, -11)), 0x00);   // a quarter of the smallest subnormal
  EXPECT_EQ(float8::encode_e4m3(std::ldexp(1.5f, -10)), 0x01);   // 0.75 units: up
  EXPECT_EQ(float8::encode_e4m3(-std::ldexp(1.0f, -10)), 0x80);  // half a unit: ties to even (-0)
  EXPECT_EQ(float8::quantize_e4m3(3.0f, 0.5f), float8::encode_e4m3(6.0f));
}

class KVCacheFp8Cpu : public ::testing::TestWithParam<Fp8DecodeShape> {};

// Float computation over the exact dequantised values: the output's own rounding
// (half a unit of q's dtype, relative) plus float32 accumulation.
TEST_P(KVCacheFp8Cpu, MatchesDequantisedReferenceAndAppendsExactly) {
  Fp8DecodeProblem p(GetParam(), 5);
  forward_with_kvcache(p.args());
  const double relative = GetParam().base.dtype == DType::bfloat16 ? 1.0 / 256 : 1.0 / 2048;
  p.expect_matches_reference(relative, 2e-4, 2e-4, GetParam().describe());
  if (GetParam().base.seqlen_new > 0) p.expect_append_exact(GetParam().describe());
}

std::vector<Fp8DecodeShape> fp8_shapes() {
  std::vector<Fp8DecodeShape> v;
  for (DType dtype : {DType::bfloat16, DType::float16})
    for (std::int64_t page : {0, 16, 48})
      for (int splits : {1, 3}) {
        Fp8DecodeShape s;
        s.base.dtype = dtype;
        s.base.page_size = page;
        s.base.capacity = 113;
        s.base.num_splits = splits;
        v.push_back(s);  // plain decode, GQA 2
        s.base.seqlen_new = 3, s.base.seqlen_q = 3, s.base.causal = true;
        v.push_back(s);  // append (quantised) + causal speculative decode
        s.fp8_new = true, s.descale = Fp8DecodeShape::Descale::per_tensor;
        v.push_back(s);  // append of e4m3 rows (copied)
        s.fp8_new = false, s.base.rotary_dim = 16, s.descale = Fp8DecodeShape::Descale::none;
        v.push_back(s);  // rotary before quantising, descale 1
      }
  Fp8DecodeShape gqa;  // 8 query heads per kv head, head dims of the CUDA kernels
  gqa.base.heads_q = 8, gqa.base.heads_kv = 1, gqa.base.seqlen_q = 2, gqa.base.capacity = 203, gqa.base.head_dim = 128;
  gqa.base.seqlen_new = 2, gqa.base.causal = true, gqa.base.num_splits = 4, gqa.base.softcap = 20.0;
  v.push_back(gqa);
  gqa.base.page_size = 32, gqa.base.head_dim = 64, gqa.base.rotary_dim = 64, gqa.base.rotary_interleaved = false;
  v.push_back(gqa);
  gqa.base.page_size = 0, gqa.base.head_dim = 256, gqa.base.rotary_dim = 0, gqa.base.heads_q = 4, gqa.base.heads_kv = 4;
  v.push_back(gqa);
  Fp8DecodeShape leftpad;  // leftpad, an empty sequence
  leftpad.base.batch = 3, leftpad.base.cache_seqlens = {40, 0, 90}, leftpad.base.leftpad = {5, 0, 0}, leftpad.base.capacity = 100;
  v.push_back(leftpad);
  return v;
}
INSTANTIATE_TEST_SUITE_P(Shapes, KVCacheFp8Cpu, ::testing::ValuesIn(fp8_shapes()));

// Each bad argument is named in the message, and out, LSE and both caches stay bitwise unchanged.
struct BadFp8Case {
  std::string name;
  std::string argument;
  void (*corrupt)(Fp8DecodeProblem&, KVCacheArgs&);
};

TEST(KVCacheFp8CpuValidation, RejectsBadArgumentsWithoutWriting) {
  const std::vector<BadFp8Case> cases = {
      {"k FP8, v 16-bit", "v_cache", [](Fp8DecodeProblem& p, KVCacheArgs& a) { a.v_cache = p.base.v_cache.view(); }},
      {"k 16-bit, v FP8", "v_cache", [](Fp8DecodeProblem& p, KVCacheArgs& a) { a.k_cache = p.base.k_cache.view(); }},
      {"q in float32", "q", [](Fp8DecodeProblem&, KVCacheArgs& a) { a.q.dtype = DType::float32; }},
      {"k_descale float16", "k_descale", [](Fp8DecodeProblem&, KVCacheArgs& a) { a.options.maybe_k_descale.dtype = DType::float16; }},
      {"k_descale shape", "k_descale", [](Fp8DecodeProblem&, KVCacheArgs& a) { a.options.maybe_k_descale.shape[1] = 3; }},
      {"v_descale rank", "v_descale", [](Fp8DecodeProblem&, KVCacheArgs& a) { a.options.maybe_v_descale.rank = 1; }},
      {"v_descale on another device", "v_descale",
       [](Fp8DecodeProblem&, KVCacheArgs& a) { a.options.maybe_v_descale.device = Device{DeviceType::cuda, 0}; }},
      {"q_descale given", "q_descale", [](Fp8DecodeProblem& p, KVCacheArgs& a) { a.options.maybe_q_descale = p.k_descale.view(); }},
      {"descale with a 16-bit cache", "k_descale",
       [](Fp8DecodeProblem& p, KVCacheArgs& a) { a.k_cache = p.base.k_cache.view(), a.v_cache = p.base.v_cache.view(); }},
      {"new keys in float32", "k", [](Fp8DecodeProblem&, KVCacheArgs& a) { a.maybe_k_new.dtype = DType::float32; }},
      {"e4m3 keys with 16-bit values", "v", [](Fp8DecodeProblem& p, KVCacheArgs& a) { a.maybe_k_new = p.k_new.view(); }},
      {"e4m3 new keys with rotary", "rotary_cos",
       [](Fp8DecodeProblem& p, KVCacheArgs& a) {
         a.maybe_k_new = p.k_new.view(), a.maybe_v_new = p.v_new.view();
         a.maybe_rotary_cos = p.base.rotary_cos.view(), a.maybe_rotary_sin = p.base.rotary_sin.view();
       }},
  };
  for (const auto& c : cases) {
    Fp8DecodeShape s;
    s.base.capacity = 64, s.base.page_size = 16, s.base.seqlen_new = 1, s.base.cache_seqlens = {30, 10}, s.base.rotary_dim = 16;
    s.fp8_new = true;  // builds the e4m3 rows; args() passes them, the cases swap what they test
    Fp8DecodeProblem p(s);
    KVCacheArgs args = p.args();
    args.maybe_k_new = p.base.k_new.view(), args.maybe_v_new = p.base.v_new.view();  // 16-bit rows (rotary allowed)
    c.corrupt(p, args);
    const HostTensor out_before = p.base.out, lse_before = p.base.lse;
    try {
      forward_with_kvcache(args);
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("flashattn: " + c.argument + ":"), std::string::npos) << c.name << ": " << e.what();
    }
    EXPECT_TRUE(p.base.out.bitwise_equal(out_before)) << c.name;
    EXPECT_TRUE(p.base.lse.bitwise_equal(lse_before)) << c.name;
    EXPECT_TRUE(p.k_cache.bitwise_equal(p.k_cache_initial)) << c.name;
    EXPECT_TRUE(p.v_cache.bitwise_equal(p.v_cache_initial)) << c.name;
    EXPECT_TRUE(p.base.k_cache.bitwise_equal(p.base.k_cache_initial)) << c.name;
  }
}

}  // namespace
}  // namespace flashattn::testing
