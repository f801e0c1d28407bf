// tests/cuda/test_backward_any_head_dim.cpp — the CUDA backward on head dims that are
// not a multiple of 8 (run staged in the workspace: zero-padded to the next multiple,
// src/cuda/staging.hpp) against the float64 oracle with the gradient rule of STYLE.md.
// Skips without a GPU.
#include "tests/cuda/backward_case.hpp"

namespace flashattn {
namespace {

class CudaBackwardAnyHeadDim : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaBackwardAnyHeadDim, HeadDimsNotAMultipleOf8) {
  for (std::int64_t d : {1, 7, 59, 100, 111, 200, 255})
    for (bool causal : {false, true}) {
      Case c;
      c.head_dim = d, c.seqlen_q = 97, c.seqlen_k = 131, c.causal = causal, c.heads_q = 2, c.heads_kv = 1;
      c.dtype = causal ? DType::bfloat16 : DType::float16;
      c.seed = static_cast<std::uint64_t>(d);
      check_case(c);
    }
}

TEST_F(CudaBackwardAnyHeadDim, VarlenDeterministicAndStridedDout) {
  for (std::int64_t d : {7, 59, 111}) {
    Case c;
    c.head_dim = d, c.heads_q = 4, c.heads_kv = 2;
    c.varlen_q = {5, 0, 1, 130, 17};
    c.varlen_k = {9, 3, 0, 64, 129};
    c.batch = 5;
    check_case(c);
    c.deterministic = true, c.causal = true;
    check_case(c);
    c.deterministic = false, c.dout_head_padding = 3;  // dout rows not 16-byte aligned
    check_case(c);
  }
}

TEST_F(CudaBackwardAnyHeadDim, WindowAndSoftcap) {
  Case c;
  c.head_dim = 100, c.seqlen_q = 150, c.seqlen_k = 170, c.window_left = 30, c.window_right = 4, c.softcap = 5.0;
  check_case(c);
}

}  // namespace
}  // namespace flashattn
