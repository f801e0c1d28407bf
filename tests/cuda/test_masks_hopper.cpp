// tests/cuda/test_masks_hopper.cpp — attn_mask and block masks on the Hopper forward
// (algorithm = flash3) in the cases its tiles make special, against the float64 CPU
// reference given the dense equivalent of the masks (STYLE.md's 2x rule, out and LSE):
//   - kernel tiles against mask blocks: d64 (block_m 128 under masks where a causal
//     problem past 1024 rows runs 192), d128 (128 x 128), d256 (key tiles of 80 that
//     straddle the mask's 128-key blocks); mask blocks smaller and larger than the tiles;
//   - lists of a single key tile, empty lists (a whole query tile that sees no key:
//     out 0, LSE -inf), full blocks over the key tail (the kernel masks past seqlen_k);
//   - a float bias on the fast path (raw q.k scaled in the exponent) and on the score
//     rule's path (softcap, ALiBi: log2 scores), dropout, causal/window with a block
//     mask, GQA, masks broadcast over batch or heads.
// Every test skips without a GPU, without flash3 in the build, or off compute 9.0.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "src/core/backend.hpp"
#include "src/core/validate.hpp"
#include "src/cpu/reference.hpp"
#include "tests/cuda/device_problem.hpp"

namespace flashattn::testing {
namespace {

constexpr float kMaskedBias = -std::numeric_limits<float>::infinity();

int device_capability() {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess)
    return 0;
  return major * 10 + minor;
}

// A deterministic hash of an element: the masks' holes and biases vary per element
// without a generator whose order would matter.
std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
  return x;
}
std::uint64_t element_hash(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  return mix(static_cast<std::uint64_t>(((b * 131 + h) * 100003 + i) * 1000003 + j));
}

// Which (b, h, i, j) a case allows; every pattern leaves blocks of all three kinds
// (empty, full, partial) at some tile size, except `everything`.
enum class Pattern {
  band_with_holes,   // a band that moves with b and h, minus ~10% of its elements
  everything,        // all allowed: full blocks only, the key tail included
  empty_query_tile,  // band_with_holes, but rows [128, 256) see nothing
};
bool allowed(Pattern pattern, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  if (pattern == Pattern::everything) return true;
  if (pattern == Pattern::empty_query_tile && i >= 128 && i < 256) return false;
  const bool in_band = j <= i + 40 * (b + 1) + 13 * h && j + 150 > i;
  return in_band && element_hash(b, h, i, j) % 10 != 0;
}
float bias_of(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  return static_cast<float>(element_hash(b + 7, h, i, j) % 4001) / 1000.0f - 2.0f;  // [-2, 2]
}

enum class MaskKind {
  boolean,         // attn_mask bool
  bias,            // attn_mask float (-inf where the pattern masks)
  block,           // block mask with bits
  block_and_bias,  // block mask (the pattern) and a finite bias everywhere
};

struct MaskCase {
  ProblemShape shape;
  MaskKind kind = MaskKind::boolean;
  Pattern pattern = Pattern::band_with_holes;
  DType bias_dtype = DType::float32;
  bool broadcast_batch = false;  // the masks' batch dimension has size 1 (pattern of b = 0)
  bool broadcast_heads = false;  // the masks' head dimension has size 1 (pattern of h = 0)
  std::int64_t block_q = 128, block_k = 128;

  std::string describe() const {
    const char* kinds[] = {"bool", "bias", "block", "block+bias"};
    std::string s = shape.describe() + " " + kinds[static_cast<int>(kind)];
    if (kind == MaskKind::block || kind == MaskKind::block_and_bias)
      s += " " + std::to_string(block_q) + "x" + std::to_string(block_k);
    if (pattern == Pattern::everything) s += " everything";
    if (pattern == Pattern::empty_query_tile) s += " empty-tile";
    if (broadcast_batch) s += " [1,..]";
    if (broadcast_heads) s += " [..,1,..]";
    return s;
  }
};
void PrintTo(const MaskCase& c, std::ostream* os) { *os << c.describe(); }

