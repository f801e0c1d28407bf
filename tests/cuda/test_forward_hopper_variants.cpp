// tests/cuda/test_forward_hopper_variants.cpp — the Hopper (sm_90a) forward kernel with
// ALiBi and dropout, through the public API with algorithm = flash3:
//   - against the float64 CPU reference (the STYLE.md tolerance rule, out and LSE) with
//     ALiBi slopes per head and per (batch, head), dropout p = 0.1 and 0.5 (the
//     reference draws the same mask from the same seed/offset: a different mask moves
//     the output far beyond the tolerance), over tails, seqlen_q != seqlen_k both ways,
//     GQA, varlen with empty sequences, causal, windows, softcap, persistent grids;
//   - the dropout mask read back exactly: with q = 0 (uniform P = 1/n, n a power of
//     two) and V rows e_(j mod d) * 2^-(j / d), every output element is a sum of
//     distinct powers of two whose bits are the keep decisions of its row, so each
//     element's decision is compared with DropoutRule::keep on the host;
//   - same (seed, offset) twice: bitwise-identical outputs; the seed/offset given as a
//     device int64 tensor equals the same values given on the host.
// Every test skips without a GPU, without flash3 in the build, or off compute 9.0.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "flashattn/dropout.hpp"
#include "src/core/backend.hpp"
#include "src/core/validate.hpp"
#include "src/cpu/reference.hpp"
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

std::vector<unsigned char> bytes_of(const HostTensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  return {p, p + static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype())};
}

enum class Slopes { none, per_head, per_batch_head };

struct VariantCase {
  ProblemShape shape;
  Slopes slopes = Slopes::none;
  double dropout_p = 0.0;
  std::uint64_t dropout_seed = 0x1234'5678'9abc'def0ull;
  std::uint64_t dropout_offset = 0x0000'0007'0000'0040ull;  // a high word: both Philox key halves vary

  std::string describe() const {
    std::string s = shape.describe();
    if (slopes == Slopes::per_head) s += " alibi[h]";
    if (slopes == Slopes::per_batch_head) s += " alibi[b,h]";
    if (dropout_p > 0.0) s += " dropout" + std::to_string(dropout_p);
    return s;
  }
};
void PrintTo(const VariantCase& c, std::ostream* os) { *os << c.describe(); }

VariantCase with_alibi(ProblemShape shape, Slopes slopes = Slopes::per_head) {
  VariantCase c;
  c.shape = std::move(shape), c.slopes = slopes;
  return c;
}
VariantCase with_dropout(ProblemShape shape, double p) {
  VariantCase c;
  c.shape = std::move(shape), c.dropout_p = p;
  return c;
}
VariantCase with_alibi(VariantCase c, Slopes slopes = Slopes::per_batch_head) { return c.slopes = slopes, c; }

