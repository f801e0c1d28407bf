// tests/cuda/test_forward_hopper.cpp — the Hopper (sm_90a) forward kernel, run through
// the public API with algorithm = flash3, against the float64 CPU reference with the
// STYLE.md tolerance rule (out and LSE): every kernel head dim and padded ones, fp16
// and bf16, tile tails, seqlen_q != seqlen_k, causal/window/softcap, GQA/MQA, varlen,
// strided layouts; outputs poisoned (NaN canary) before each run; bitwise-identical
// repeats; flash3 refused with NotSupported where it cannot run.
// Every test skips cleanly without a GPU; the kernel tests skip on devices other than
// compute capability 9.0 (where the refusal test runs instead).
//
// The suite HopperForwardSanitizer.* is the reduced sweep for compute-sanitizer.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

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

int device_capability() {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess)
    return 0;
  return major * 10 + minor;
}

bool is_flash3_built() { return cuda::limits().supports_algorithm[static_cast<int>(Algorithm::flash3)]; }

// Poison out/LSE, run the forward with `algorithm`, synchronise, download.
void run_with(DeviceProblem& device, Algorithm algorithm, cudaStream_t stream = nullptr) {
  device.poison_outputs();
  ForwardArgs args = device.forward_args();
  args.options.algorithm = algorithm;
  ExecutionContext context;
  context.stream = stream;
  forward(args, context);
  cuda_or_throw(cudaStreamSynchronize(stream), "flash3 forward on the device");
  cuda_or_throw(cudaGetLastError(), "flash3 forward on the device");
  device.download_outputs();
}

std::vector<unsigned char> bytes_of(const HostTensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  return {p, p + static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype())};
}

class HopperForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    if (!is_flash3_built()) GTEST_SKIP() << "no flash3 kernel in this build (sm_90a not built)";
    if (device_capability() != 90) GTEST_SKIP() << "flash3 needs compute capability 9.0";
  }
  static bool is_built(std::int64_t head_dim) { return head_dim <= cuda::limits().max_head_dim; }

  static void check_against_reference(const ProblemShape& shape, std::uint64_t seed = 1) {
    if (!is_built(shape.head_dim)) GTEST_SKIP() << "head_dim " << shape.head_dim << " not built";
    AttentionProblem problem(shape, seed);
    DeviceProblem device(problem);
    run_with(device, Algorithm::flash3);
    expect_forward_matches_reference(problem, shape.describe() + " [flash3]");
  }
};

// ---- accuracy against the float64 reference --------------------------------------

class HopperForwardVsReference : public HopperForwardTest, public ::testing::WithParamInterface<ProblemShape> {};

TEST_P(HopperForwardVsReference, MatchesFloat64Reference) { check_against_reference(GetParam()); }

