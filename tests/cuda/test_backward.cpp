// tests/cuda/test_backward.cpp — the CUDA backward pass against the float64 oracle.
//
// O and LSE come from the CPU reference (never from the CUDA forward), O rounded to
// the input dtype; dQ/dK/dV must satisfy the gradient rule of STYLE.md:
//   max|grad - ref64| <= 3 * max|naive_lowprec - ref64| + floor,
// where naive_lowprec is the same-precision naive backward. Outputs are poisoned
// with NaN bytes first, so an unwritten element fails. Skips without a GPU.
#include "tests/cuda/backward_case.hpp"

namespace flashattn {
namespace {

class CudaBackward : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaBackward, CoreShapesHeadDims64And128) {
  for (DType dtype : {DType::float16, DType::bfloat16})
    for (std::int64_t d : {64, 128})
      for (bool causal : {false, true}) {
        Case c;
        c.dtype = dtype, c.head_dim = d, c.causal = causal, c.seqlen_q = 129, c.seqlen_k = 200;
        check_case(c);
      }
}

TEST_F(CudaBackward, AwkwardSeqlens) {
  for (DType dtype : {DType::float16, DType::bfloat16})
    for (std::int64_t n : {1, 17, 113, 128, 129, 1023}) {
      Case c;
      c.dtype = dtype, c.batch = n > 500 ? 1 : 2, c.seqlen_q = n, c.seqlen_k = n, c.heads_q = c.heads_kv = 1;
      c.seed = static_cast<std::uint64_t>(n);
      check_case(c);
      c.causal = true;
      check_case(c);
    }
}

TEST_F(CudaBackward, SeqlenQDiffersFromSeqlenK) {
  for (bool causal : {false, true})
    for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{17, 300}, {300, 17}, {113, 129}, {129, 64}, {1, 257}, {257, 1}}) {
      Case c;
      c.seqlen_q = sq, c.seqlen_k = sk, c.causal = causal, c.dtype = causal ? DType::bfloat16 : DType::float16;
      check_case(c);
    }
}

TEST_F(CudaBackward, HeadDims) {
  for (std::int64_t d : {32, 40, 64, 96, 128, 136, 192, 256}) {
    for (bool causal : {false, true}) {
      Case c;
      c.head_dim = d, c.seqlen_q = 97, c.seqlen_k = 131, c.causal = causal, c.heads_q = c.heads_kv = 1;
      c.dtype = d % 64 == 0 ? DType::bfloat16 : DType::float16;
      try {
        check_case(c);
      } catch (const NotSupported& e) {
        // A head dim outside FLASHATTN_CUDA_HEAD_DIMS of this build is refused, never run wrong.
        SUCCEED() << e.what();
      }
    }
  }
}

TEST_F(CudaBackward, GroupedQueryAttention) {
  for (auto [hq, hkv] : {std::pair<std::int64_t, std::int64_t>{8, 2}, {8, 1}, {16, 2}}) {
    for (bool causal : {false, true}) {
      Case c;
      c.heads_q = hq, c.heads_kv = hkv, c.seqlen_q = 100, c.seqlen_k = 150, c.causal = causal, c.batch = 1;
      check_case(c);
    }
  }
}

TEST_F(CudaBackward, WindowAndSoftcap) {
  Case c;
  c.seqlen_q = 200, c.seqlen_k = 230;
  for (auto [left, right] : {std::pair<std::int64_t, std::int64_t>{32, 0}, {16, 16}, {-1, 40}, {70, -1}, {0, 0}}) {
    c.window_left = left, c.window_right = right;
    check_case(c);
  }
  c.window_left = c.window_right = -1;
  c.softcap = 5.0;
  c.dtype = DType::bfloat16;
  check_case(c);
  c.causal = true;
  c.q_scale = 3.0f;
  check_case(c);
}