// One problem of a case: the host buffers (AttentionProblem), their device mirrors,
// the slopes on both sides, and the options of each side.
class VariantRun {
 public:
  explicit VariantRun(const VariantCase& variant, std::uint64_t data_seed = 1)
      : variant_(variant), problem(variant.shape, data_seed) {
    const ProblemShape& s = variant.shape;
    if (variant.slopes != Slopes::none) {
      // flash_attn's geometric slopes 2^(-8 (h + 1) / heads), varied per batch entry
      // in the [batch, heads] form (so a kernel reading the wrong entry shows).
      const std::int64_t batch = variant.slopes == Slopes::per_batch_head ? s.batch : 1;
      slopes = variant.slopes == Slopes::per_batch_head ? HostTensor(DType::float32, {batch, s.heads_q})
                                                        : HostTensor(DType::float32, {s.heads_q});
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t h = 0; h < s.heads_q; ++h)
          slopes.set(b * s.heads_q + h, static_cast<float>(std::exp2(-8.0 * static_cast<double>(h + 1) /
                                                                      static_cast<double>(s.heads_q)) *
                                                            (1.0 + 0.25 * static_cast<double>(b % 3))));
      slopes_device = DeviceBuffer(host_bytes(slopes));
      slopes_device.upload(slopes.data());
    }
  }

  // The case's ALiBi/dropout options on top of `options`; slopes on the host or device.
  AttentionOptions with_variant(AttentionOptions options, bool on_device) {
    if (variant_.slopes != Slopes::none) {
      TensorView view = slopes.view();
      if (on_device) {
        view.data = slopes_device.data();
        view.device = Device::cuda(0);
      }
      options.maybe_alibi_slopes = view;
    }
    options.dropout_p = variant_.dropout_p;
    options.dropout_seed = variant_.dropout_seed;
    options.dropout_offset = variant_.dropout_offset;
    return options;
  }

  // Poison out/LSE, run flash3 on the device, download. `maybe_seed_offset`: a device
  // int64 {seed, offset} tensor to pass instead of the host values.
  void run_gpu(DeviceProblem& device, const TensorView* maybe_seed_offset = nullptr) {
    device.poison_outputs();
    ForwardArgs args = device.forward_args();
    args.options = with_variant(args.options, true);
    args.options.algorithm = Algorithm::flash3;
    if (maybe_seed_offset != nullptr) {
      args.options.dropout_seed = 0;
      args.options.dropout_offset = 0;
      args.options.maybe_dropout_seed_offset = *maybe_seed_offset;
    }
    forward(args);
    cuda_or_throw(cudaDeviceSynchronize(), "flash3 forward on the device");
    cuda_or_throw(cudaGetLastError(), "flash3 forward on the device");
    device.download_outputs();
  }

  // The host view of the same call: params for the float64 reference.
  AttentionParams host_params() {
    ForwardArgs args = problem.forward_args();
    args.options = with_variant(args.options, false);
    return validate_forward(args);
  }

  // out and LSE against the float64 reference of the same call (STYLE.md rule).
  void expect_matches_reference(const std::string& label) {
    const AttentionParams params = host_params();
    const cpu::ReferenceResult ref = cpu::reference_forward(params);
    const cpu::ReferenceResult low = cpu::naive_forward_in_precision(params, params.dtype);
    const cpu::ReferenceResult got = gather_output(problem);
    const double floor = tolerance_floor(params.dtype);
    const double out_error = max_abs_difference(got.out, ref.out);
    const double out_bound = 2.0 * max_abs_difference(low.out, ref.out) + floor;
    EXPECT_LE(out_error, out_bound) << label << " (out: max |flash3 - ref64| vs 2x the "
                                    << dtype_name(params.dtype) << " naive error + floor)";
    const double lse_error = max_abs_difference(got.lse, ref.lse);
    const double lse_bound = 2.0 * max_abs_difference(low.lse, ref.lse) + floor;
    EXPECT_LE(lse_error, lse_bound) << label << " (lse)";
  }

  AttentionProblem problem;
  HostTensor slopes;
  DeviceBuffer slopes_device;

 private:
  VariantCase variant_;
};

class HopperVariantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    if (!is_flash3_built()) GTEST_SKIP() << "no flash3 kernel in this build (sm_90a not built)";
    if (device_capability() != 90) GTEST_SKIP() << "flash3 needs compute capability 9.0";
  }
  static bool is_built(std::int64_t head_dim) { return head_dim <= cuda::limits().max_head_dim; }

  static void check_against_reference(const VariantCase& variant, std::uint64_t data_seed = 1) {
    if (!is_built(variant.shape.head_dim)) GTEST_SKIP() << "head_dim " << variant.shape.head_dim << " not built";
    VariantRun run(variant, data_seed);
    DeviceProblem device(run.problem);
    run.run_gpu(device);
    run.expect_matches_reference(variant.describe() + " [flash3]");
  }
};

// ---- against the float64 reference -------------------------------------------------

class HopperVariantVsReference : public HopperVariantTest, public ::testing::WithParamInterface<VariantCase> {};

TEST_P(HopperVariantVsReference, MatchesFloat64Reference) { check_against_reference(GetParam()); }