std::vector<ProblemShape> hopper_shapes() {
  std::vector<ProblemShape> shapes;
  for (DType t : {DType::float16, DType::bfloat16}) {
    // Kernel head dims and padded ones (40 -> 64, 72/96 -> 128, 200 -> 256); tails of
    // block_m 128 and block_n 128/80, both directions of seqlen_q != seqlen_k.
    for (std::int64_t d : {64, 128, 256, 40, 96, 200}) {
      shapes.push_back(make(t, 2, 129, 97, 2, 2, d));
      shapes.push_back(causal(make(t, 1, 97, 300, 2, 1, d)));
    }
    for (std::int64_t n : {1, 17, 127, 128, 129, 255, 257}) shapes.push_back(make(t, 2, n, n, 2, 2, 128));
    shapes.push_back(make(t, 1, 1, 1, 1, 1, 64));
    shapes.push_back(make(t, 1, 1023, 1025, 2, 2, 128));
    shapes.push_back(make(t, 2, 17, 300, 2, 2, 64));
    shapes.push_back(make(t, 2, 300, 17, 2, 2, 256));
    // Causal (bottom-right), including seqlen_q > seqlen_k (fully masked rows).
    shapes.push_back(causal(make(t, 2, 128, 128, 2, 2, 64)));
    shapes.push_back(causal(make(t, 1, 403, 403, 2, 2, 128)));
    shapes.push_back(causal(make(t, 1, 300, 40, 2, 2, 64)));
    shapes.push_back(causal(make(t, 1, 200, 700, 2, 2, 256)));
    // d64 masks past kShortMaskedSeqlen run the block_m 192 kernel, shorter ones 128.
    shapes.push_back(causal(make(t, 1, 1500, 1500, 2, 2, 64)));
    shapes.push_back(window(make(t, 1, 1200, 1100, 2, 1, 64), 100, 50));
    // GQA 4:1, 8:1 and MQA.
    shapes.push_back(make(t, 2, 97, 113, 8, 2, 64));
    shapes.push_back(causal(make(t, 1, 130, 260, 8, 1, 128)));
    shapes.push_back(make(t, 1, 65, 200, 16, 2, 256));
    // Sliding windows (left, right, both) and softcap.
    shapes.push_back(window(make(t, 1, 257, 300, 2, 2, 64), 32, 0));
    shapes.push_back(window(make(t, 1, 400, 350, 2, 2, 128), 20, 20));
    shapes.push_back(window(make(t, 1, 190, 190, 1, 1, 256), -1, 7));
    shapes.push_back(window(make(t, 1, 190, 460, 1, 1, 128), 70, -1));
    shapes.push_back(softcap(make(t, 1, 150, 170, 2, 1, 64), 5.0));
    shapes.push_back(softcap(causal(make(t, 1, 270, 250, 2, 2, 128)), 2.0));
    // Varlen with zero-length and length-1 sequences (neighbouring rows must not leak).
    shapes.push_back(varlen(make(t, 0, 0, 0, 2, 1, 64), {5, 0, 1, 130, 0, 17}, {9, 3, 0, 64, 0, 129}));
    shapes.push_back(causal(varlen(make(t, 0, 0, 0, 2, 2, 128), {129, 1, 30, 0, 200}, {140, 1, 12, 7, 260})));
    shapes.push_back(window(varlen(make(t, 0, 0, 0, 4, 1, 256), {200, 64, 1}, {150, 300, 1}), 33, 5));
  }
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Shapes, HopperForwardVsReference, ::testing::ValuesIn(hopper_shapes()));

// Unmasked problems run on a persistent grid (one CTA per SM, several tiles each): more
// tiles than the H100's 132 SMs, so CTAs reuse the Q buffer and carry the K/V rings'
// phases from tile to tile; varlen adds tiles past their sequence's end (skipped).
TEST_F(HopperForwardTest, PersistentGridRunsSeveralTilesPerCta) {
  check_against_reference(make(DType::bfloat16, 2, 200, 333, 48, 8, 128));
  check_against_reference(make(DType::float16, 3, 400, 250, 24, 24, 64));
  check_against_reference(make(DType::bfloat16, 2, 300, 190, 40, 40, 256));
  check_against_reference(varlen(make(DType::float16, 0, 0, 0, 64, 8, 64), {300, 0, 5, 700}, {100, 50, 0, 900}));
}

