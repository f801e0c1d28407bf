// tests/cuda/test_forward.cpp — the CUDA forward kernel against the float64 CPU
// reference with the STYLE.md tolerance rule (out and LSE), on awkward shapes, plus
// its properties: every output element written (NaN canary), bitwise repeatable,
// batch items independent, GQA = MHA with repeated K/V, strided inputs, streams.
// Every test skips cleanly without a GPU.
//
// The suite ForwardSanitizer.* is the reduced sweep for compute-sanitizer (memcheck,
// racecheck, synccheck, initcheck): small problems covering every tail-tile case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "src/core/backend.hpp"
#include "tests/cuda/device_problem.hpp"

namespace flashattn::testing {
namespace {


class CudaForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
  // Head dims above the largest kernel of this build (FLASHATTN_CUDA_HEAD_DIMS) are refused.
  static bool is_built(std::int64_t head_dim) { return head_dim <= cuda::limits().max_head_dim; }

  static void check_against_reference(const ProblemShape& shape, std::uint64_t seed = 1) {
    if (!is_built(shape.head_dim)) GTEST_SKIP() << "head_dim " << shape.head_dim << " not built";
    AttentionProblem problem(shape, seed);
    DeviceProblem device(problem);
    device.run_forward();
    expect_forward_matches_reference(problem, shape.describe());
  }
};

// ---- accuracy against the float64 reference --------------------------------------

class CudaForwardVsReference : public CudaForwardTest, public ::testing::WithParamInterface<ProblemShape> {};

TEST_P(CudaForwardVsReference, MatchesFloat64Reference) { check_against_reference(GetParam()); }

std::vector<ProblemShape> awkward_shapes() {
  std::vector<ProblemShape> shapes;
  for (DType t : {DType::float16, DType::bfloat16}) {
    // Seqlen tails of every tile size, both directions of seqlen_q != seqlen_k.
    for (std::int64_t n : {1, 17, 113, 127, 128, 129}) shapes.push_back(make(t, 2, n, n, 2, 2, 64));
    shapes.push_back(make(t, 1, 1023, 1023, 2, 2, 128));
    shapes.push_back(make(t, 2, 17, 300, 2, 2, 128));
    shapes.push_back(make(t, 2, 300, 17, 2, 2, 128));
    shapes.push_back(make(t, 1, 1, 129, 3, 3, 64));
    // Every head dim: built ones and padded ones (40 -> 64, 72 -> 96, ...).
    for (std::int64_t d : {32, 40, 64, 72, 96, 128, 160, 192, 200, 256}) {
      shapes.push_back(make(t, 1, 129, 97, 2, 2, d));
      shapes.push_back(causal(make(t, 1, 97, 129, 2, 1, d)));
    }
    // Causal (bottom-right), including seqlen_q > seqlen_k (fully masked rows).
    shapes.push_back(causal(make(t, 2, 128, 128, 2, 2, 64)));
    shapes.push_back(causal(make(t, 1, 203, 203, 2, 2, 128)));
    shapes.push_back(causal(make(t, 1, 300, 40, 2, 2, 64)));
    shapes.push_back(causal(make(t, 1, 40, 300, 2, 2, 128)));
    // GQA 4:1, 8:1 and MQA.
    shapes.push_back(make(t, 2, 97, 113, 8, 2, 64));
    shapes.push_back(causal(make(t, 1, 130, 130, 8, 1, 128)));
    shapes.push_back(make(t, 1, 65, 200, 16, 2, 128));
    // Sliding windows (left, right, both) and softcap.
    shapes.push_back(window(make(t, 1, 257, 300, 2, 2, 64), 32, 0));
    shapes.push_back(window(make(t, 1, 200, 150, 2, 2, 128), 20, 20));
    shapes.push_back(window(make(t, 1, 190, 190, 1, 1, 64), -1, 7));
    shapes.push_back(window(make(t, 1, 190, 260, 1, 1, 64), 70, -1));
    shapes.push_back(window(make(t, 1, 300, 60, 2, 2, 64), 3, 0));
    shapes.push_back(softcap(make(t, 1, 150, 170, 2, 1, 64), 5.0));
    shapes.push_back(softcap(causal(make(t, 1, 170, 150, 2, 2, 128)), 2.0));
    // Varlen with zero-length and length-1 sequences (q and k lengths independent).
    shapes.push_back(varlen(make(t, 0, 0, 0, 2, 1, 64), {5, 0, 1, 130, 0, 17}, {9, 3, 0, 64, 0, 129}));
    shapes.push_back(causal(varlen(make(t, 0, 0, 0, 2, 2, 128), {129, 1, 30, 0}, {140, 1, 12, 7})));
    shapes.push_back(window(varlen(make(t, 0, 0, 0, 4, 1, 96), {200, 64, 1}, {150, 300, 1}), 33, 5));
  }
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(AwkwardShapes, CudaForwardVsReference, ::testing::ValuesIn(awkward_shapes()));

TEST_F(CudaForwardTest, LongKeySequence32k) {
  for (DType t : {DType::float16, DType::bfloat16}) check_against_reference(make(t, 1, 64, 32768, 2, 1, 128));
  check_against_reference(causal(make(DType::bfloat16, 1, 100, 32768, 1, 1, 64)));
}

// ---- properties --------------------------------------------------------------------

std::vector<unsigned char> bytes_of(const HostTensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  return {p, p + static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype())};
}

TEST_F(CudaForwardTest, BitwiseIdenticalAcross100Runs) {
  const ProblemShape shape = causal(make(DType::bfloat16, 2, 300, 333, 4, 2, 128));
  AttentionProblem problem(shape, 5);
  DeviceProblem device(problem);
  device.run_forward();
  const auto first_out = bytes_of(problem.out);
  const auto first_lse = bytes_of(problem.lse);
  for (int run = 1; run < 100; ++run) {
    device.run_forward();
    ASSERT_EQ(bytes_of(problem.out), first_out) << "run " << run;
    ASSERT_EQ(bytes_of(problem.lse), first_lse) << "run " << run;
  }
}

TEST_F(CudaForwardTest, BatchItemIndependentOfOthers) {
  const ProblemShape shape = make(DType::float16, 3, 200, 170, 2, 2, 64);
  AttentionProblem problem(shape, 9);
  DeviceProblem device(problem);
  device.run_forward();
  const auto out_before = bytes_of(problem.out);
  const auto lse_before = bytes_of(problem.lse);
  // Replace items 0 and 2 (q, k, v) with other random values; item 1 must not change.
  AttentionProblem other(shape, 10);
  const std::int64_t q_item = shape.seqlen_q * shape.heads_q * shape.head_dim;
  const std::int64_t k_item = shape.seqlen_k * shape.heads_kv * shape.head_dim;
  for (std::int64_t b : {0, 2}) {
    for (std::int64_t i = 0; i < q_item; ++i) problem.q.set(b * q_item + i, other.q.get(b * q_item + i));
    for (std::int64_t i = 0; i < k_item; ++i) {
      problem.k.set(b * k_item + i, other.k.get(b * k_item + i));
      problem.v.set(b * k_item + i, other.v.get(b * k_item + i));
    }
  }
  device.upload_all();
  device.run_forward();
  const auto out_after = bytes_of(problem.out);
  const auto lse_after = bytes_of(problem.lse);
  const std::size_t out_item = static_cast<std::size_t>(q_item) * 2;
  EXPECT_TRUE(std::equal(out_before.begin() + out_item, out_before.begin() + 2 * out_item, out_after.begin() + out_item));
  EXPECT_NE(out_before, out_after);  // the other items did change
  const std::size_t lse_item = static_cast<std::size_t>(shape.heads_q * shape.seqlen_q) * 4;
  EXPECT_TRUE(std::equal(lse_before.begin() + lse_item, lse_before.begin() + 2 * lse_item, lse_after.begin() + lse_item));
}

TEST_F(CudaForwardTest, GqaEqualsMhaWithRepeatedKv) {
  const ProblemShape gqa = causal(make(DType::bfloat16, 1, 150, 150, 8, 2, 64));
  AttentionProblem grouped(gqa, 3);
  DeviceProblem grouped_device(grouped);
  grouped_device.run_forward();
  ProblemShape mha = gqa;
  mha.heads_kv = gqa.heads_q;
  AttentionProblem repeated(mha, 3);
  for (std::int64_t i = 0; i < grouped.q.numel(); ++i) repeated.q.set(i, grouped.q.get(i));
  for (std::int64_t j = 0; j < gqa.seqlen_k; ++j)
    for (std::int64_t h = 0; h < mha.heads_kv; ++h)
      for (std::int64_t d = 0; d < gqa.head_dim; ++d) {
        const std::int64_t from = (j * gqa.heads_kv + h / (gqa.heads_q / gqa.heads_kv)) * gqa.head_dim + d;
        const std::int64_t to = (j * mha.heads_kv + h) * gqa.head_dim + d;
        repeated.k.set(to, grouped.k.get(from));
        repeated.v.set(to, grouped.v.get(from));
      }
  DeviceProblem repeated_device(repeated);
  repeated_device.run_forward();
  EXPECT_EQ(bytes_of(grouped.out), bytes_of(repeated.out));
  EXPECT_EQ(bytes_of(grouped.lse), bytes_of(repeated.lse));
}

TEST_F(CudaForwardTest, StridedPackedQkvAndOtherStream) {
  // q, k, v as slices of one packed [batch, seqlen, 3, heads, head_dim] tensor.
  const std::int64_t batch = 2, seqlen = 129, heads = 3, head_dim = 64;
  ProblemShape shape = causal(make(DType::float16, batch, seqlen, seqlen, heads, heads, head_dim));
  AttentionProblem problem(shape, 4);
  HostTensor packed(DType::float16, {batch, seqlen, 3, heads, head_dim});
  packed.fill_random(44);
  auto* base = static_cast<std::uint16_t*>(packed.data());
  const std::int64_t row = 3 * heads * head_dim;
  for (int which = 0; which < 3; ++which) {
    TensorView view = TensorView::strided(base + which * heads * head_dim, DType::float16, {batch, seqlen, heads, head_dim},
                                          {seqlen * row, row, head_dim, 1});
    (which == 0 ? problem.q_view : which == 1 ? problem.k_view : problem.v_view) = view;
  }
  DeviceProblem device(problem, {&packed});
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  device.run_forward(stream);
  cudaStreamDestroy(stream);
  expect_forward_matches_reference(problem, "packed qkv on a non-default stream");
}

TEST_F(CudaForwardTest, FullyMaskedRowsGiveZeroAndMinusInfinity) {
  // seqlen_q > seqlen_k with causal: the first seqlen_q - seqlen_k rows see no key.
  const ProblemShape shape = causal(make(DType::bfloat16, 1, 200, 50, 2, 2, 128));
  AttentionProblem problem(shape, 8);
  DeviceProblem device(problem);
  device.run_forward();
  for (std::int64_t h = 0; h < shape.heads_q; ++h)
    for (std::int64_t i = 0; i < 150; ++i) {
      EXPECT_EQ(problem.lse.get(h * shape.seqlen_q + i), -std::numeric_limits<float>::infinity());
      for (std::int64_t d = 0; d < shape.head_dim; ++d)
        ASSERT_EQ(problem.out.get((i * shape.heads_q + h) * shape.head_dim + d), 0.0f);
    }
  expect_forward_matches_reference(problem, shape.describe());
}

TEST_F(CudaForwardTest, EmptyBatchAndZeroLengthSequencesWriteNothingOutside) {
  // batch 0 and seqlen 0: a no-op that must not fail.
  for (const ProblemShape& shape : {make(DType::float16, 0, 10, 10, 2, 2, 64), make(DType::float16, 2, 0, 10, 2, 2, 64),
                                    make(DType::float16, 2, 10, 0, 2, 2, 64)}) {
    AttentionProblem problem(shape, 2);
    DeviceProblem device(problem);
    EXPECT_NO_THROW(device.run_forward()) << shape.describe();
    if (shape.seqlen_k == 0 && shape.batch > 0) {
      // No keys: every row is empty.
      for (std::int64_t i = 0; i < problem.out.numel(); ++i) ASSERT_EQ(problem.out.get(i), 0.0f);
      for (std::int64_t i = 0; i < problem.lse.numel(); ++i)
        ASSERT_EQ(problem.lse.get(i), -std::numeric_limits<float>::infinity());
    }
  }
}

TEST_F(CudaForwardTest, UnalignedRowsAreRefusedClearly) {
  // A row stride that is not a multiple of 8 elements cannot be moved in 16-byte chunks.
  const ProblemShape shape = make(DType::float16, 1, 16, 16, 1, 1, 64);
  AttentionProblem problem(shape, 1);
  HostTensor wide(DType::float16, {1, 16, 1, 68});
  wide.fill_random(3);
  problem.q_view = TensorView::strided(wide.data(), DType::float16, {1, 16, 1, 64}, {16 * 68, 68, 68, 1});
  DeviceProblem device(problem, {&wide});
  try {
    device.run_forward();
    FAIL() << "expected NotSupported";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("q"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("16-byte"), std::string::npos) << e.what();
  }
}

TEST_F(CudaForwardTest, MergeAttentionStatesMatchesCpu) {
  // Attention over [K1; K2] equals the LSE merge of attention over K1 and over K2.
  const std::int64_t seqlen_k1 = 70, seqlen_k2 = 90;
  ProblemShape whole = make(DType::float32, 1, 33, seqlen_k1 + seqlen_k2, 2, 2, 64);
  whole.dtype = DType::bfloat16;
  AttentionProblem full(whole, 6);
  DeviceProblem full_device(full);
  full_device.run_forward();
  ProblemShape part = whole;
  part.seqlen_k = seqlen_k1;
  AttentionProblem first(part, 6);
  part.seqlen_k = seqlen_k2;
  AttentionProblem second(part, 6);
  for (std::int64_t i = 0; i < full.q.numel(); ++i) first.q.set(i, full.q.get(i)), second.q.set(i, full.q.get(i));
  const std::int64_t row = whole.heads_kv * whole.head_dim;
  for (std::int64_t i = 0; i < seqlen_k1 * row; ++i) first.k.set(i, full.k.get(i)), first.v.set(i, full.v.get(i));
  for (std::int64_t i = 0; i < seqlen_k2 * row; ++i)
    second.k.set(i, full.k.get(seqlen_k1 * row + i)), second.v.set(i, full.v.get(seqlen_k1 * row + i));
  // Merge on the device, in place into the first part's buffers (out = out_a, lse = lse_a).
  DeviceProblem first_device(first), second_device(second);
  first_device.run_forward();
  second_device.run_forward();
  ForwardArgs a = first_device.forward_args(), b = second_device.forward_args();
  merge_attention_states(a.out, a.maybe_lse, b.out, b.maybe_lse, a.out, a.maybe_lse);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  first_device.download_outputs();
  double worst = 0.0;
  for (std::int64_t i = 0; i < full.out.numel(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(first.out.get(i) - full.out.get(i))));
  EXPECT_LE(worst, 2e-2);  // two bf16 roundings of O(1) values apart
  for (std::int64_t i = 0; i < full.lse.numel(); ++i) EXPECT_NEAR(first.lse.get(i), full.lse.get(i), 1e-4);
}

// ---- reduced sweep for compute-sanitizer -----------------------------------------

class ForwardSanitizer : public CudaForwardTest, public ::testing::WithParamInterface<ProblemShape> {};

TEST_P(ForwardSanitizer, TailTiles) { check_against_reference(GetParam()); }

std::vector<ProblemShape> sanitizer_shapes() {
  const DType t = DType::bfloat16;
  return {
      make(t, 1, 1, 1, 1, 1, 64),                      // single element
      make(t, 1, 17, 129, 2, 1, 40),                   // q tail, k tail, head-dim tail (40 -> 64), GQA
      make(DType::float16, 1, 129, 17, 1, 1, 128),     // q tail over 2 tiles, k tail < one block
      causal(make(t, 1, 130, 70, 1, 1, 72)),           // fully masked rows, d 72 -> 96
      window(make(t, 1, 100, 200, 1, 1, 32), 10, 3),   // window boundary tiles
      softcap(causal(make(t, 1, 65, 65, 1, 1, 192)), 3.0),
      make(t, 1, 33, 47, 1, 1, 256),
      varlen(make(t, 0, 0, 0, 2, 1, 64), {3, 0, 1, 129}, {0, 5, 1, 70}),  // zero-length q and k
  };
}

INSTANTIATE_TEST_SUITE_P(Reduced, ForwardSanitizer, ::testing::ValuesIn(sanitizer_shapes()));

}  // namespace
}  // namespace flashattn::testing