MaskCase with_mask(ProblemShape shape, MaskKind kind, Pattern pattern = Pattern::band_with_holes) {
  MaskCase c;
  c.shape = std::move(shape), c.kind = kind, c.pattern = pattern;
  return c;
}
MaskCase blocks(MaskCase c, std::int64_t block_q, std::int64_t block_k) {
  return c.block_q = block_q, c.block_k = block_k, c;
}
MaskCase broadcast(MaskCase c, bool batch, bool heads) {
  return c.broadcast_batch = batch, c.broadcast_heads = heads, c;
}

// The problem, its masks on the host (run and oracle), and their device mirrors.
class MaskedRun {
 public:
  explicit MaskedRun(const MaskCase& c) : problem(c.shape), case_(c) {
    const ProblemShape& s = c.shape;
    mask_batch_ = c.broadcast_batch ? 1 : s.batch;
    mask_heads_ = c.broadcast_heads ? 1 : s.heads_q;
    // The oracle's dense mask: the pattern as -inf, plus the bias where the case has one.
    const bool has_bias = c.kind == MaskKind::bias || c.kind == MaskKind::block_and_bias;
    oracle_mask = HostTensor(DType::float32, {mask_batch_, mask_heads_, s.seqlen_q, s.seqlen_k});
    if (c.kind == MaskKind::boolean) attn_mask = HostTensor(DType::boolean, oracle_mask.shape());
    if (has_bias) attn_mask = HostTensor(c.bias_dtype, oracle_mask.shape());
    for (std::int64_t b = 0; b < mask_batch_; ++b)
      for (std::int64_t h = 0; h < mask_heads_; ++h)
        for (std::int64_t i = 0; i < s.seqlen_q; ++i)
          for (std::int64_t j = 0; j < s.seqlen_k; ++j) {
            const std::int64_t e = ((b * mask_heads_ + h) * s.seqlen_q + i) * s.seqlen_k + j;
            const bool is_allowed = allowed(c.pattern, b, h, i, j);
            // The bias is rounded to its dtype first, so both sides add the same value.
            float bias = 0.0f;
            if (has_bias) {
              attn_mask.set(e, c.kind == MaskKind::bias && !is_allowed ? kMaskedBias : bias_of(b, h, i, j));
              bias = attn_mask.get(e);
            }
            if (c.kind == MaskKind::boolean) static_cast<std::uint8_t*>(attn_mask.data())[e] = is_allowed ? 1 : 0;
            oracle_mask.set(e, is_allowed ? bias : kMaskedBias);
          }
    if (c.kind == MaskKind::block || c.kind == MaskKind::block_and_bias) build_block_lists();
  }

  // The case's masks (host views, or device views through `device`).
  AttentionOptions with_masks(AttentionOptions options, DeviceProblem* device) {
    auto place = [&](TensorView view) { return device != nullptr ? device->device_view(view) : view; };
    if (attn_mask.numel() > 0) options.maybe_attn_mask = place(attn_mask.view());
    if (!kv_num.shape().empty()) {
      BlockMaskArgs args;
      args.block_size_q = case_.block_q, args.block_size_kv = case_.block_k;
      args.kv_num_blocks = place(kv_num.view());
      args.kv_indices = place(kv_indices.view());
      args.maybe_full_kv_num_blocks = place(full_kv_num.view());
      args.maybe_full_kv_indices = place(full_kv_indices.view());
      if (partial_count_ > 0) {
        args.maybe_partial_bits = place(partial_bits.view());
        args.maybe_partial_ids = place(partial_ids.view());
      }
      options.maybe_block_mask = args;
    }
    if (problem.shape().alibi) options.maybe_alibi_slopes = place(problem.alibi_slopes.view());
    return options;
  }
  std::vector<HostTensor*> mask_buffers() {
    std::vector<HostTensor*> buffers;
    for (HostTensor* t : {&attn_mask, &kv_num, &kv_indices, &full_kv_num, &full_kv_indices, &partial_bits,
                          &partial_ids, &problem.alibi_slopes})
      if (!t->shape().empty()) buffers.push_back(t);
    return buffers;
  }