// More than two tiles per CTA on 132 SMs, of every kind the persistent kernels serve,
// so that under the tile-overlap schedule (the default; the ctest prefix
// registers_epilogue. runs the other) both Q buffers are reused, the next tile's first S = Q K^T runs beside
// the previous tile's O store, and the store meets every edge: dense tails clipped by
// the TMA (a block_m 192 tile of 65 rows: one whole warpgroup, one with a single row,
// one with none), varlen warpgroups that cross their sequence's end (stored row by row)
// or end exactly on it, empty sequences, d256 with one Q buffer.
TEST_F(HopperForwardTest, PersistentTilesBackToBack) {
  // Causal, short: the dynamic tile scheduler; GQA 4:1; 384 tiles.
  check_against_reference(causal(make(DType::bfloat16, 2, 300, 300, 64, 16, 128)));
  // Unmasked d64 (block_m 192): 288 tiles, the last of each head 65 rows.
  check_against_reference(make(DType::float16, 3, 257, 129, 48, 48, 64));
  // Varlen causal d64 (block_m 128): 432 tiles with rows; sequences of 65 and 129 rows
  // end one row into a warpgroup, 300 and 200 mid-warpgroup, 1 and 0 rows.
  check_against_reference(
      causal(varlen(make(DType::bfloat16, 0, 0, 0, 48, 8, 64), {300, 0, 65, 129, 1, 200}, {300, 7, 65, 100, 1, 260})));
  // Local window over varlen d128 (128-row sequence: exactly one tile).
  check_against_reference(
      window(varlen(make(DType::float16, 0, 0, 0, 48, 48, 128), {500, 3, 128, 0}, {400, 0, 260, 9}), 64, 16));
  // d256: one Q buffer (released after the last S = Q K^T), 288 tiles.
  check_against_reference(make(DType::bfloat16, 2, 300, 200, 48, 48, 256));
}

TEST_F(HopperForwardTest, LongKeySequence) {
  check_against_reference(make(DType::bfloat16, 1, 64, 16384, 2, 1, 128));
  check_against_reference(causal(make(DType::float16, 1, 300, 8192, 1, 1, 64)));
}

// ---- properties --------------------------------------------------------------------

TEST_F(HopperForwardTest, BitwiseIdenticalAcross20Runs) {
  for (const ProblemShape& shape :
       {causal(make(DType::bfloat16, 2, 300, 333, 4, 2, 128)), make(DType::float16, 1, 200, 450, 2, 2, 256)}) {
    AttentionProblem problem(shape, 5);
    DeviceProblem device(problem);
    run_with(device, Algorithm::flash3);
    const auto first_out = bytes_of(problem.out);
    const auto first_lse = bytes_of(problem.lse);
    for (int run = 1; run < 20; ++run) {
      run_with(device, Algorithm::flash3);
      ASSERT_EQ(bytes_of(problem.out), first_out) << shape.describe() << " run " << run;
      ASSERT_EQ(bytes_of(problem.lse), first_lse) << shape.describe() << " run " << run;
    }
  }
}

TEST_F(HopperForwardTest, StridedPackedQkvAndOtherStream) {
  // q, k, v as slices of one packed [batch, seqlen, 3, heads, head_dim] tensor.
  const std::int64_t batch = 2, seqlen = 257, heads = 3, head_dim = 128;
  ProblemShape shape = causal(make(DType::bfloat16, batch, seqlen, seqlen, heads, heads, head_dim));
  AttentionProblem problem(shape, 4);
  HostTensor packed(DType::bfloat16, {batch, seqlen, 3, heads, head_dim});
  packed.fill_random(44);
  auto* base = static_cast<std::uint16_t*>(packed.data());
  const std::int64_t row = 3 * heads * head_dim;
  for (int which = 0; which < 3; ++which) {
    TensorView view = TensorView::strided(base + which * heads * head_dim, DType::bfloat16,
                                          {batch, seqlen, heads, head_dim}, {seqlen * row, row, head_dim, 1});
    (which == 0 ? problem.q_view : which == 1 ? problem.k_view : problem.v_view) = view;
  }
  DeviceProblem device(problem, {&packed});
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  run_with(device, Algorithm::flash3, stream);
  cudaStreamDestroy(stream);
  expect_forward_matches_reference(problem, "packed qkv on a non-default stream [flash3]");
}

