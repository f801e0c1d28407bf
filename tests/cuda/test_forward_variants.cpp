// tests/cuda/test_forward_variants.cpp — the sm80 forward kernel (Algorithm::flash2,
// src/cuda/fwd/kernel.cuh) with ALiBi and dropout against the float64 CPU reference
// computed on host copies with the same options, with the STYLE.md tolerance rule on
// out and LSE, over awkward shapes (seqlen_q != seqlen_k both ways, tails, GQA,
// causal, windows, softcap, varlen with empty sequences, every kernel head dim).
//
// Dropout: the reference draws its mask from the same (seed, offset) through
// DropoutRule::keep, so agreement within tolerance proves the masks agree bit for
// bit (one flipped decision moves an output by ~|v| / ((1 - p) · rows), far beyond
// it). Also: the same (seed, offset) gives bitwise-identical outputs, another seed
// gives another output, and {seed, offset} read from a device tensor equals the
// same values passed by value. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "src/core/backend.hpp"
#include "src/core/validate.hpp"
#include "tests/cuda/device_problem.hpp"

namespace flashattn::testing {
namespace {

// The variant options of one case (on top of ProblemShape's mask and softcap).
struct Variant {
  enum class Alibi { none, per_head, per_batch_head } alibi = Alibi::none;
  double dropout_p = 0.0;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;

  std::string describe() const {
    std::ostringstream s;
    if (alibi != Alibi::none) s << (alibi == Alibi::per_head ? " alibi[h]" : " alibi[b,h]");
    if (dropout_p > 0) s << " dropout" << dropout_p << " seed" << dropout_seed << " offset" << dropout_offset;
    return s.str();
  }
};

struct VariantCase {
  ProblemShape shape;
  Variant variant;
};
void PrintTo(const VariantCase& c, std::ostream* os) { *os << c.shape.describe() << c.variant.describe(); }

Variant alibi(Variant::Alibi kind) { return Variant{kind}; }
Variant dropout(double p, std::uint64_t seed = 42, std::uint64_t offset = 7) {
  Variant v;
  v.dropout_p = p, v.dropout_seed = seed, v.dropout_offset = offset;
  return v;
}
Variant with_alibi(Variant v, Variant::Alibi kind) { return v.alibi = kind, v; }

// ALiBi's geometric slopes 2^(-8 (h + 1) / heads), varied per sequence for [batch, heads].
HostTensor make_slopes(const ProblemShape& shape, Variant::Alibi kind) {
  const bool per_batch = kind == Variant::Alibi::per_batch_head;
  HostTensor slopes = per_batch ? HostTensor(DType::float32, {shape.batch, shape.heads_q})
                                : HostTensor(DType::float32, {shape.heads_q});
  for (std::int64_t b = 0; b < (per_batch ? shape.batch : 1); ++b)
    for (std::int64_t h = 0; h < shape.heads_q; ++h)
      slopes.set(b * shape.heads_q + h,
                 static_cast<float>(std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(shape.heads_q)) *
                                    (1.0 + 0.25 * static_cast<double>(b))));
  return slopes;
}

// One problem with its variant: host arguments for the reference, the sm80 forward
// on the device.
class VariantRun {
 public:
  VariantRun(const ProblemShape& shape, const Variant& variant, std::uint64_t seed = 1)
      : variant_(variant), problem_(shape, seed), device_(problem_) {
    if (variant.alibi != Variant::Alibi::none) {
      slopes_ = make_slopes(shape, variant.alibi);
      device_slopes_ = DeviceBuffer(host_bytes(slopes_));
      device_slopes_.upload(slopes_.data());
    }
  }

  AttentionProblem& problem() { return problem_; }

  // The CPU-side parameters of the call (host views of every input).
  AttentionParams host_params() {
    ForwardArgs args = problem_.forward_args(Algorithm::flash2);
    apply_variant(args.options, slopes_.numel() > 0 ? view_of(slopes_, slopes_.data(), Device::cpu()) : TensorView{});
    return validate_forward(args);
  }

  // Poison out/LSE, run the sm80 kernel, download. `maybe_seed_offset`: a device int64
  // {seed, offset} tensor to read them from instead of the options.
  void run(const TensorView& maybe_seed_offset = {}) {
    device_.poison_outputs();
    ForwardArgs args = device_.forward_args();
    args.options.algorithm = Algorithm::flash2;
    apply_variant(args.options, slopes_.numel() > 0 ? view_of(slopes_, device_slopes_.data(), Device::cuda(0))
                                                    : TensorView{});
    args.options.maybe_dropout_seed_offset = maybe_seed_offset;
    forward(args, ExecutionContext{});
    cuda_or_throw(cudaDeviceSynchronize(), "sm80 forward on the device");
    device_.download_outputs();
  }