std::vector<VariantCase> variant_cases() {
  std::vector<VariantCase> cases;
  const Slopes kPerHead = Slopes::per_head, kPerBatchHead = Slopes::per_batch_head;
  for (DType t : {DType::float16, DType::bfloat16}) {
    // ALiBi: every kernel head dim (block_n 128 and 80), padded dims, tails (113, 203),
    // seqlen_q != seqlen_k both ways (the bias is aligned bottom-right).
    for (std::int64_t d : {64, 128, 256, 96}) {
      cases.push_back(with_alibi(make(t, 2, 113, 203, 2, 2, d), kPerBatchHead));
      cases.push_back(with_alibi(causal(make(t, 1, 203, 113, 2, 1, d)), kPerHead));
    }
    cases.push_back(with_alibi(make(t, 2, 300, 17, 4, 2, 128), kPerHead));
    // Many key blocks on each side of the diagonal (ALiBi's affine form there, the
    // per-element form across it), and window_left 0 (every block on the right).
    cases.push_back(with_alibi(make(t, 1, 700, 1000, 2, 2, 128), kPerHead));
    cases.push_back(with_alibi(causal(make(t, 1, 900, 700, 2, 2, 128)), kPerBatchHead));
    cases.push_back(with_alibi(causal(make(t, 1, 700, 1000, 2, 2, 128)), kPerHead));  // causal, seqlen_q < seqlen_k
    cases.push_back(with_alibi(causal(varlen(make(t, 0, 0, 0, 2, 2, 128), {129, 1, 0, 300, 700}, {140, 1, 7, 300, 1000})),
                               kPerBatchHead));  // d128's affine form with sequence offsets
    cases.push_back(with_alibi(window(make(t, 1, 300, 350, 2, 2, 128), 0, 40), kPerBatchHead));
    cases.push_back(with_alibi(softcap(causal(make(t, 1, 270, 250, 2, 2, 128)), 2.0), kPerBatchHead));
    cases.push_back(with_alibi(window(make(t, 1, 400, 350, 2, 2, 64), 20, 20), kPerHead));
    cases.push_back(with_alibi(make(t, 2, 97, 113, 8, 2, 64), kPerBatchHead));           // GQA 4:1
    cases.push_back(with_alibi(causal(make(t, 1, 1500, 1500, 2, 2, 64)), kPerHead));      // d64 block_m 192
    cases.push_back(with_alibi(varlen(make(t, 0, 0, 0, 2, 1, 64), {5, 0, 1, 130, 0, 17}, {9, 3, 0, 64, 0, 129}),
                          kPerBatchHead));
    cases.push_back(with_alibi(causal(varlen(make(t, 0, 0, 0, 2, 2, 256), {129, 1, 0, 200}, {140, 1, 7, 260})),
                          kPerHead));

    // Dropout p = 0.1 and 0.5 (the mask must agree element for element with the
    // reference's: one differing element of 1/n moves out by ~1/(n (1 - p))).
    for (double p : {0.1, 0.5}) {
      for (std::int64_t d : {64, 128, 256}) {
        cases.push_back(with_dropout(make(t, 2, 113, 203, 2, 2, d), p));
        cases.push_back(with_dropout(causal(make(t, 1, 203, 113, 2, 1, d)), p));
      }
      cases.push_back(with_dropout(make(t, 1, 300, 17, 2, 2, 128), p));
      cases.push_back(with_dropout(window(make(t, 1, 257, 300, 2, 2, 64), 32, 0), p));
      cases.push_back(with_dropout(softcap(make(t, 1, 150, 170, 2, 1, 256), 5.0), p));
      cases.push_back(with_dropout(make(t, 2, 97, 113, 8, 2, 64), p));  // GQA: the query head keys the mask
      cases.push_back(with_dropout(causal(make(t, 1, 1500, 1500, 2, 2, 64)), p));  // masked d64 past 1024
      cases.push_back(with_dropout(varlen(make(t, 0, 0, 0, 2, 1, 128), {5, 0, 1, 130, 0, 17}, {9, 3, 0, 64, 0, 129}), p));
      cases.push_back(with_dropout(window(varlen(make(t, 0, 0, 0, 4, 1, 256), {200, 64, 1}, {150, 300, 1}), 33, 5), p));
    }
    // Both at once, with softcap.
    cases.push_back(with_alibi(with_dropout(softcap(causal(make(t, 1, 203, 301, 4, 2, 128)), 3.0), 0.1)));
    cases.push_back(with_alibi(with_dropout(make(t, 2, 113, 129, 2, 2, 64), 0.5), kPerHead));
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, HopperVariantVsReference, ::testing::ValuesIn(variant_cases()));

// Unmasked problems run on a persistent grid: each CTA runs several tiles, so the
// per-tile slope, dropout head and keep bits must follow the tile.
TEST_F(HopperVariantTest, PersistentGridRunsSeveralTilesPerCta) {
  check_against_reference(with_alibi(make(DType::bfloat16, 2, 200, 333, 48, 8, 128), Slopes::per_batch_head));
  check_against_reference(with_dropout(make(DType::float16, 3, 400, 250, 24, 24, 64), 0.1));
  check_against_reference(with_dropout(make(DType::bfloat16, 2, 300, 190, 40, 40, 256), 0.5));
  check_against_reference(
      with_alibi(dropout(varlen(make(DType::float16, 0, 0, 0, 64, 8, 64), {300, 0, 5, 700}, {100, 50, 0, 900}), 0.1)));
}

// ---- the dropout mask, element by element -------------------------------------------

// q = 0 makes P uniform (1/n over the n keys of a row); V row j = e_(j mod d) · 2^-(j / d)
// makes out[i][c] = 1/(n (1 - p)) · Σ_g keep(i, c + g d) · 2^-g: exact in fp16/bf16 for
// up to 8 groups with n a power of two and p = 0.5. The decoded bits are compared with
// DropoutRule::keep, and a mismatch names (batch, head, row, column).
void expect_mask_read_back_exactly(const ProblemShape& shape, int expected_mismatches_cap = 10) {
  const double p = 0.5;
  VariantCase variant = with_dropout(shape, p);
  VariantRun run(variant, 3);
  AttentionProblem& problem = run.problem;
  const AttentionParams params = run.host_params();
  for (std::int64_t i = 0; i < problem.q.numel(); ++i) problem.q.set(i, 0.0f);
  for (std::int64_t i = 0; i < problem.v.numel(); ++i) problem.v.set(i, 0.0f);
  const std::int64_t d = params.head_dim;
  for (std::int64_t b = 0; b < params.batch; ++b) {
    ASSERT_LE(params.seqlen_k_of(b), 8 * d) << "at most 8 groups of d keys";
    ASSERT_EQ(params.seqlen_k_of(b) & (params.seqlen_k_of(b) - 1), 0) << "n must be a power of two (P = 1/n exact)";
    for (std::int64_t h = 0; h < params.heads_kv; ++h)
      for (std::int64_t j = 0; j < params.seqlen_k_of(b); ++j)
        problem.v.set(params.v_offset(b, h) + j * params.v_row_stride + j % d, std::ldexp(1.0f, -static_cast<int>(j / d)));
  }
  DeviceProblem device(problem);
  run.run_gpu(device);

  const DropoutRule rule = params.dropout();
  int mismatches = 0;
  std::ostringstream report;
  for (std::int64_t b = 0; b < params.batch; ++b) {
    const std::int64_t n = params.seqlen_k_of(b);
    const std::int64_t groups = (n + d - 1) / d;
    for (std::int64_t h = 0; h < params.heads_q; ++h)
      for (std::int64_t i = 0; i < params.seqlen_q_of(b); ++i)
        for (std::int64_t c = 0; c < d && c < n; ++c) {
          // out · n (1 - p) · 2^(groups - 1) = Σ_g keep · 2^(groups - 1 - g): an integer.
          const double value = problem.out.get(params.out_offset(b, h) + i * params.out_row_stride + c);
          const auto bits = static_cast<std::int64_t>(
              std::llround(value * static_cast<double>(n) * (1.0 - p) * std::ldexp(1.0, static_cast<int>(groups - 1))));
          for (std::int64_t g = 0; g < groups && c + g * d < n; ++g) {
            const std::int64_t j = c + g * d;
            const bool kept = ((bits >> (groups - 1 - g)) & 1) != 0;
            const bool expected = rule.keep(params.dropout_head(b, h), i, j);
            if (kept != expected && ++mismatches <= expected_mismatches_cap)
              report << "\n  batch " << b << " head " << h << " row " << i << " col " << j << ": flash3 "
                     << (kept ? "kept" : "dropped") << ", DropoutRule::keep says " << (expected ? "keep" : "drop")
                     << " (out " << value << ")";
          }
        }
  }
  EXPECT_EQ(mismatches, 0) << shape.describe() << ": dropout decisions differing from DropoutRule::keep"
                           << report.str();
}

TEST_F(HopperVariantTest, DropoutMaskEqualsDropoutRuleElementByElement) {
  for (DType t : {DType::float16, DType::bfloat16}) {
    expect_mask_read_back_exactly(make(t, 2, 203, 256, 3, 3, 64));    // 4 groups, 2 key blocks of 128
    expect_mask_read_back_exactly(make(t, 1, 129, 512, 2, 1, 128));   // GQA, 4 key blocks
    expect_mask_read_back_exactly(make(t, 1, 113, 256, 2, 2, 256));   // block_n 80: a 16-column tail block
    expect_mask_read_back_exactly(varlen(make(t, 0, 0, 0, 2, 2, 64), {70, 0, 129, 5}, {128, 64, 256, 32}));
    expect_mask_read_back_exactly(make(t, 1, 64, 64, 300, 300, 64));  // persistent: 300 tiles, several per CTA
  }
}

// ---- determinism and the device seed/offset ----------------------------------------

TEST_F(HopperVariantTest, SameSeedAndOffsetGiveBitwiseIdenticalOutputs) {
  for (const VariantCase& variant : {with_dropout(causal(make(DType::bfloat16, 2, 300, 333, 4, 2, 128)), 0.1),
                                     with_alibi(with_dropout(make(DType::float16, 1, 200, 450, 2, 2, 256), 0.5)),
                                     with_dropout(make(DType::bfloat16, 2, 257, 190, 6, 3, 64), 0.1)}) {
    VariantRun run(variant, 5);
    DeviceProblem device(run.problem);
    run.run_gpu(device);
    const auto first_out = bytes_of(run.problem.out);
    const auto first_lse = bytes_of(run.problem.lse);
    for (int repeat = 1; repeat < 5; ++repeat) {
      run.run_gpu(device);
      ASSERT_EQ(bytes_of(run.problem.out), first_out) << variant.describe() << " repeat " << repeat;
      ASSERT_EQ(bytes_of(run.problem.lse), first_lse) << variant.describe() << " repeat " << repeat;
    }
  }
}

TEST_F(HopperVariantTest, SeedOffsetTensorOnDeviceEqualsHostValues) {
  const VariantCase variant = with_dropout(make(DType::bfloat16, 2, 203, 301, 4, 2, 128), 0.1);
  VariantRun run(variant, 6);
  DeviceProblem device(run.problem);
  run.run_gpu(device);
  const auto host_seed_out = bytes_of(run.problem.out);
  const std::array<std::int64_t, 2> seed_offset = {static_cast<std::int64_t>(variant.dropout_seed),
                                                   static_cast<std::int64_t>(variant.dropout_offset)};
  DeviceBuffer seed_offset_device(sizeof seed_offset);
  seed_offset_device.upload(seed_offset.data());
  const TensorView seed_offset_view =
      TensorView::contiguous(seed_offset_device.data(), DType::int64, {2}, Device::cuda(0));
  run.run_gpu(device, &seed_offset_view);
  EXPECT_EQ(bytes_of(run.problem.out), host_seed_out) << variant.describe() << ": seed/offset from device memory";
  // A different offset draws a different mask.
  const std::array<std::int64_t, 2> other = {seed_offset[0], seed_offset[1] + 4};
  seed_offset_device.upload(other.data());
  run.run_gpu(device, &seed_offset_view);
  EXPECT_NE(bytes_of(run.problem.out), host_seed_out) << variant.describe() << ": a new offset, the same mask";
}

}  // namespace
}  // namespace flashattn::testing