TEST_F(HopperForwardTest, HeadMajorLayout) {
  // q/k/v stored [batch, heads, seqlen, head_dim] (SDPA's layout) and viewed as
  // [batch, seqlen, heads, head_dim]: the tensor maps follow any stride order.
  const std::int64_t batch = 2, seqlen = 190, heads = 4, head_dim = 64;
  ProblemShape shape = make(DType::float16, batch, seqlen, seqlen, heads, heads, head_dim);
  AttentionProblem problem(shape, 12);
  HostTensor storage[3] = {HostTensor(DType::float16, {batch, heads, seqlen, head_dim}),
                           HostTensor(DType::float16, {batch, heads, seqlen, head_dim}),
                           HostTensor(DType::float16, {batch, heads, seqlen, head_dim})};
  for (int which = 0; which < 3; ++which) {
    storage[which].fill_random(70 + which);
    TensorView view = TensorView::strided(storage[which].data(), DType::float16, {batch, seqlen, heads, head_dim},
                                          {heads * seqlen * head_dim, head_dim, seqlen * head_dim, 1});
    (which == 0 ? problem.q_view : which == 1 ? problem.k_view : problem.v_view) = view;
  }
  DeviceProblem device(problem, {&storage[0], &storage[1], &storage[2]});
  run_with(device, Algorithm::flash3);
  expect_forward_matches_reference(problem, "head-major q/k/v [flash3]");
}

TEST_F(HopperForwardTest, FullyMaskedRowsGiveZeroAndMinusInfinity) {
  const ProblemShape shape = causal(make(DType::bfloat16, 1, 300, 50, 2, 2, 128));
  AttentionProblem problem(shape, 8);
  DeviceProblem device(problem);
  run_with(device, Algorithm::flash3);
  for (std::int64_t h = 0; h < shape.heads_q; ++h)
    for (std::int64_t i = 0; i < 250; ++i) {
      EXPECT_EQ(problem.lse.get(h * shape.seqlen_q + i), -std::numeric_limits<float>::infinity());
      for (std::int64_t d = 0; d < shape.head_dim; ++d)
        ASSERT_EQ(problem.out.get((i * shape.heads_q + h) * shape.head_dim + d), 0.0f);
    }
  expect_forward_matches_reference(problem, shape.describe() + " [flash3]");
}

TEST_F(HopperForwardTest, EmptyBatchAndZeroLengthSequences) {
  for (const ProblemShape& shape : {make(DType::float16, 0, 10, 10, 2, 2, 64), make(DType::float16, 2, 0, 10, 2, 2, 64),
                                    make(DType::float16, 2, 10, 0, 2, 2, 128)}) {
    AttentionProblem problem(shape, 2);
    DeviceProblem device(problem);
    EXPECT_NO_THROW(run_with(device, Algorithm::flash3)) << shape.describe();
    if (shape.seqlen_k == 0 && shape.batch > 0) {
      for (std::int64_t i = 0; i < problem.out.numel(); ++i) ASSERT_EQ(problem.out.get(i), 0.0f);
      for (std::int64_t i = 0; i < problem.lse.numel(); ++i)
        ASSERT_EQ(problem.lse.get(i), -std::numeric_limits<float>::infinity());
    }
  }
}

TEST_F(HopperForwardTest, AutomaticMatchesFlash3WhereItRunsIt) {
  // d128: automatic runs the Hopper kernel on this device, bit for bit.
  const ProblemShape shape = causal(make(DType::bfloat16, 1, 333, 333, 2, 2, 128));
  AttentionProblem problem(shape, 21);
  DeviceProblem device(problem);
  run_with(device, Algorithm::flash3);
  const auto flash3_out = bytes_of(problem.out);
  run_with(device, Algorithm::automatic);
  EXPECT_EQ(bytes_of(problem.out), flash3_out);
  run_with(device, Algorithm::flash2);  // the mma.sync kernel, also within tolerance
  expect_forward_matches_reference(problem, shape.describe() + " [flash2]");
}

// ---- refusals ----------------------------------------------------------------------

