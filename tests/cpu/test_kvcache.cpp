// forward_with_kvcache on the CPU: against the float64 reference and the plain
// forward on the gathered cache, paged == contiguous, exact append, every split
// count, rotary (both conventions), edge lengths and argument validation.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "flashattn/error.hpp"
#include "flashattn/kvcache.hpp"
#include "tests/cpu/kvcache_problem.hpp"

namespace flashattn::testing {
namespace {

// Runs the problem (snapshotting the cache first) and checks result + append.
void run_and_check(DecodeProblem& p, const std::string& label) {
  p.snapshot();
  forward_with_kvcache(p.args());
  expect_matches_reference(p, label);
  if (p.shape().seqlen_new > 0) expect_append_exact(p, label);
}

class KVCacheCpu : public ::testing::TestWithParam<DecodeShape> {};

TEST_P(KVCacheCpu, MatchesReferenceAndAppendsExactly) {
  DecodeProblem p(GetParam(), 3);
  run_and_check(p, GetParam().describe());
}

std::vector<DecodeShape> shapes() {
  std::vector<DecodeShape> v;
  for (DType dtype : {DType::float16, DType::bfloat16, DType::float32})
    for (std::int64_t page : {0, 16, 48}) {
      DecodeShape s;
      s.dtype = dtype;
      s.page_size = page;
      s.capacity = 113;
      v.push_back(s);  // plain decode, random lengths
      s.seqlen_new = 3;
      s.seqlen_q = 3;
      s.causal = true;
      v.push_back(s);  // append + causal speculative decode
      s.rotary_dim = 16;
      v.push_back(s);
      s.rotary_interleaved = false;
      s.rotary_dim = 32;
      v.push_back(s);
    }
  DecodeShape gqa;  // 8 query heads per kv head, several query rows, window + softcap
  gqa.heads_q = 8, gqa.heads_kv = 1, gqa.seqlen_q = 5, gqa.capacity = 203, gqa.window_left = 17, gqa.window_right = 2;
  gqa.softcap = 20.0;
  v.push_back(gqa);
  gqa.page_size = 32;
  gqa.seqlen_new = 5;
  gqa.causal = true, gqa.window_right = -1;
  v.push_back(gqa);
  DecodeShape batch_idx;  // cache rows permuted, larger cache than batch
  batch_idx.permute_batch = true, batch_idx.batch = 3, batch_idx.seqlen_new = 2, batch_idx.rotary_dim = 32, batch_idx.rotary_interleaved = false;
  v.push_back(batch_idx);
  DecodeShape leftpad;  // cache_leftpad: keys start late; q rows more than new keys
  leftpad.batch = 3, leftpad.cache_seqlens = {40, 7, 90}, leftpad.leftpad = {5, 7, 0}, leftpad.seqlen_new = 2, leftpad.seqlen_q = 4,
  leftpad.causal = true, leftpad.rotary_dim = 8;
  v.push_back(leftpad);
  leftpad.page_size = 16;
  v.push_back(leftpad);
  DecodeShape prefill;  // chunked prefill: long query, new keys longer than the cached part
  prefill.seqlen_q = 40, prefill.seqlen_new = 40, prefill.cache_seqlens = {0, 60}, prefill.causal = true, prefill.head_dim = 64;
  prefill.page_size = 64;
  v.push_back(prefill);
  DecodeShape uniform;
  uniform.uniform_seqlen = true, uniform.cache_seqlens = {50, 50}, uniform.seqlen_new = 1, uniform.head_dim = 128, uniform.num_splits = 0;
  v.push_back(uniform);
  return v;
}
INSTANTIATE_TEST_SUITE_P(Shapes, KVCacheCpu, ::testing::ValuesIn(shapes()));

TEST(KVCacheCpuProperties, PlainForwardOnGatheredCacheAgrees) {
  DecodeShape s;
  s.dtype = DType::bfloat16, s.capacity = 129, s.seqlen_new = 2, s.seqlen_q = 2, s.causal = true, s.page_size = 16, s.rotary_dim = 32;
  DecodeProblem p(s, 5);
  p.snapshot();
  forward_with_kvcache(p.args());
  DecodeProblem::Dense d = p.dense();
  forward(d.args);
  std::vector<double> out, lse;
  gather(p, out, lse);
  const std::vector<double> plain_out = d.out.to_double();
  // The dense out is [total_q, heads, dim] — the same order as gather(); LSE is [heads, total_q].
  std::vector<double> plain_lse;
  for (std::int64_t row = 0; row < s.batch * s.seqlen_q; ++row)
    for (std::int64_t h = 0; h < s.heads_q; ++h) plain_lse.push_back(d.lse.get(h * s.batch * s.seqlen_q + row));
  EXPECT_LE(max_abs_diff(out, plain_out), 2e-2);  // two bf16 roundings of values of O(1)
  EXPECT_LE(max_abs_diff(lse, plain_lse), 1e-4);
}

TEST(KVCacheCpuProperties, PagedEqualsContiguousBitwise) {
  for (std::int64_t page : {16, 32, 256}) {
    DecodeShape s;
    s.capacity = 300, s.cache_seqlens = {299, 0, 150}, s.batch = 3, s.seqlen_new = 1, s.rotary_dim = 32;
    DecodeProblem contiguous(s, 9);
    s.page_size = page;
    DecodeProblem paged(s, 9);
    // Same values in both caches: copy the contiguous cache's rows into the pages.
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t pos = 0; pos < s.cache_seqlens[static_cast<std::size_t>(b)]; ++pos)
        for (std::int64_t h = 0; h < s.heads_kv; ++h)
          for (std::int64_t e = 0; e < s.head_dim; ++e) {
            paged.k_cache.set(paged.cache_index(b, pos, h) + e, contiguous.k_cache.get(contiguous.cache_index(b, pos, h) + e));
            paged.v_cache.set(paged.cache_index(b, pos, h) + e, contiguous.v_cache.get(contiguous.cache_index(b, pos, h) + e));
          }
    run_and_check(contiguous, "contiguous");
    run_and_check(paged, "paged " + std::to_string(page));
    EXPECT_TRUE(paged.out.bitwise_equal(contiguous.out)) << page;
    EXPECT_TRUE(paged.lse.bitwise_equal(contiguous.lse)) << page;
  }
}

TEST(KVCacheCpuProperties, EverySplitCountAgrees) {
  DecodeShape s;
  s.dtype = DType::bfloat16, s.capacity = 64 * 70, s.cache_seqlens = {64 * 70 - 1, 1000}, s.seqlen_q = 2, s.causal = true,
  s.page_size = 64;
  for (int splits = 1; splits <= 64; splits += (splits < 8 ? 1 : 7)) {
    s.num_splits = splits;
    DecodeProblem p(s, 4);
    run_and_check(p, "splits " + std::to_string(splits));
  }
}

TEST(KVCacheCpuProperties, ZeroLengthCachesGiveZeroAndMinusInfinity) {
  DecodeShape s;
  s.cache_seqlens = {0, 0}, s.num_splits = 3;
  DecodeProblem p(s);
  p.snapshot();
  forward_with_kvcache(p.args());
  for (std::int64_t i = 0; i < p.out.numel(); ++i) ASSERT_EQ(p.out.get(i), 0.0f);
  for (std::int64_t i = 0; i < p.lse.numel(); ++i) ASSERT_EQ(p.lse.get(i), -INFINITY);
  // Empty cache plus an append: attends to the appended keys only.
  s.seqlen_new = 2;
  DecodeProblem appended(s);
  run_and_check(appended, "empty cache + append");
}

TEST(KVCacheCpuProperties, FullCapacityAcceptedOnePastRejected) {
  DecodeShape s;
  s.capacity = 64, s.page_size = 16, s.seqlen_new = 2, s.cache_seqlens = {62, 10};
  DecodeProblem full(s);
  run_and_check(full, "exactly full after the append");
  s.cache_seqlens = {63, 10};
  DecodeProblem past(s);
  past.snapshot();
  try {
    forward_with_kvcache(past.args());
    FAIL() << "one past capacity accepted";
  } catch (const Error& e) {
    // A paged cache's capacity is the block table's width, so the message names block_table.
    EXPECT_NE(std::string(e.what()).find("flashattn: block_table:"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(past.k_cache.bitwise_equal(past.k_cache_initial));
  EXPECT_TRUE(past.v_cache.bitwise_equal(past.v_cache_initial));
}

TEST(KVCacheCpuProperties, BatchZero) {
  DecodeShape s;
  s.batch = 0, s.cache_seqlens = {};
  s.seqlen_new = 1;
  DecodeProblem p(s);
  EXPECT_NO_THROW(forward_with_kvcache(p.args()));
}

// Each bad argument is named in the message, and out, LSE and both caches stay bitwise unchanged.
struct BadCase {
  std::string name;
  std::string argument;
  void (*corrupt)(DecodeProblem&, KVCacheArgs&);
};

TEST(KVCacheCpuValidation, RejectsBadArgumentsWithoutWriting) {
  const std::vector<BadCase> cases = {
      {"block id out of range", "block_table",
       [](DecodeProblem& p, KVCacheArgs&) { static_cast<std::int32_t*>(p.block_table.data())[1] = 1000; }},
      {"negative block id", "block_table", [](DecodeProblem& p, KVCacheArgs&) { static_cast<std::int32_t*>(p.block_table.data())[0] = -1; }},
      {"page size not a multiple of 16", "k_cache",
       [](DecodeProblem&, KVCacheArgs& a) { a.k_cache.shape[1] = 24, a.v_cache.shape[1] = 24; }},
      {"page size above 256", "k_cache",
       [](DecodeProblem&, KVCacheArgs& a) { a.k_cache.shape[1] = 272, a.v_cache.shape[1] = 272, a.k_cache.shape[0] = 1, a.v_cache.shape[0] = 1; }},
      {"k without v", "v", [](DecodeProblem&, KVCacheArgs& a) { a.maybe_v_new = {}; }},
      {"rotary without sin", "rotary_sin", [](DecodeProblem&, KVCacheArgs& a) { a.maybe_rotary_sin = {}; }},
      {"rotary without new keys", "rotary_cos", [](DecodeProblem&, KVCacheArgs& a) { a.maybe_k_new = {}, a.maybe_v_new = {}; }},
      {"rotary table too short", "rotary_cos", [](DecodeProblem&, KVCacheArgs& a) { a.maybe_rotary_cos.shape[0] = 10, a.maybe_rotary_sin.shape[0] = 10; }},
      {"cache_seqlens dtype", "cache_seqlens", [](DecodeProblem&, KVCacheArgs& a) { a.maybe_cache_seqlens.dtype = DType::float32; }},
      {"cache_seqlens negative", "cache_seqlens", [](DecodeProblem& p, KVCacheArgs&) { static_cast<std::int32_t*>(p.cache_seqlens.data())[1] = -2; }},
      {"both seqlen forms", "cache_seqlens", [](DecodeProblem&, KVCacheArgs& a) { a.maybe_uniform_cache_seqlen = 3; }},
      {"uniform seqlen past capacity", "block_table",
       [](DecodeProblem&, KVCacheArgs& a) { a.maybe_cache_seqlens = {}, a.maybe_uniform_cache_seqlen = 64; }},
      {"cache_batch_idx with paged cache", "cache_batch_idx", [](DecodeProblem& p, KVCacheArgs& a) { a.maybe_cache_batch_idx = p.cache_seqlens.view(); }},
      {"leftpad past the end", "cache_leftpad",
       [](DecodeProblem& p, KVCacheArgs& a) {
         a.maybe_cache_leftpad = p.cache_leftpad.view();
         static_cast<std::int32_t*>(p.cache_leftpad.data())[0] = 200;
       }},
      {"cache dtype", "k_cache", [](DecodeProblem&, KVCacheArgs& a) { a.k_cache.dtype = DType::bfloat16; }},
      {"heads_q not a multiple of heads_kv", "k_cache",
       [](DecodeProblem&, KVCacheArgs& a) { a.k_cache.shape[2] = 3, a.v_cache.shape[2] = 3; }},
      {"lse shape", "lse", [](DecodeProblem&, KVCacheArgs& a) { a.maybe_lse.shape[2] = 5; }},
      {"out overlaps the cache", "out", [](DecodeProblem& p, KVCacheArgs& a) { a.out.data = p.k_cache.data(); }},
      {"num_splits too large", "num_splits", [](DecodeProblem&, KVCacheArgs& a) { a.num_splits = kMaxKVCacheSplits + 1; }},
      {"new keys with the wrong head count", "k", [](DecodeProblem&, KVCacheArgs& a) { a.maybe_k_new.shape[2] = 1; }},
      {"attn_mask", "attn_mask", [](DecodeProblem&, KVCacheArgs& a) { a.options.maybe_attn_mask = a.q; }},
      {"block_mask", "block_mask", [](DecodeProblem&, KVCacheArgs& a) { a.options.maybe_block_mask = BlockMaskArgs{}; }},
  };
  for (const auto& c : cases) {
    DecodeShape s;
    s.capacity = 64, s.page_size = 16, s.seqlen_new = 1, s.cache_seqlens = {30, 10}, s.rotary_dim = 16, s.leftpad = {0, 0};
    DecodeProblem p(s);
    p.snapshot();
    KVCacheArgs args = p.args();
    args.maybe_cache_leftpad = {};
    c.corrupt(p, args);
    const HostTensor out_before = p.out, lse_before = p.lse;
    try {
      forward_with_kvcache(args);
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("flashattn: " + c.argument + ":"), std::string::npos) << c.name << ": " << e.what();
    }
    EXPECT_TRUE(p.out.bitwise_equal(out_before)) << c.name;
    EXPECT_TRUE(p.lse.bitwise_equal(lse_before)) << c.name;
    EXPECT_TRUE(p.k_cache.bitwise_equal(p.k_cache_initial)) << c.name;
    EXPECT_TRUE(p.v_cache.bitwise_equal(p.v_cache_initial)) << c.name;
  }
}

TEST(KVCacheCpuValidation, CacheBatchIndexOutOfRange) {
  DecodeShape s;
  s.permute_batch = true, s.seqlen_new = 1;
  DecodeProblem p(s);
  p.snapshot();
  static_cast<std::int32_t*>(p.cache_batch_idx.data())[1] = static_cast<std::int32_t>(s.batch + 2);
  EXPECT_THROW(
      {
        try {
          forward_with_kvcache(p.args());
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("cache_batch_idx"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  EXPECT_TRUE(p.k_cache.bitwise_equal(p.k_cache_initial));
}

TEST(KVCacheCpuValidation, WorkspaceQueryIsZeroOnTheCpu) {
  DecodeShape s;
  s.num_splits = 8;
  DecodeProblem p(s);
  EXPECT_EQ(kvcache_workspace_bytes(p.args()), 0u);
  EXPECT_EQ(kvcache_num_splits(p.args()), 8);
  s.num_splits = 0;
  DecodeProblem automatic(s);
  EXPECT_EQ(kvcache_num_splits(automatic.args()), 1);
}

}  // namespace
}  // namespace flashattn::testing