  // flash3 on the device, then out and LSE against the float64 reference of the dense
  // equivalent; rows that see no key must give exactly 0 and -inf.
  void run_and_check() {
    DeviceProblem device(problem, mask_buffers());
    device.poison_outputs();
    ForwardArgs args = device.forward_args();
    args.options = with_masks(args.options, &device);
    args.options.algorithm = Algorithm::flash3;
    forward(args);
    cuda_or_throw(cudaDeviceSynchronize(), "flash3 forward with masks");
    cuda_or_throw(cudaGetLastError(), "flash3 forward with masks");
    device.download_outputs();

    ForwardArgs oracle_args = problem.forward_args(Algorithm::reference);
    oracle_args.options.maybe_attn_mask = oracle_mask.view();
    const AttentionParams params = validate_forward(oracle_args);
    const cpu::ReferenceResult ref = cpu::reference_forward(params);
    const cpu::ReferenceResult low = cpu::naive_forward_in_precision(params, params.dtype);
    const cpu::ReferenceResult got = gather_output(problem);
    const double floor = tolerance_floor(params.dtype);
    const std::string label = case_.describe();
    EXPECT_LE(max_abs_difference(got.out, ref.out), 2.0 * max_abs_difference(low.out, ref.out) + floor)
        << label << " (out)";
    EXPECT_LE(max_abs_difference(got.lse, ref.lse), 2.0 * max_abs_difference(low.lse, ref.lse) + floor)
        << label << " (lse)";
    // gather_output's layout: LSE (row, head) at row * heads + head, out at that times d.
    int empty_rows = 0, wrong_rows = 0;
    const auto head_dim = static_cast<std::size_t>(params.head_dim);
    for (std::size_t row_head = 0; row_head < ref.lse.size(); ++row_head) {
      if (ref.lse[row_head] != -std::numeric_limits<double>::infinity()) continue;
      ++empty_rows;
      bool is_zero = got.lse[row_head] == -std::numeric_limits<double>::infinity();
      for (std::size_t d = 0; d < head_dim; ++d) is_zero = is_zero && got.out[row_head * head_dim + d] == 0.0;
      wrong_rows += is_zero ? 0 : 1;
    }
    EXPECT_EQ(wrong_rows, 0) << label << ": rows without keys must give out 0 and LSE -inf (" << empty_rows
                             << " such rows)";
    if (case_.pattern == Pattern::empty_query_tile) {
      EXPECT_GT(empty_rows, 0) << label << ": the empty tile is missing";
    }
  }

  AttentionProblem problem;
  HostTensor attn_mask, oracle_mask;
  HostTensor kv_num, kv_indices, full_kv_num, full_kv_indices, partial_bits, partial_ids;