TEST(HopperForwardRefusal, Flash3RefusedWithReasonWhereItCannotRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const ProblemShape shape = make(DType::bfloat16, 1, 64, 64, 1, 1, 64);
  AttentionProblem problem(shape, 3);
  DeviceProblem device(problem);
  if (!is_flash3_built() || device_capability() != 90) {
    try {
      run_with(device, Algorithm::flash3);
      FAIL() << "expected NotSupported";
    } catch (const NotSupported& e) {
      EXPECT_NE(std::string(e.what()).find("flash3"), std::string::npos) << e.what();
    }
    return;
  }
  // On Hopper: flash3 is refused on the CPU backend (a CUDA-only algorithm).
  AttentionProblem host_problem(shape, 3);
  try {
    host_problem.run_forward(Algorithm::flash3);
    FAIL() << "expected NotSupported for flash3 on the CPU";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("flash3"), std::string::npos) << e.what();
  }
}

TEST_F(HopperForwardTest, ZeroStrideKvRefusedByFlash3AndRunByAutomatic) {
  // K/V broadcast over their heads (head stride 0): valid for the API, but a stride a
  // TMA tensor map cannot encode. flash3 refuses it by name; automatic runs flash2.
  const std::int64_t batch = 1, seqlen = 130, heads = 2, head_dim = 64;
  const ProblemShape shape = make(DType::bfloat16, batch, seqlen, seqlen, heads, heads, head_dim);
  AttentionProblem problem(shape, 15);
  HostTensor k_storage(DType::bfloat16, {batch, seqlen, 1, head_dim});
  HostTensor v_storage(DType::bfloat16, {batch, seqlen, 1, head_dim});
  k_storage.fill_random(81);
  v_storage.fill_random(82);
  problem.k_view = TensorView::strided(k_storage.data(), DType::bfloat16, {batch, seqlen, heads, head_dim},
                                       {seqlen * head_dim, head_dim, 0, 1});
  problem.v_view = TensorView::strided(v_storage.data(), DType::bfloat16, {batch, seqlen, heads, head_dim},
                                       {seqlen * head_dim, head_dim, 0, 1});
  DeviceProblem device(problem, {&k_storage, &v_storage});
  try {
    run_with(device, Algorithm::flash3);
    FAIL() << "expected NotSupported";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("flash3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("stride"), std::string::npos) << e.what();
  }
  run_with(device, Algorithm::automatic);
  expect_forward_matches_reference(problem, "k/v broadcast over heads [automatic]");
}

// ---- reduced sweep for compute-sanitizer -----------------------------------------

class HopperForwardSanitizer : public HopperForwardTest, public ::testing::WithParamInterface<ProblemShape> {};

TEST_P(HopperForwardSanitizer, TailTiles) { check_against_reference(GetParam()); }

std::vector<ProblemShape> sanitizer_shapes() {
  const DType t = DType::bfloat16;
  return {
      make(t, 1, 1, 1, 1, 1, 64),                         // single element
      make(t, 1, 17, 300, 2, 1, 40),                      // q tail, k tail over 3 blocks, head-dim tail, GQA
      make(DType::float16, 1, 129, 17, 1, 1, 128),        // q tail over 2 tiles, k tail < one block
      causal(make(t, 1, 260, 70, 1, 1, 96)),              // fully masked rows, d 96 -> 128
      window(make(t, 1, 100, 400, 1, 1, 64), 10, 3),      // window boundary tiles, skipped blocks
      softcap(causal(make(t, 1, 165, 165, 1, 1, 256)), 3.0),  // block_n 80, 3 stages of the ring reused
      varlen(make(t, 0, 0, 0, 2, 1, 64), {3, 0, 1, 129}, {0, 5, 1, 270}),  // zero-length q and k
      make(t, 1, 200, 100, 150, 150, 64),  // persistent grid: 300 tiles, 2-3 per CTA
  };
}

INSTANTIATE_TEST_SUITE_P(Reduced, HopperForwardSanitizer, ::testing::ValuesIn(sanitizer_shapes()));

}  // namespace
}  // namespace flashattn::testing
