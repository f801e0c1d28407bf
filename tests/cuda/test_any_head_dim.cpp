// tests/cuda/test_any_head_dim.cpp — the CUDA forward on head dims that are not a
// multiple of 8 (run staged: zero-padded to the next multiple, src/cuda/staging.hpp)
// and the paged-KV varlen forward (VarlenArgs::maybe_block_table: a clamped gather
// into packed scratch), against the float64 reference and the packed varlen run.
// Every test skips cleanly without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "src/core/backend.hpp"
#include "tests/cpu/paged_copy.hpp"
#include "tests/cuda/device_problem.hpp"

namespace flashattn::testing {
namespace {

constexpr std::int64_t kOddHeadDims[] = {1, 7, 59, 100, 111, 200, 255};

class CudaAnyHeadDim : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
  static bool is_built(std::int64_t head_dim) { return head_dim <= cuda::limits().max_head_dim; }
  static void check_against_reference(const ProblemShape& shape, std::uint64_t seed = 1) {
    if (!is_built(shape.head_dim)) GTEST_SKIP() << "head_dim " << shape.head_dim << " not built";
    AttentionProblem problem(shape, seed);
    DeviceProblem device(problem);
    device.run_forward();
    expect_forward_matches_reference(problem, shape.describe());
  }
};

TEST_F(CudaAnyHeadDim, ForwardMatchesFloat64Reference) {
  for (DType t : {DType::float16, DType::bfloat16})
    for (std::int64_t d : kOddHeadDims) {
      SCOPED_TRACE("head_dim " + std::to_string(d));
      check_against_reference(make(t, 2, 97, 129, 2, 2, d), static_cast<std::uint64_t>(d));
      check_against_reference(causal(make(t, 1, 129, 97, 4, 2, d)), static_cast<std::uint64_t>(d) + 1);
      check_against_reference(varlen(make(t, 0, 0, 0, 2, 1, d), {5, 0, 1, 130, 17}, {9, 3, 0, 64, 129}),
                              static_cast<std::uint64_t>(d) + 2);
    }
  // Softcap and a window on a staged head dim.
  check_against_reference(softcap(window(make(DType::float16, 1, 150, 170, 2, 1, 59), 30, 4), 5.0));
}

TEST_F(CudaAnyHeadDim, LimitsAdvertiseEveryHeadDimUpToTheLargestKernel) {
  const std::int64_t largest = cuda::limits().max_head_dim;
  EXPECT_EQ(cuda::limits().head_dim_multiple, 1);
  for (std::int64_t d : {std::int64_t{1}, std::int64_t{7}, largest - 1, largest, largest + 1}) {
    AttentionProblem problem(make(DType::float16, 1, 4, 4, 1, 1, d), 3);
    DeviceProblem device(problem);
    const std::string why = why_unsupported(device.forward_args());
    if (d <= largest) {
      EXPECT_EQ(why, "") << "head_dim " << d;
      EXPECT_NO_THROW(device.run_forward()) << "head_dim " << d;  // what is advertised runs
    } else {
      EXPECT_NE(why.find("flashattn: q:"), std::string::npos) << why;
    }
  }
}

TEST_F(CudaAnyHeadDim, DefaultScaleIsOneOverSqrtOfTheCallersHeadDim) {
  // The oracle uses 1/sqrt(59); a kernel scaling by 1/sqrt(64) fails the tolerance on
  // large logits.
  AttentionProblem problem(make(DType::float16, 1, 64, 64, 1, 1, 59), 4);
  for (std::int64_t i = 0; i < problem.q.numel(); ++i) problem.q.set(i, problem.q.get(i) * 3.0f);
  DeviceProblem device(problem);
  device.run_forward();
  expect_forward_matches_reference(problem, "d59 scaled q");
}

TEST_F(CudaAnyHeadDim, StridedPackedQkvWithUnalignedRows) {
  // q, k, v slices of one [batch, seqlen, 3, heads, 7] tensor: rows 63 elements apart,
  // which the kernels could not read in place; the staging copy reads any strides.
  const std::int64_t batch = 2, seqlen = 77, heads = 3, head_dim = 7;
  ProblemShape shape = causal(make(DType::bfloat16, batch, seqlen, seqlen, heads, heads, head_dim));
  AttentionProblem problem(shape, 5);
  HostTensor packed(DType::bfloat16, {batch, seqlen, 3, heads, head_dim});
  packed.fill_random(6);
  const std::int64_t row = 3 * heads * head_dim;
  auto* base = static_cast<unsigned char*>(packed.data());
  auto slice = [&](int which) {
    return TensorView::strided(base + which * heads * head_dim * 2, DType::bfloat16, {batch, seqlen, heads, head_dim},
                               {seqlen * row, row, head_dim, 1});
  };
  problem.q_view = slice(0), problem.k_view = slice(1), problem.v_view = slice(2);
  DeviceProblem device(problem, {&packed});
  device.run_forward();
  expect_forward_matches_reference(problem, "packed qkv d7");
}

// ---- paged-KV varlen forward ------------------------------------------------------

bool bitwise_equal(const HostTensor& a, const HostTensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

// Runs the paged forward of `packed`'s keys laid out by `paged`; out/lse land in packed.out/lse.
void run_paged(AttentionProblem& packed, PagedCopy& paged) {
  DeviceProblem device(packed, {&paged.k_pool, &paged.v_pool, &paged.block_table});
  device.poison_outputs();
  ForwardArgs args = device.forward_args();
  args.k = device.device_view(paged.k_pool.view());
  args.v = device.device_view(paged.v_pool.view());
  args.maybe_varlen->maybe_block_table = device.device_view(paged.block_table.view());
  forward(args);
  cuda_or_throw(cudaDeviceSynchronize(), "paged forward");
  device.download_outputs();
}

class CudaPagedPrefill : public CudaAnyHeadDim {};

TEST_F(CudaPagedPrefill, EqualsPackedVarlenBitwiseAndTheReference) {
  const std::vector<std::int32_t> lengths_q{5, 0, 1, 130, 33}, lengths_k{9, 3, 0, 64, 300};
  for (DType t : {DType::float16, DType::bfloat16})
    for (std::int64_t d : {64, 128, 59})
      for (std::int64_t page_size : {1, 3, 16, 64, 256}) {
        const std::string label = std::string(dtype_name(t)) + " d" + std::to_string(d) + " page " + std::to_string(page_size);
        SCOPED_TRACE(label);
        AttentionProblem packed(causal(varlen(make(t, 0, 0, 0, 4, 2, d), lengths_q, lengths_k)), 11);
        {
          DeviceProblem device(packed);
          device.run_forward();
        }
        expect_forward_matches_reference(packed, label);
        const HostTensor out = packed.out, lse = packed.lse;
        PagedCopy paged(packed, page_size, 13 + static_cast<std::uint64_t>(page_size));
        run_paged(packed, paged);
        EXPECT_TRUE(bitwise_equal(packed.out, out));
        EXPECT_TRUE(bitwise_equal(packed.lse, lse));
      }
}

TEST_F(CudaPagedPrefill, PageIdsOutsideThePoolAreClampedNeverRead) {
  // A device-resident table is not range-checked on the host (CUDA graphs): the gather
  // clamps the ids into the pool — wrong values, never an access outside k/v
  // (compute-sanitizer memcheck on this test shows it), finite output.
  AttentionProblem packed(varlen(make(DType::float16, 0, 0, 0, 2, 2, 64), {16, 40}, {40, 100}), 17);
  PagedCopy paged(packed, 16, 19);
  auto* table = static_cast<std::int32_t*>(paged.block_table.data());
  table[0] = 1 << 30;
  table[paged.max_blocks + 1] = -7;
  run_paged(packed, paged);
  for (std::int64_t i = 0; i < packed.out.numel(); ++i) ASSERT_TRUE(std::isfinite(packed.out.get(i))) << i;
}

TEST_F(CudaPagedPrefill, CapacityIsCheckedOnTheHost) {
  AttentionProblem packed(varlen(make(DType::float16, 0, 0, 0, 2, 2, 64), {16, 40}, {40, 100}), 17);
  PagedCopy paged(packed, 16, 19);
  DeviceProblem device(packed, {&paged.k_pool, &paged.v_pool, &paged.block_table});
  ForwardArgs args = device.forward_args();
  args.k = device.device_view(paged.k_pool.view());
  args.v = device.device_view(paged.v_pool.view());
  args.maybe_varlen->maybe_block_table = device.device_view(paged.block_table.view());
  EXPECT_EQ(why_unsupported(args), "");
  args.maybe_varlen->max_seqlen_k = paged.max_blocks * 16 + 1;
  EXPECT_NE(why_unsupported(args).find("flashattn: block_table:"), std::string::npos) << why_unsupported(args);
}

}  // namespace
}  // namespace flashattn::testing