 private:
  // The pattern's block-sparse form at (block_q, block_k): partial and full lists
  // (ascending), the partial blocks' bits.
  void build_block_lists() {
    const ProblemShape& s = case_.shape;
    const std::int64_t bq = case_.block_q, bk = case_.block_k;
    const std::int64_t q_blocks = (s.seqlen_q + bq - 1) / bq, kv_blocks = (s.seqlen_k + bk - 1) / bk;
    const std::int64_t words = (bk + 31) / 32;
    kv_num = HostTensor(DType::int32, {mask_batch_, mask_heads_, q_blocks});
    full_kv_num = HostTensor(DType::int32, kv_num.shape());
    kv_indices = HostTensor(DType::int32, {mask_batch_, mask_heads_, q_blocks, kv_blocks});
    full_kv_indices = HostTensor(DType::int32, kv_indices.shape());
    partial_ids = HostTensor(DType::int32, kv_indices.shape());
    auto* num = static_cast<std::int32_t*>(kv_num.data());
    auto* full_num = static_cast<std::int32_t*>(full_kv_num.data());
    auto* indices = static_cast<std::int32_t*>(kv_indices.data());
    auto* full_indices = static_cast<std::int32_t*>(full_kv_indices.data());
    auto* ids = static_cast<std::int32_t*>(partial_ids.data());
    std::vector<std::int32_t> bits;
    std::fill_n(num, kv_num.numel(), 0);
    std::fill_n(full_num, full_kv_num.numel(), 0);
    std::fill_n(indices, kv_indices.numel(), -7);  // unused slots: never read
    std::fill_n(full_indices, full_kv_indices.numel(), -7);
    std::fill_n(ids, partial_ids.numel(), -7);
    for (std::int64_t b = 0; b < mask_batch_; ++b)
      for (std::int64_t h = 0; h < mask_heads_; ++h)
        for (std::int64_t m = 0; m < q_blocks; ++m) {
          const std::int64_t list = (b * mask_heads_ + h) * q_blocks + m;
          for (std::int64_t n = 0; n < kv_blocks; ++n) {
            std::int64_t allowed_count = 0, total = 0;
            for (std::int64_t i = m * bq; i < std::min(s.seqlen_q, (m + 1) * bq); ++i)
              for (std::int64_t j = n * bk; j < std::min(s.seqlen_k, (n + 1) * bk); ++j, ++total)
                allowed_count += allowed(case_.pattern, b, h, i, j) ? 1 : 0;
            if (allowed_count == 0) continue;
            if (allowed_count == total) {
              full_indices[list * kv_blocks + full_num[list]++] = static_cast<std::int32_t>(n);
              continue;
            }
            const std::int32_t slot = num[list]++;
            indices[list * kv_blocks + slot] = static_cast<std::int32_t>(n);
            ids[list * kv_blocks + slot] = static_cast<std::int32_t>(partial_count_);
            bits.resize(static_cast<std::size_t>((partial_count_ + 1) * bq * words), 0);
            for (std::int64_t r = 0; r < bq; ++r)
              for (std::int64_t col = 0; col < bk; ++col) {
                const std::int64_t i = m * bq + r, j = n * bk + col;
                if (i < s.seqlen_q && j < s.seqlen_k && allowed(case_.pattern, b, h, i, j))
                  bits[static_cast<std::size_t>((partial_count_ * bq + r) * words + col / 32)] |=
                      static_cast<std::int32_t>(1u << (col % 32));
              }
            ++partial_count_;
          }
        }
    if (partial_count_ > 0) {
      partial_bits = HostTensor(DType::int32, {partial_count_, bq, words});
      std::copy(bits.begin(), bits.end(), static_cast<std::int32_t*>(partial_bits.data()));
    }
  }

  MaskCase case_;
  std::int64_t mask_batch_ = 1, mask_heads_ = 1;
  std::int64_t partial_count_ = 0;
};

class HopperMasks : public ::testing::TestWithParam<MaskCase> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    if (!cuda::limits().supports_algorithm[static_cast<int>(Algorithm::flash3)])
      GTEST_SKIP() << "no flash3 kernel in this build (sm_90a not built)";
    if (device_capability() != 90) GTEST_SKIP() << "flash3 needs compute capability 9.0";
    if (GetParam().shape.head_dim > cuda::limits().max_head_dim)
      GTEST_SKIP() << "head_dim " << GetParam().shape.head_dim << " not built";
  }
};

TEST_P(HopperMasks, MatchesFloat64Reference) {
  MaskedRun run(GetParam());
  run.run_and_check();
}

