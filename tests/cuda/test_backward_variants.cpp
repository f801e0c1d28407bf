// tests/cuda/test_backward_variants.cpp — the sm80 backward kernels (bwd/dkdv_kernel.cuh,
// the deterministic bwd/dq_kernel.cuh) with ALiBi and dropout against the float64
// oracle (backward_case.hpp: O/LSE from the CPU reference with the same options, the
// gradient rule max|grad - ref64| <= 3 max|naive_lowprec - ref64| + floor, outputs
// poisoned first). The Hopper backward is switched off for this process
// (FLASHATTN_CUDA_BWD_SM90=0), so every head dim runs the sm80 kernels.
//
// Dropout: the oracle regenerates Z from the same (seed, offset), so agreement proves
// the kernels' masks are the forward's bit for bit; deterministic mode must also be
// bitwise repeatable with dropout on. Skips without a GPU.
#include "tests/cuda/backward_case.hpp"

#include <cstdlib>

namespace flashattn {
namespace {

class Sm80BackwardVariants : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { setenv("FLASHATTN_CUDA_BWD_SM90", "0", 1); }
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
  // Runs the case unless its head dim is not compiled into this build (NotSupported).
  static void check_if_built(const Case& c) {
    try {
      check_case(c);
    } catch (const NotSupported& e) {
      SUCCEED() << e.what();
    }
  }
  // The variants every shape below runs with: ALiBi per head and per (sequence, head),
  // dropout 0.1 and 0.5 (other seeds and offsets, both 32-bit words used).
  static std::vector<Case> variants_of(Case c) {
    std::vector<Case> cases;
    c.alibi = Case::Alibi::per_head;
    cases.push_back(c);
    c.alibi = Case::Alibi::per_batch_head;
    cases.push_back(c);
    c.alibi = Case::Alibi::none;
    c.dropout_p = 0.1, c.dropout_seed = 42, c.dropout_offset = 7;
    cases.push_back(c);
    c.dropout_p = 0.5, c.dropout_seed = 0x123456789abull, c.dropout_offset = 0x300000001ull;
    cases.push_back(c);
    return cases;
  }
  static void check_variants(const Case& c) {
    for (const Case& variant : variants_of(c)) check_if_built(variant);
  }
};

TEST_F(Sm80BackwardVariants, SeqlenTailsBothWays) {
  for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{113, 113}, {17, 300}, {300, 17}, {203, 129}}) {
    Case c;
    c.seqlen_q = sq, c.seqlen_k = sk, c.batch = 2, c.dtype = sq > sk ? DType::bfloat16 : DType::float16;
    check_variants(c);
  }
}

TEST_F(Sm80BackwardVariants, Causal) {
  for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{203, 203}, {150, 40}, {40, 203}}) {
    Case c;
    c.seqlen_q = sq, c.seqlen_k = sk, c.causal = true, c.dtype = DType::bfloat16;
    check_variants(c);
  }
}

TEST_F(Sm80BackwardVariants, HeadDims) {
  for (std::int64_t d : {32, 64, 96, 128, 192, 256}) {
    Case c;
    c.head_dim = d, c.seqlen_q = 97, c.seqlen_k = 131, c.heads_q = c.heads_kv = 1, c.causal = d % 64 != 0;
    check_variants(c);
  }
}

TEST_F(Sm80BackwardVariants, GroupedQueryAttention) {
  for (auto [hq, hkv] : {std::pair<std::int64_t, std::int64_t>{8, 2}, {4, 1}}) {
    Case c;
    c.heads_q = hq, c.heads_kv = hkv, c.seqlen_q = 100, c.seqlen_k = 150, c.batch = 2, c.causal = hkv == 1;
    check_variants(c);
  }
}

TEST_F(Sm80BackwardVariants, WindowAndSoftcap) {
  Case c;
  c.seqlen_q = 200, c.seqlen_k = 230;
  c.window_left = 32, c.window_right = 8;
  check_variants(c);
  c.window_left = c.window_right = -1;
  c.softcap = 5.0, c.dtype = DType::bfloat16, c.q_scale = 3.0f;
  check_variants(c);
  c.causal = true, c.softcap = 2.0, c.head_dim = 96;
  check_variants(c);
}

