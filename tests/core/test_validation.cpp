// tests/core/test_validation.cpp — every bad input is rejected before anything is
// written: the exception is flashattn::Error (NotSupported for valid-but-unsupported
// input), its message names the argument ("flashattn: <argument>: ..."), and every
// canary-filled output is bitwise unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "tests/support/host_tensor.hpp"

namespace {

using flashattn::Algorithm;
using flashattn::BackwardArgs;
using flashattn::Device;
using flashattn::DType;
using flashattn::ForwardArgs;
using flashattn::TensorView;
using flashattn::testing::HostTensor;

enum class Expect { error, not_supported };

// Runs `call`, which must throw; checks the message names `argument` and mentions
// `topic`, and that each of `watched` (canary-filled first) is bitwise unchanged.
void expect_rejected(const std::function<void()>& call, const std::string& argument, const std::string& topic,
                     const std::vector<HostTensor*>& watched, Expect kind = Expect::error) {
  std::vector<HostTensor> before;
  for (HostTensor* t : watched) {
    t->fill_canary();
    before.push_back(*t);
  }
  try {
    call();
    ADD_FAILURE() << "accepted, expected a rejection naming '" << argument << "'";
  } catch (const flashattn::NotSupported& e) {
    EXPECT_EQ(kind, Expect::not_supported) << "NotSupported where a plain Error was expected: " << e.what();
    EXPECT_NE(std::string(e.what()).find("flashattn: " + argument + ":"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(topic), std::string::npos) << e.what();
  } catch (const flashattn::Error& e) {
    EXPECT_EQ(kind, Expect::error) << "plain Error where NotSupported was expected: " << e.what();
    EXPECT_NE(std::string(e.what()).find("flashattn: " + argument + ":"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(topic), std::string::npos) << e.what();
  }
  for (std::size_t i = 0; i < watched.size(); ++i)
    EXPECT_TRUE(watched[i]->bitwise_equal(before[i])) << "tensor " << i << " of the watched list was written";
}

// A valid padded problem: q [2, 17, 4, 32], k/v [2, 23, 2, 32] (GQA 2:1), float16.
struct Forward : ::testing::Test {
  HostTensor q{DType::float16, {2, 17, 4, 32}};
  HostTensor k{DType::float16, {2, 23, 2, 32}};
  HostTensor v{DType::float16, {2, 23, 2, 32}};
  HostTensor out{DType::float16, {2, 17, 4, 32}};
  HostTensor lse{DType::float32, {2, 4, 17}};
  ForwardArgs args;

  void SetUp() override {
    q.fill_random(1);
    k.fill_random(2);
    v.fill_random(3);
    args.q = q.view();
    args.k = k.view();
    args.v = v.view();
    args.out = out.view();
    args.maybe_lse = lse.view();
  }
  void expect_rejected(const std::string& argument, const std::string& topic, Expect kind = Expect::error) {
    ::expect_rejected([&] { flashattn::forward(args); }, argument, topic, {&out, &lse, &q, &k, &v}, kind);
    EXPECT_NE(flashattn::why_unsupported(args), "");
  }
};

TEST_F(Forward, ValidArgumentsPassValidation) { EXPECT_EQ(flashattn::why_unsupported(args), ""); }

TEST_F(Forward, DtypeMismatch) {
  args.k.dtype = DType::bfloat16;
  expect_rejected("k", "dtype");
}
TEST_F(Forward, DtypeMismatchOfOutput) {
  args.out.dtype = DType::float32;
  expect_rejected("out", "dtype");
}
TEST_F(Forward, UnsupportedDtype) {
  for (TensorView* t : {&args.q, &args.k, &args.v, &args.out}) t->dtype = DType::int32;
  expect_rejected("q", "unsupported dtype");
}
TEST_F(Forward, DeviceMismatchFailsBeforeTouchingTheDevice) {
  // k claims to live on cuda:0 but points at host memory: validation must reject it
  // from the descriptors alone, in builds with and without CUDA.
  args.k.device = Device::cuda(0);
  expect_rejected("k", "device");
}
TEST_F(Forward, CudaTensorsWithoutCudaBackend) {
  if (flashattn::cuda_available()) GTEST_SKIP() << "a GPU is present";
  for (TensorView* t : {&args.q, &args.k, &args.v, &args.out, &args.maybe_lse}) t->device = Device::cuda(0);
  expect_rejected("q", "CUDA", Expect::not_supported);
}
TEST_F(Forward, WrongRank) {
  args.q = TensorView::contiguous(q.data(), DType::float16, {34, 4, 32});
  expect_rejected("q", "rank");
}
TEST_F(Forward, BatchMismatch) {
  args.k.shape[0] = 1;
  args.v.shape[0] = 1;
  expect_rejected("k", "batch");
}
TEST_F(Forward, HeadDimMismatch) {
  args.v.shape[3] = 16;
  expect_rejected("v", "head_dim");
}
TEST_F(Forward, KeyValueShapeMismatch) {
  args.v.shape[1] = 22;
  expect_rejected("v", "shape");
}
TEST_F(Forward, HeadsNotAMultipleOfKvHeads) {
  args.k = TensorView::contiguous(k.data(), DType::float16, {2, 23, 3, 32});
  args.v = TensorView::contiguous(v.data(), DType::float16, {2, 23, 3, 32});
  expect_rejected("k", "multiple of heads_kv");
}
TEST_F(Forward, LastDimensionNotContiguous) {
  args.q = TensorView::strided(q.data(), DType::float16, {2, 17, 4, 16}, {17 * 4 * 32, 4 * 32, 32, 2});
  args.out = TensorView::contiguous(out.data(), DType::float16, {2, 17, 4, 16});
  args.k.shape[3] = args.v.shape[3] = 16;
  expect_rejected("q", "contiguous");
}
TEST_F(Forward, NegativeStride) {
  args.k.strides[1] = -args.k.strides[1];
  expect_rejected("k", "negative stride");
}
TEST_F(Forward, NegativeSize) {
  args.q.shape[1] = -1;
  expect_rejected("q", "negative size");
}
TEST_F(Forward, NullDataPointer) {
  args.v.data = nullptr;
  expect_rejected("v", "null");
}
TEST_F(Forward, OutputWrongShape) {
  args.out = TensorView::contiguous(out.data(), DType::float16, {2, 16, 4, 32});
  expect_rejected("out", "shape");
}
TEST_F(Forward, OutputOverlapsInput) {
  args.out.data = q.data();
  expect_rejected("out", "overlaps q");
}
TEST_F(Forward, OutputPartiallyOverlapsInput) {
  // out starts in the middle of v: a partial overlap is as bad as aliasing.
  HostTensor big(DType::float16, {2 * 23 * 2 * 32 + 2 * 17 * 4 * 32});
  args.v.data = big.data();
  args.out.data = static_cast<std::uint16_t*>(big.data()) + 100;
  ::expect_rejected([&] { flashattn::forward(args); }, "out", "overlaps v", {&big, &lse});
}
TEST_F(Forward, LseOverlapsOutput) {
  // Two outputs sharing bytes: either may be named, with the other as the culprit.
  args.maybe_lse.data = out.data();
  expect_rejected("out", "overlaps lse");
}
TEST_F(Forward, LseWrongShape) {
  args.maybe_lse = TensorView::contiguous(lse.data(), DType::float32, {2, 17, 4});
  expect_rejected("lse", "shape");
}
TEST_F(Forward, LseWrongDtype) {
  args.maybe_lse.dtype = DType::float16;
  expect_rejected("lse", "dtype");
}
TEST_F(Forward, HeadDimZero) {
  for (TensorView* t : {&args.q, &args.k, &args.v, &args.out}) t->shape[3] = 0;
  expect_rejected("q", "head_dim");
}
TEST_F(Forward, HeadDimAboveTheBackendLimit) {
  HostTensor wide_q(DType::float16, {1, 1, 1, 4096}), wide_k(DType::float16, {1, 1, 1, 4096}),
      wide_v(DType::float16, {1, 1, 1, 4096}), wide_out(DType::float16, {1, 1, 1, 4096});
  args.q = wide_q.view(), args.k = wide_k.view(), args.v = wide_v.view(), args.out = wide_out.view();
  args.maybe_lse = {};
  ::expect_rejected([&] { flashattn::forward(args); }, "q", "head_dim", {&wide_out}, Expect::not_supported);
}
TEST_F(Forward, NonFiniteOrNonPositiveScale) {
  for (double scale : {0.0, -0.5, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    SCOPED_TRACE(scale);
    args.options.softmax_scale = scale;
    expect_rejected("softmax_scale", "finite");
  }
}
// Judged as the kernels see them: float32, times log2(e). 1e-50 becomes 0 (softcap
// "off"), 1e-40 a subnormal the GPU flushes to 0, 1e39 inf.
TEST_F(Forward, ScaleOrSoftcapOutsideTheFloat32Range) {
  for (double value : {1e-50, 1e-40, 1e39, 3e38}) {
    SCOPED_TRACE(value);
    args.options.softmax_scale = value;
    expect_rejected("softmax_scale", "out of range");
    args.options.softmax_scale.reset();
    args.options.softcap = value;
    expect_rejected("softcap", "out of range");
    args.options.softcap = 0.0;
  }
  args.options.softmax_scale = 1e-30;  // small but a normal float32: accepted
  args.options.softcap = 1e30;
  EXPECT_EQ(flashattn::why_unsupported(args), "");
}
TEST_F(Forward, NumThreadsOutOfRange) {
  for (int threads : {-1, 100000}) {
    SCOPED_TRACE(threads);
    ::expect_rejected([&] { flashattn::forward(args, flashattn::ExecutionContext{nullptr, threads}); }, "num_threads", "1024",
                      {&out, &lse});
  }
}
TEST_F(Forward, InvalidWindow) {
  args.options.window_left = -2;
  expect_rejected("window_left", "-1");
  args.options.window_left = 4;
  args.options.window_right = -7;
  expect_rejected("window_right", "-1");
}
// flash_attn's rule: causal with a window keeps window_left and uses window_right = 0.
TEST_F(Forward, CausalWithAWindowIsAccepted) {
  args.options.window_left = 4;
  args.options.window_right = 3;
  args.options.causal = true;
  EXPECT_EQ(flashattn::why_unsupported(args), "");
}
TEST_F(Forward, NegativeOrNonFiniteSoftcap) {
  for (double softcap : {-1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(softcap);
    args.options.softcap = softcap;
    expect_rejected("softcap", ">= 0");
  }
}
TEST_F(Forward, DropoutIsAccepted) {
  args.options.dropout_p = 0.1;
  EXPECT_EQ(flashattn::why_unsupported(args), "");
}
TEST_F(Forward, DropoutNegative) {
  args.options.dropout_p = -0.1;
  expect_rejected("dropout_p", "[0, 1)");
}
TEST_F(Forward, DropoutSeedOffsetWrongDtypeOrShape) {
  HostTensor seed_offset(DType::int32, {2});
  args.options.dropout_p = 0.1;
  args.options.maybe_dropout_seed_offset = seed_offset.view();
  expect_rejected("dropout_seed_offset", "dtype");
  HostTensor three(DType::int64, {3});
  args.options.maybe_dropout_seed_offset = three.view();
  expect_rejected("dropout_seed_offset", "shape");
}
TEST_F(Forward, AlibiSlopesShapeDtypeDevice) {
  HostTensor per_head(DType::float32, {4}), per_batch_head(DType::float32, {2, 4});
  args.options.maybe_alibi_slopes = per_head.view();
  EXPECT_EQ(flashattn::why_unsupported(args), "");
  args.options.maybe_alibi_slopes = per_batch_head.view();
  EXPECT_EQ(flashattn::why_unsupported(args), "");
  HostTensor wrong_heads(DType::float32, {3});
  args.options.maybe_alibi_slopes = wrong_heads.view();
  expect_rejected("alibi_slopes", "shape");
  HostTensor wrong_dtype(DType::float16, {4});
  args.options.maybe_alibi_slopes = wrong_dtype.view();
  expect_rejected("alibi_slopes", "dtype");
  args.options.maybe_alibi_slopes = per_head.view();
  args.options.maybe_alibi_slopes.device = Device::cuda(0);
  expect_rejected("alibi_slopes", "device");
}
TEST_F(Forward, AlibiSlopesOverlappingOutputAreRejected) {
  args.options.maybe_alibi_slopes = TensorView::contiguous(out.data(), DType::float32, {4});
  expect_rejected("out", "overlap");
}
TEST_F(Forward, DropoutOutOfRange) {
  args.options.dropout_p = 1.5;
  expect_rejected("dropout_p", "[0, 1)");
}
TEST_F(Forward, UnknownAlgorithm) {
  args.options.algorithm = static_cast<Algorithm>(9);
  expect_rejected("algorithm", "unknown");
}
TEST_F(Forward, ElementCountOverflowsInt64) {
  // 2^40 * 2^40 elements: the view's size alone must be rejected, naming the tensor.
  const std::int64_t huge = std::int64_t{1} << 40;
  args.q.shape[0] = huge;
  args.q.shape[1] = huge;
  expect_rejected("q", "overflows int64");
}
TEST_F(Forward, ByteExtentOverflowsInt64) {
  // Few elements, but strides that put the last one beyond int64 bytes.
  args.k.strides[0] = std::int64_t{1} << 62;
  expect_rejected("k", "overflows int64");
}

// A valid variable-length problem: two sequences, q rows 10 + 20, k rows 25 + 15.
struct Varlen : ::testing::Test {
  HostTensor q{DType::float32, {30, 4, 16}};
  HostTensor k{DType::float32, {40, 2, 16}};
  HostTensor v{DType::float32, {40, 2, 16}};
  HostTensor out{DType::float32, {30, 4, 16}};
  HostTensor lse{DType::float32, {4, 30}};
  HostTensor cu_q{DType::int32, {3}};
  HostTensor cu_k{DType::int32, {3}};
  ForwardArgs args;

  static void set_int32(HostTensor& t, std::vector<std::int32_t> values) {
    std::memcpy(t.data(), values.data(), values.size() * sizeof(std::int32_t));
  }
  void SetUp() override {
    q.fill_random(1);
    k.fill_random(2);
    v.fill_random(3);
    set_int32(cu_q, {0, 10, 30});
    set_int32(cu_k, {0, 25, 40});
    args.q = q.view();
    args.k = k.view();
    args.v = v.view();
    args.out = out.view();
    args.maybe_lse = lse.view();
    args.maybe_varlen = flashattn::VarlenArgs{cu_q.view(), cu_k.view(), 20, 25};
  }
  void expect_rejected(const std::string& argument, const std::string& topic) {
    ::expect_rejected([&] { flashattn::forward(args); }, argument, topic, {&out, &lse});
  }
};

TEST_F(Varlen, ValidArgumentsPassValidation) { EXPECT_EQ(flashattn::why_unsupported(args), ""); }

TEST_F(Varlen, CuSeqlensNotStartingAtZero) {
  set_int32(cu_q, {1, 10, 30});
  args.maybe_varlen->cu_seqlens_q = cu_q.view();
  ::expect_rejected([&] { flashattn::forward(args); }, "cu_seqlens_q", "start at 0", {&out, &lse});
}
TEST_F(Varlen, CuSeqlensDecreasing) {
  set_int32(cu_k, {0, 25, 20});
  args.maybe_varlen->cu_seqlens_k = cu_k.view();
  ::expect_rejected([&] { flashattn::forward(args); }, "cu_seqlens_k", "non-decreasing", {&out, &lse});
}
TEST_F(Varlen, SequenceLongerThanMaxSeqlen) {
  args.maybe_varlen->max_seqlen_q = 19;
  expect_rejected("max_seqlen_q", "> max_seqlen_q");
}
// 2^62 and 2^63 - 1 used to size the work (and overflow it); no sequence can be longer
// than the rows that exist.
TEST_F(Varlen, MaxSeqlenBeyondTheRowsThatExist) {
  for (std::int64_t huge : {std::int64_t{31}, std::int64_t{1} << 62, std::numeric_limits<std::int64_t>::max()}) {
    SCOPED_TRACE(huge);
    args.maybe_varlen->max_seqlen_q = huge;
    expect_rejected("max_seqlen_q", "rows of q");
    args.maybe_varlen->max_seqlen_q = 20;
    args.maybe_varlen->max_seqlen_k = huge + (huge == 31 ? 10 : 0);
    expect_rejected("max_seqlen_k", "rows of k");
    args.maybe_varlen->max_seqlen_k = 25;
  }
}
TEST_F(Varlen, NegativeMaxSeqlen) {
  args.maybe_varlen->max_seqlen_k = -1;
  expect_rejected("max_seqlen_k", ">= 0");
}
TEST_F(Varlen, LastEntryBeyondTotalRows) {
  set_int32(cu_k, {0, 25, 41});
  args.maybe_varlen->cu_seqlens_k = cu_k.view();
  args.maybe_varlen->max_seqlen_k = 25;
  ::expect_rejected([&] { flashattn::forward(args); }, "cu_seqlens_k", "last entry", {&out, &lse});
}
TEST_F(Varlen, CuSeqlensWrongDtype) {
  args.maybe_varlen->cu_seqlens_q.dtype = DType::float32;
  expect_rejected("cu_seqlens_q", "dtype");
}
TEST_F(Varlen, CuSeqlensWrongLength) {
  HostTensor longer(DType::int32, {4});
  set_int32(longer, {0, 25, 40, 40});
  args.maybe_varlen->cu_seqlens_k = longer.view();
  expect_rejected("cu_seqlens_k", "batch + 1");
}
TEST_F(Varlen, CuSeqlensMissing) {
  args.maybe_varlen->cu_seqlens_q = {};
  expect_rejected("cu_seqlens_q", "shape [batch + 1]");
}
TEST_F(Varlen, CuSeqlensOnAnotherDevice) {
  args.maybe_varlen->cu_seqlens_k.device = Device::cuda(0);
  expect_rejected("cu_seqlens_k", "device");
}
TEST_F(Varlen, PaddedRankIsRejected) {
  args.q = TensorView::contiguous(q.data(), DType::float32, {1, 30, 4, 16});
  expect_rejected("q", "rank");
}
TEST_F(Varlen, LseInPaddedLayoutIsRejected) {
  args.maybe_lse = TensorView::contiguous(lse.data(), DType::float32, {2, 4, 15});
  expect_rejected("lse", "rank");
}

// A valid backward problem, float32: q [1, 9, 4, 16], k/v [1, 11, 2, 16].
struct Backward : ::testing::Test {
  HostTensor q{DType::float32, {1, 9, 4, 16}};
  HostTensor k{DType::float32, {1, 11, 2, 16}};
  HostTensor v{DType::float32, {1, 11, 2, 16}};
  HostTensor out{DType::float32, {1, 9, 4, 16}};
  HostTensor dout{DType::float32, {1, 9, 4, 16}};
  HostTensor lse{DType::float32, {1, 4, 9}};
  HostTensor dq{DType::float32, {1, 9, 4, 16}};
  HostTensor dk{DType::float32, {1, 11, 2, 16}};
  HostTensor dv{DType::float32, {1, 11, 2, 16}};
  BackwardArgs args;

  void SetUp() override {
    for (HostTensor* t : {&q, &k, &v, &out, &dout, &lse}) t->fill_random(7);
    args.q = q.view(), args.k = k.view(), args.v = v.view();
    args.out = out.view(), args.dout = dout.view(), args.lse = lse.view();
    args.dq = dq.view(), args.dk = dk.view(), args.dv = dv.view();
  }
  void expect_rejected(const std::string& argument, const std::string& topic) {
    ::expect_rejected([&] { flashattn::backward(args); }, argument, topic, {&dq, &dk, &dv, &dout, &out, &lse});
    EXPECT_THROW((void)flashattn::backward_workspace_bytes(args), flashattn::Error);
  }
};

TEST_F(Backward, ValidArgumentsPassValidation) { EXPECT_EQ(flashattn::backward_workspace_bytes(args), 0u); }

TEST_F(Backward, MissingLse) {
  args.lse = {};
  expect_rejected("lse", "missing");
}
TEST_F(Backward, DqOverlapsDout) {
  args.dq.data = dout.data();
  expect_rejected("dq", "overlaps dout");
}
TEST_F(Backward, DkOverlapsDv) {
  args.dk.data = dv.data();
  expect_rejected("dk", "overlaps dv");
}
TEST_F(Backward, WrongDkShape) {
  // dk must have k's shape, not q's (GQA sums the group's gradients into kv heads).
  HostTensor wrong(DType::float32, {1, 11, 4, 16});
  args.dk = wrong.view();
  ::expect_rejected([&] { flashattn::backward(args); }, "dk", "shape", {&dq, &wrong, &dv});
}
TEST_F(Backward, WrongDoutShape) {
  args.dout.shape[1] = 8;
  expect_rejected("dout", "shape");
}
TEST_F(Backward, GradientDtypeMismatch) {
  args.dv.dtype = DType::float16;
  expect_rejected("dv", "dtype");
}
TEST_F(Backward, LseWrongShape) {
  args.lse = TensorView::contiguous(lse.data(), DType::float32, {1, 9, 4});
  expect_rejected("lse", "shape");
}
TEST_F(Backward, DropoutOutOfRange) {
  args.options.dropout_p = 1.0;
  ::expect_rejected([&] { flashattn::backward(args); }, "dropout_p", "[0, 1)", {&dq, &dk, &dv});
}
TEST_F(Backward, WorkspaceOnAnotherDevice) {
  HostTensor workspace(DType::uint8, {64});
  args.maybe_workspace = workspace.view();
  args.maybe_workspace.device = Device::cuda(0);
  ::expect_rejected([&] { flashattn::backward(args); }, "workspace", "device", {&dq, &dk, &dv});
}

// merge_attention_states(out_a, lse_a, out_b, lse_b, out, lse): [batch, seqlen, heads, dim].
struct Merge : ::testing::Test {
  HostTensor out_a{DType::float32, {2, 5, 3, 8}};
  HostTensor out_b{DType::float32, {2, 5, 3, 8}};
  HostTensor out{DType::float32, {2, 5, 3, 8}};
  HostTensor lse_a{DType::float32, {2, 3, 5}};
  HostTensor lse_b{DType::float32, {2, 3, 5}};
  HostTensor lse{DType::float32, {2, 3, 5}};
  TensorView a, la, b, lb, o, lo;

  void SetUp() override {
    for (HostTensor* t : {&out_a, &out_b, &lse_a, &lse_b}) t->fill_random(11);
    a = out_a.view(), la = lse_a.view(), b = out_b.view(), lb = lse_b.view(), o = out.view(), lo = lse.view();
  }
  void expect_rejected(const std::string& argument, const std::string& topic) {
    ::expect_rejected([&] { flashattn::merge_attention_states(a, la, b, lb, o, lo); }, argument, topic,
                      {&out, &lse, &out_a, &out_b, &lse_a, &lse_b});
  }
};

TEST_F(Merge, ValidArgumentsRun) {
  flashattn::merge_attention_states(a, la, b, lb, o, lo);
  for (std::int64_t i = 0; i < lse.numel(); ++i) EXPECT_FALSE(std::isnan(lse.get(i)));
}
TEST_F(Merge, OutBShapeMismatch) {
  b.shape[1] = 4;
  expect_rejected("out_b", "shape");
}
TEST_F(Merge, OutWrongShape) {
  o.shape[3] = 7;
  expect_rejected("out", "shape");
}
TEST_F(Merge, LseAWrongShape) {
  la = TensorView::contiguous(lse_a.data(), DType::float32, {2, 5, 3});
  expect_rejected("lse_a", "shape");
}
TEST_F(Merge, LseWrongDtype) {
  lo.dtype = DType::float16;
  expect_rejected("lse", "dtype");
}
TEST_F(Merge, WrongRank) {
  a = TensorView::contiguous(out_a.data(), DType::float32, {10, 3, 8});
  expect_rejected("out_a", "rank");
}
TEST_F(Merge, UnsupportedDtype) {
  a.dtype = b.dtype = o.dtype = DType::int32;
  expect_rejected("out_a", "unsupported dtype");
}
TEST_F(Merge, OutPartiallyOverlapsAnInput) {
  o.data = static_cast<float*>(out_b.data()) + 1;
  expect_rejected("out", "overlaps out_b");
}
TEST_F(Merge, LseOverlapsOut) {
  lo.data = out.data();
  expect_rejected("lse", "overlaps");
}

}  // namespace