TEST_F(CudaBackward, VarlenWithEmptyAndSingleTokenSequences) {
  for (bool causal : {false, true}) {
    Case c;
    c.varlen_q = {0, 1, 70, 129, 5, 0};
    c.varlen_k = {3, 1, 200, 64, 0, 0};
    c.batch = 6, c.causal = causal, c.heads_q = 4, c.heads_kv = 2;
    check_case(c);
    c.deterministic = true;
    check_case(c);
  }
}

TEST_F(CudaBackward, NonContiguousDout) {
  Case c;
  c.dout_head_padding = 8;
  check_case(c);
  c.dout_head_padding = 3;  // odd strides: the kernels' element-copy path
  c.causal = true;
  check_case(c);
}

TEST_F(CudaBackward, DeterministicModeMatchesTheOracle) {
  for (bool causal : {false, true}) {
    Case c;
    c.deterministic = true, c.causal = causal, c.seqlen_q = 300, c.seqlen_k = 257, c.heads_q = 4, c.heads_kv = 2;
    check_case(c);
    // Causal is window_right = 0, so the window variant drops causal.
    c.dtype = DType::bfloat16, c.head_dim = 128, c.window_left = 50, c.window_right = causal ? 0 : 10, c.causal = false;
    check_case(c);
  }
}

// Fully masked rows (seqlen_q > seqlen_k, causal), large logits: finite gradients,
// zeros where no key is seen.
TEST_F(CudaBackward, NoNanForMaskedRowsAndLargeLogits) {
  Case c;
  c.seqlen_q = 150, c.seqlen_k = 40, c.causal = true, c.q_scale = 5.0f;
  check_case(c);
  c.dtype = DType::bfloat16;
  c.window_left = 0, c.window_right = 0, c.causal = false, c.seqlen_q = 1, c.seqlen_k = 1;
  check_case(c);
}

// The reduced sweep for compute-sanitizer (memcheck, racecheck): every tail-tile
// case (rows and columns past the sequence, head-dim padding, odd strides, empty
// sequences, both dQ paths) on small problems.
TEST_F(CudaBackward, SanitizerSweep) {
  for (std::int64_t d : {40, 64, 128}) {
    Case c;
    c.head_dim = d, c.batch = 1, c.seqlen_q = 77, c.seqlen_k = 45, c.heads_q = 2, c.heads_kv = 1, c.causal = true;
    c.dtype = d == 128 ? DType::bfloat16 : DType::float16;
    check_case(c);
    c.deterministic = true, c.causal = false, c.dout_head_padding = 3;
    check_case(c);
  }
  Case c;
  c.varlen_q = {0, 9, 66};
  c.varlen_k = {5, 0, 70};
  c.batch = 3, c.heads_q = 2, c.heads_kv = 1, c.causal = true;
  check_case(c);
}

// Batch 60: dK/dV bitwise identical across runs in both modes, dQ too when deterministic.
TEST_F(CudaBackward, RepeatedRunsAreBitwiseStable) {
  const int repeats = 250;
  for (bool deterministic : {false, true}) {
    Case c;
    c.batch = 60, c.seqlen_q = 256, c.seqlen_k = 256, c.heads_q = 4, c.heads_kv = 2, c.causal = true;
    c.deterministic = deterministic;
    Problem p(c);
    const std::vector<Gradients> runs = run_cuda(p, repeats);
    int dq_differs = 0;
    for (int r = 1; r < repeats; ++r) {
      EXPECT_TRUE(runs[r].dk.bitwise_equal(runs[0].dk)) << "dk differs in run " << r << (deterministic ? " (deterministic)" : "");
      EXPECT_TRUE(runs[r].dv.bitwise_equal(runs[0].dv)) << "dv differs in run " << r << (deterministic ? " (deterministic)" : "");
      dq_differs += runs[r].dq.bitwise_equal(runs[0].dq) ? 0 : 1;
    }
    if (deterministic) EXPECT_EQ(dq_differs, 0) << "deterministic dq differs in " << dq_differs << " runs";
  }
}

}  // namespace
}  // namespace flashattn