TEST_F(Sm80BackwardVariants, VarlenWithEmptySequences) {
  for (bool deterministic : {false, true}) {
    Case c;
    c.varlen_q = {0, 1, 70, 129, 5, 0};
    c.varlen_k = {3, 1, 200, 64, 0, 0};
    c.batch = 6, c.causal = true, c.heads_q = 4, c.heads_kv = 2, c.deterministic = deterministic;
    check_variants(c);
  }
}

TEST_F(Sm80BackwardVariants, DeterministicDq) {
  for (std::int64_t d : {64, 128, 192}) {
    Case c;
    c.deterministic = true, c.seqlen_q = 300, c.seqlen_k = 257, c.heads_q = 4, c.heads_kv = 2, c.head_dim = d;
    c.window_left = 50, c.window_right = 10, c.dtype = DType::bfloat16;
    check_variants(c);
  }
}

TEST_F(Sm80BackwardVariants, AlibiWithDropoutSoftcapAndWindow) {
  Case c;
  c.batch = 2, c.seqlen_q = 203, c.seqlen_k = 113, c.heads_q = 4, c.heads_kv = 2;
  c.window_left = 40, c.window_right = 8, c.softcap = 3.0, c.alibi = Case::Alibi::per_batch_head;
  c.dropout_p = 0.3, c.dropout_seed = 11, c.dropout_offset = 5;
  check_if_built(c);
  c.deterministic = true, c.head_dim = 128;
  check_if_built(c);
}

// Many query and key blocks on each side of the diagonal: ALiBi's affine form on the
// warp tiles there, the per-element form across it (FLASHATTN_CUDA_ALIBI_PATH=generic
// runs the same cases with the per-element form everywhere); every head dim's tiles, the
// deterministic dQ kernel, sequence offsets, window_left 0 (every tile on the right), dropout.
TEST_F(Sm80BackwardVariants, AlibiAffineFormOnBothSides) {
  for (std::int64_t d : {64, 128, 256}) {
    Case c;
    c.seqlen_q = 700, c.seqlen_k = 900, c.batch = 1, c.head_dim = d, c.dtype = DType::bfloat16;
    c.alibi = Case::Alibi::per_head;
    check_if_built(c);
    c.window_left = 0, c.window_right = 40, c.alibi = Case::Alibi::per_batch_head;
    check_if_built(c);
  }
  Case c;
  c.varlen_q = {0, 1, 300, 129, 5, 0, 700};
  c.varlen_k = {3, 1, 300, 200, 0, 0, 900};
  c.batch = 7, c.heads_q = 4, c.heads_kv = 2, c.head_dim = 128, c.causal = true;
  c.alibi = Case::Alibi::per_batch_head;
  check_if_built(c);
  c.deterministic = true, c.head_dim = 96;
  check_if_built(c);
  Case d;
  d.seqlen_q = 900, d.seqlen_k = 600, d.batch = 1, d.head_dim = 32, d.alibi = Case::Alibi::per_head;
  d.dropout_p = 0.2, d.dropout_seed = 5, d.dropout_offset = 3;
  check_if_built(d);
  d.deterministic = true, d.head_dim = 192, d.causal = true;
  check_if_built(d);
}

// Deterministic mode with dropout and ALiBi: dQ, dK, dV bitwise identical across runs.
TEST_F(Sm80BackwardVariants, DeterministicWithDropoutIsBitwiseRepeatable) {
  Case c;
  c.batch = 8, c.seqlen_q = 256, c.seqlen_k = 200, c.heads_q = 4, c.heads_kv = 2, c.causal = true;
  c.deterministic = true, c.alibi = Case::Alibi::per_head;
  c.dropout_p = 0.2, c.dropout_seed = 3, c.dropout_offset = 9;
  Problem p(c);
  const int repeats = 20;
  const std::vector<Gradients> runs = run_cuda(p, repeats);
  for (int r = 1; r < repeats; ++r) {
    EXPECT_TRUE(runs[r].dq.bitwise_equal(runs[0].dq)) << "dq differs in run " << r;
    EXPECT_TRUE(runs[r].dk.bitwise_equal(runs[0].dk)) << "dk differs in run " << r;
    EXPECT_TRUE(runs[r].dv.bitwise_equal(runs[0].dv)) << "dv differs in run " << r;
  }
}

}  // namespace
}  // namespace flashattn