  // out and LSE against the float64 reference of the same options: the STYLE.md rule.
  void expect_matches_reference(const std::string& label) {
    const AttentionParams params = host_params();
    const cpu::ReferenceResult ref = cpu::reference_forward(params);
    const cpu::ReferenceResult low = cpu::naive_forward_in_precision(params, params.dtype);
    const cpu::ReferenceResult got = gather_output(problem_);
    const double floor = tolerance_floor(params.dtype);
    expect_within("out", got.out, ref.out, low.out, floor, params.heads_q * params.head_dim, label);
    expect_within("lse", got.lse, ref.lse, low.lse, floor, params.heads_q, label);
  }

 private:
  void apply_variant(AttentionOptions& options, const TensorView& slopes) const {
    options.maybe_alibi_slopes = slopes;
    options.dropout_p = variant_.dropout_p;
    options.dropout_seed = variant_.dropout_seed;
    options.dropout_offset = variant_.dropout_offset;
  }
  static TensorView view_of(HostTensor& host, void* data, Device device) {
    TensorView t = host.view();
    t.data = data;
    t.device = device;
    return t;
  }
  // max|got - ref| <= 2 max|low - ref| + floor; on failure, names the worst element as
  // (packed row, head[, column]) with both values.
  static void expect_within(const char* what, const std::vector<double>& got, const std::vector<double>& ref,
                            const std::vector<double>& low, double floor, std::int64_t row_size,
                            const std::string& label) {
    const double error = max_abs_difference(got, ref);
    const double bound = 2.0 * max_abs_difference(low, ref) + floor;
    if (error <= bound) return;
    std::size_t worst = 0;
    double worst_error = -1.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double e = std::isfinite(got[i]) && std::isfinite(ref[i]) ? std::abs(got[i] - ref[i])
                       : got[i] == ref[i]                             ? 0.0
                                                                      : INFINITY;
      if (e > worst_error) worst_error = e, worst = i;
    }
    ADD_FAILURE() << label << " (" << what << "): max error " << error << " > bound " << bound << "; worst at packed row "
                  << static_cast<std::int64_t>(worst) / row_size << ", element " << static_cast<std::int64_t>(worst) % row_size
                  << " of the row: got " << got[worst] << ", reference " << ref[worst];
  }

  Variant variant_;
  AttentionProblem problem_;
  DeviceProblem device_;
  HostTensor slopes_;
  DeviceBuffer device_slopes_;
};

class Sm80ForwardVariants : public ::testing::TestWithParam<VariantCase> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(Sm80ForwardVariants, MatchesFloat64Reference) {
  const VariantCase& c = GetParam();
  if (c.shape.head_dim > cuda::limits().max_head_dim) GTEST_SKIP() << "head_dim " << c.shape.head_dim << " not built";
  VariantRun run(c.shape, c.variant);
  run.run();
  run.expect_matches_reference(c.shape.describe() + c.variant.describe());
}

std::vector<VariantCase> variant_cases() {
  std::vector<VariantCase> cases;
  const Variant::Alibi kHead = Variant::Alibi::per_head, kBatchHead = Variant::Alibi::per_batch_head;
  for (DType t : {DType::float16, DType::bfloat16}) {
    const std::vector<ProblemShape> shapes = {
        make(t, 2, 113, 113, 2, 2, 64),
        make(t, 2, 17, 300, 2, 2, 128),                  // seqlen_q < seqlen_k
        make(t, 2, 300, 17, 2, 2, 128),                  // seqlen_q > seqlen_k
        causal(make(t, 1, 203, 203, 2, 2, 128)),
        causal(make(t, 1, 300, 40, 2, 2, 64)),           // fully masked rows
        causal(make(t, 1, 40, 300, 2, 2, 96)),
        make(t, 2, 97, 113, 8, 2, 64),                   // GQA 4:1
        causal(make(t, 1, 130, 130, 8, 1, 32)),          // MQA
        window(make(t, 1, 257, 300, 2, 2, 64), 32, 0),
        window(make(t, 1, 200, 150, 2, 2, 192), 20, 20),
        softcap(make(t, 1, 150, 170, 2, 1, 64), 5.0),
        softcap(causal(make(t, 1, 170, 150, 2, 2, 128)), 2.0),
        make(t, 1, 129, 97, 2, 2, 256),
        varlen(make(t, 0, 0, 0, 2, 1, 64), {5, 0, 1, 130, 0, 17}, {9, 3, 0, 64, 0, 129}),
        causal(varlen(make(t, 0, 0, 0, 2, 2, 128), {129, 1, 30, 0}, {140, 1, 12, 7})),
    };
    for (const ProblemShape& shape : shapes) {
      cases.push_back({shape, alibi(kHead)});
      cases.push_back({shape, alibi(kBatchHead)});
      cases.push_back({shape, dropout(0.1)});
      cases.push_back({shape, dropout(0.5, 1234567890123ull, 0x100000003ull)});
    }
    // Both together, with softcap and a window.
    cases.push_back({softcap(window(make(t, 2, 203, 113, 4, 2, 64), 40, 8), 3.0), with_alibi(dropout(0.3), kBatchHead)});
    cases.push_back({causal(varlen(make(t, 0, 0, 0, 4, 2, 128), {113, 0, 77}, {203, 5, 77})), with_alibi(dropout(0.2), kHead)});
    // Many key blocks on each side of the diagonal (ALiBi's affine form there, the
    // per-element form across it; FLASHATTN_CUDA_ALIBI_PATH=generic runs the same cases
    // with the per-element form everywhere): every kernel tile (block_n 64 and 32, one
    // and two m16 tiles per warp), seqlen_q != seqlen_k both ways, sequence offsets,
    // window_left 0 (every block on the right), with dropout.
    cases.push_back({make(t, 1, 700, 1000, 2, 2, 128), alibi(kHead)});
    cases.push_back({causal(make(t, 1, 900, 700, 2, 2, 64)), alibi(kBatchHead)});
    cases.push_back({causal(make(t, 1, 700, 1000, 2, 1, 256)), alibi(kHead)});
    cases.push_back({make(t, 1, 600, 450, 2, 2, 96), alibi(kBatchHead)});
    cases.push_back({causal(varlen(make(t, 0, 0, 0, 2, 2, 128), {129, 1, 0, 300, 700}, {140, 1, 7, 300, 1000})),
                     alibi(kBatchHead)});
    cases.push_back({window(make(t, 1, 300, 650, 2, 2, 64), 0, 40), alibi(kHead)});
    cases.push_back({window(make(t, 1, 650, 500, 2, 2, 192), 300, 200), alibi(kBatchHead)});
    cases.push_back({make(t, 2, 500, 700, 4, 2, 32), with_alibi(dropout(0.25), kBatchHead)});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AwkwardShapes, Sm80ForwardVariants, ::testing::ValuesIn(variant_cases()));

class Sm80ForwardDropout : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
  static std::vector<unsigned char> bytes_of(const HostTensor& t) {
    const auto* p = static_cast<const unsigned char*>(t.data());
    return {p, p + static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype())};
  }
};

