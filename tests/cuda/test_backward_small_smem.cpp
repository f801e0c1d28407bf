// tests/cuda/test_backward_small_smem.cpp — the backward configs of GPUs with less
// shared memory per block than this one (A100: 163 KB; sm_86/sm_89/sm_120: 99 KB),
// run here by capping the limit the configs are picked from
// (bwd::set_shared_memory_limit_for_testing), against the float64 oracle with the
// gradient rule of test_backward.cpp: every kernel head dim (and padded ones), tails
// of both sequences, causal, GQA, varlen with empty sequences, window/softcap, both
// dQ modes. The FA2-class kernels only: the Hopper backward is switched off for this
// process (FLASHATTN_CUDA_BWD_SM90=0, before the first backward). Skips without a GPU.
#include "tests/cuda/backward_case.hpp"

#include <cstdlib>

#include "src/cuda/bwd/launch.hpp"
#include "src/cuda/bwd/select.hpp"
#include "src/cuda/hopper_bwd/launch.hpp"

namespace flashattn {
namespace {

constexpr int kA100Limit = 163 * 1024;
constexpr int kSm86Limit = 99 * 1024;

class CudaBackwardSmallSharedMemory : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() { setenv("FLASHATTN_CUDA_BWD_SM90", "0", 1); }
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    cuda::bwd::set_shared_memory_limit_for_testing(GetParam());
  }
  void TearDown() override { cuda::bwd::set_shared_memory_limit_for_testing(0); }
};

// The kernel head dim a head dim runs on, as the dispatch picks it (all compiled).
int kernel_head_dim(std::int64_t head_dim) {
  for (const int d : cuda::bwd::kHeadDims)
    if (head_dim <= d) return d;
  return 0;
}

// Runs the case unless its head dim is not compiled into this build (NotSupported).
void check_if_built(const Case& c) {
  try {
    check_case(c);
  } catch (const NotSupported& e) {
    SUCCEED() << e.what();
  }
}

// The cap reaches the selection, and the selection then picks the small tier's configs.
TEST_P(CudaBackwardSmallSharedMemory, CapSelectsTheConfigsOfThatTier) {
  const cuda::bwd::DeviceLimits limits = cuda::bwd::current_device_limits();
  ASSERT_LE(limits.shared_memory_per_block, GetParam());
  int device = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  if (major == 9)  // the H100 must keep its staged-dQ configs (every build here has sm_90a code)
    EXPECT_TRUE(limits.has_bulk_reduce) << "the sm_90 device runs code without the bulk reduction";
  const auto tier = GetParam() == kSm86Limit ? cuda::bwd::SmemTier::compact : cuda::bwd::SmemTier::ampere;
  for (const int d : cuda::bwd::kHeadDims) {
    const auto choice = cuda::bwd::select_kernels(d, limits);
    ASSERT_TRUE(choice) << "d" << d;
    if (tier == cuda::bwd::SmemTier::ampere && limits.has_bulk_reduce && d <= 96) continue;  // d32/d96 staged fit 163 KB
    EXPECT_EQ(cuda::bwd::dkdv_config(d, choice->dkdv), cuda::bwd::dkdv_config(d, tier)) << "d" << d;
    EXPECT_EQ(cuda::bwd::dq_config(d, choice->dq), cuda::bwd::dq_config(d, tier)) << "d" << d;
  }
}

// The Hopper backward is off in this process, so every case below runs the FA2-class kernels.
TEST_P(CudaBackwardSmallSharedMemory, HopperKernelIsOff) {
  Case c;
  c.head_dim = 128, c.dtype = DType::bfloat16;
  Problem p(c);
  HostTensor dq(c.dtype, p.q_shape), dk(c.dtype, p.k_shape), dv(c.dtype, p.k_shape);
  BackwardArgs args;
  args.q = p.q.view(), args.k = p.k.view(), args.v = p.v.view(), args.out = p.out.view();
  args.dout = p.dout_view(p.dout.data(), Device::cpu());
  args.lse = p.lse.view(), args.dq = dq.view(), args.dk = dk.view(), args.dv = dv.view();
  const BackwardParams params = validate_backward(args);
  EXPECT_NE(cuda::hopper_bwd::why_unsupported(params), "");
}

TEST_P(CudaBackwardSmallSharedMemory, EveryHeadDimWithTails) {
  for (const std::int64_t d : {32, 40, 64, 96, 128, 136, 192, 256})
    for (const bool causal : {false, true}) {
      SCOPED_TRACE("kernel head dim " + std::to_string(kernel_head_dim(d)));
      Case c;
      c.head_dim = d, c.causal = causal, c.seqlen_q = causal ? 131 : 97, c.seqlen_k = causal ? 97 : 131;
      c.heads_q = 2, c.heads_kv = 1, c.batch = 2;
      c.dtype = (d / 32) % 2 == 0 ? DType::bfloat16 : DType::float16;
      c.seed = static_cast<std::uint64_t>(d * 2 + (causal ? 1 : 0));
      check_if_built(c);
      c.deterministic = true;
      check_if_built(c);
    }
}

TEST_P(CudaBackwardSmallSharedMemory, VarlenAndGroupedQueryAttention) {
  for (const std::int64_t d : {64, 128, 256})
    for (const bool deterministic : {false, true}) {
      Case c;
      c.head_dim = d, c.causal = true, c.deterministic = deterministic;
      c.varlen_q = {0, 9, 130, 1};
      c.varlen_k = {5, 0, 140, 1};
      c.batch = 4, c.heads_q = 6, c.heads_kv = 2;
      c.dtype = d == 128 ? DType::bfloat16 : DType::float16;
      check_if_built(c);
    }
}

TEST_P(CudaBackwardSmallSharedMemory, WindowSoftcapAndOddStrides) {
  for (const std::int64_t d : {64, 128, 192, 256}) {
    Case c;
    c.head_dim = d, c.seqlen_q = 200, c.seqlen_k = 230, c.batch = 1, c.heads_q = c.heads_kv = 2;
    c.window_left = 32, c.window_right = 8;
    check_if_built(c);
    c.window_left = c.window_right = -1;
    c.softcap = 5.0, c.causal = true, c.q_scale = 3.0f, c.dtype = DType::bfloat16;
    check_if_built(c);
    c.softcap = 0.0, c.q_scale = 1.0f, c.dout_head_padding = 3;  // element copies instead of cp.async
    check_if_built(c);
  }
}

INSTANTIATE_TEST_SUITE_P(Limits, CudaBackwardSmallSharedMemory, ::testing::Values(kA100Limit, kSm86Limit),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == kA100Limit ? std::string("A100_163KB") : std::string("Sm86_99KB");
                         });

}  // namespace
}  // namespace flashattn