std::vector<MaskCase> mask_cases() {
  const DType bf16 = DType::bfloat16, fp16 = DType::float16;
  const MaskKind kBool = MaskKind::boolean, kBias = MaskKind::bias, kBlock = MaskKind::block,
                 kBlockBias = MaskKind::block_and_bias;
  std::vector<MaskCase> cases;
  // Every kernel head dim (tiles 128x128; d256's key tiles of 80 straddle mask blocks),
  // GQA, tails, seqlen_q != seqlen_k both ways.
  for (std::int64_t d : {64, 128, 256}) {
    cases.push_back(with_mask(make(bf16, 2, 300, 333, 4, 2, d), kBool));
    cases.push_back(with_mask(make(fp16, 2, 203, 460, 2, 2, d), kBlock));
    cases.push_back(with_mask(make(bf16, 1, 460, 203, 2, 1, d), kBias));
    cases.push_back(with_mask(make(bf16, 2, 257, 300, 2, 2, d), kBlockBias));
  }
  // Mask blocks smaller and larger than the kernel tiles.
  cases.push_back(blocks(with_mask(make(bf16, 1, 257, 300, 2, 2, 128), kBlock), 16, 32));
  cases.push_back(blocks(with_mask(make(bf16, 1, 513, 700, 2, 2, 64), kBlock), 256, 256));
  cases.push_back(blocks(with_mask(make(fp16, 1, 300, 500, 2, 2, 256), kBlock), 64, 32));
  // d64 past kShortMaskedSeqlen: causal alone runs block_m 192; masks run 128.
  cases.push_back(with_mask(causal(make(bf16, 1, 1100, 1100, 2, 2, 64)), kBlock));
  cases.push_back(with_mask(causal(make(bf16, 1, 1100, 1100, 2, 2, 64)), kBias));
  // A single key tile (seqlen_k <= block_n, and a tail).
  cases.push_back(with_mask(make(bf16, 2, 200, 70, 2, 2, 128), kBool));
  cases.push_back(with_mask(make(bf16, 1, 150, 60, 2, 2, 256), kBlock));
  // Empty lists: query rows [128, 256) see nothing (a whole kernel query tile).
  cases.push_back(with_mask(make(bf16, 1, 300, 260, 2, 2, 128), kBlock, Pattern::empty_query_tile));
  cases.push_back(with_mask(make(bf16, 1, 300, 260, 2, 2, 64), kBool, Pattern::empty_query_tile));
  cases.push_back(with_mask(make(fp16, 1, 300, 260, 2, 2, 256), kBlockBias, Pattern::empty_query_tile));
  // Full blocks only, over a key tail: the kernel masks past seqlen_k itself.
  cases.push_back(with_mask(make(bf16, 1, 150, 203, 2, 2, 128), kBlock, Pattern::everything));
  cases.push_back(with_mask(make(bf16, 1, 129, 333, 2, 1, 256), kBlock, Pattern::everything));
  // Bias units: the fast path above; the score rule's path (softcap, ALiBi) here.
  cases.push_back(with_mask(softcap(make(bf16, 2, 203, 300, 2, 2, 128), 5.0), kBias));
  cases.push_back(with_mask(alibi(make(fp16, 2, 203, 300, 2, 2, 64), 2), kBlockBias));
  cases.push_back(with_mask(softcap(alibi(make(bf16, 1, 300, 203, 2, 1, 256)), 3.0), kBias));
  // Dropout (the kHasDropout kernels) with each mask kind.
  cases.push_back(with_mask(dropout(make(bf16, 1, 257, 300, 2, 2, 128), 0.2), kBool));
  cases.push_back(with_mask(dropout(make(fp16, 1, 257, 300, 2, 2, 64), 0.5), kBlock));
  cases.push_back(with_mask(dropout(make(bf16, 1, 203, 333, 2, 2, 256), 0.1), kBlockBias));
  // The interval rule with the masks (a conjunction).
  cases.push_back(with_mask(causal(make(bf16, 1, 300, 400, 2, 2, 128)), kBlock));
  cases.push_back(with_mask(window(make(bf16, 1, 400, 300, 2, 2, 256), 50, 20), kBias));
  cases.push_back(with_mask(window(make(fp16, 2, 260, 260, 2, 1, 64), 100, 0), kBlockBias));
  // Masks broadcast over batch and/or heads (zero strides; shared lists).
  cases.push_back(broadcast(with_mask(make(bf16, 3, 200, 300, 4, 2, 128), kBias), true, false));
  cases.push_back(broadcast(with_mask(make(bf16, 2, 200, 300, 4, 4, 64), kBlock), false, true));
  cases.push_back(broadcast(with_mask(make(fp16, 2, 260, 190, 2, 2, 256), kBool), true, true));
  // A bfloat16 / float16 bias (the mask's own dtype).
  MaskCase half_bias = with_mask(make(fp16, 1, 203, 260, 2, 2, 128), kBias);
  half_bias.bias_dtype = fp16;
  cases.push_back(half_bias);
  MaskCase bf16_bias = with_mask(make(bf16, 1, 203, 260, 2, 2, 64), kBlockBias);
  bf16_bias.bias_dtype = bf16;
  cases.push_back(bf16_bias);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, HopperMasks, ::testing::ValuesIn(mask_cases()));

}  // namespace
}  // namespace flashattn::testing