TEST_F(Sm80ForwardDropout, SameSeedAndOffsetAreBitwiseIdentical) {
  const ProblemShape shape = causal(make(DType::bfloat16, 2, 300, 333, 4, 2, 128));
  VariantRun run(shape, dropout(0.5, 99, 3));
  run.run();
  const auto out = bytes_of(run.problem().out), lse = bytes_of(run.problem().lse);
  for (int repeat = 1; repeat < 10; ++repeat) {
    run.run();
    ASSERT_EQ(bytes_of(run.problem().out), out) << "run " << repeat;
    ASSERT_EQ(bytes_of(run.problem().lse), lse) << "run " << repeat;
  }
}

TEST_F(Sm80ForwardDropout, OtherSeedOrOffsetGivesOtherOutputSameLse) {
  const ProblemShape shape = make(DType::float16, 1, 129, 200, 2, 2, 64);
  VariantRun first(shape, dropout(0.1, 5, 0)), other_seed(shape, dropout(0.1, 6, 0)),
      other_offset(shape, dropout(0.1, 5, 1));
  for (VariantRun* run : {&first, &other_seed, &other_offset}) run->run();
  EXPECT_NE(bytes_of(first.problem().out), bytes_of(other_seed.problem().out));
  EXPECT_NE(bytes_of(first.problem().out), bytes_of(other_offset.problem().out));
  // The LSE is that of the undropped softmax.
  EXPECT_EQ(bytes_of(first.problem().lse), bytes_of(other_seed.problem().lse));
}

TEST_F(Sm80ForwardDropout, SeedOffsetTensorEqualsHostValues) {
  const ProblemShape shape = causal(make(DType::bfloat16, 2, 150, 170, 4, 1, 128));
  const std::uint64_t seed = 0x123456789abcdefull, offset = 0x2000000011ull;  // both words of each matter
  VariantRun by_value(shape, dropout(0.25, seed, offset));
  by_value.run();
  by_value.expect_matches_reference("seed/offset by value");
  // The same values from device memory; the options' own seed/offset are ignored then.
  const std::int64_t host_seed_offset[2] = {static_cast<std::int64_t>(seed), static_cast<std::int64_t>(offset)};
  DeviceBuffer seed_offset(sizeof(host_seed_offset));
  seed_offset.upload(host_seed_offset);
  VariantRun from_tensor(shape, dropout(0.25, 0, 0));
  from_tensor.run(TensorView::contiguous(seed_offset.data(), DType::int64, {2}, Device::cuda(0)));
  EXPECT_EQ(bytes_of(by_value.problem().out), bytes_of(from_tensor.problem().out));
  EXPECT_EQ(bytes_of(by_value.problem().lse), bytes_of(from_tensor.problem().lse));
}

}  // namespace
}  // namespace flashattn::testing
