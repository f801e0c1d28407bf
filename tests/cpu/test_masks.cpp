// tests/cpu/test_masks.cpp — attn_mask (boolean and additive bias, broadcast through
// strides), dBias and block-sparse masks on the CPU paths, against the float64
// reference built from the equivalent dense mask (STYLE.md's 2x / 3x rule).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "src/core/dense_mask_blocks.hpp"
#include "tests/support/dense_mask_mode.hpp"
#include "src/core/validate.hpp"
#include "tests/cpu/attention_problem.hpp"

namespace flashattn::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A dense mask owned by the test: a [mb, mh, mq, mk] bool or float tensor.
struct DenseMask {
  DType dtype = DType::boolean;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;
  // Size-1 (broadcast) dimensions get stride 0, as torch's expand() makes them.
  TensorView view() {
    auto stride = [&](int d, std::int64_t dense) { return shape[static_cast<std::size_t>(d)] == 1 ? 0 : dense; };
    return TensorView::strided(bytes.data(), dtype, {shape[0], shape[1], shape[2], shape[3]},
                               {stride(0, shape[1] * shape[2] * shape[3]), stride(1, shape[2] * shape[3]), stride(2, shape[3]), stride(3, 1)},
                               Device::cpu());
  }
  std::int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  std::int64_t index(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return (((shape[0] == 1 ? 0 : b) * shape[1] + (shape[1] == 1 ? 0 : h)) * shape[2] + (shape[2] == 1 ? 0 : i)) * shape[3] +
           (shape[3] == 1 ? 0 : j);
  }
  void set(std::int64_t e, double value) {
    if (dtype == DType::boolean) bytes[static_cast<std::size_t>(e)] = value != 0.0;
    else numeric::store_from_float(bytes.data(), dtype, e, static_cast<float>(value));
  }
  double get(std::int64_t e) const {
    if (dtype == DType::boolean) return bytes[static_cast<std::size_t>(e)];
    return numeric::load_as_float(bytes.data(), dtype, e);
  }
};

DenseMask make_mask(DType dtype, std::vector<std::int64_t> shape) {
  DenseMask m;
  m.dtype = dtype, m.shape = std::move(shape);
  m.bytes.assign(static_cast<std::size_t>(m.numel()) * dtype_size(dtype), 0);
  return m;
}

// Random boolean mask, keep probability `keep`.
DenseMask random_bool_mask(std::vector<std::int64_t> shape, double keep, std::uint64_t seed) {
  DenseMask m = make_mask(DType::boolean, std::move(shape));
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution coin(keep);
  for (std::int64_t e = 0; e < m.numel(); ++e) m.set(e, coin(rng));
  return m;
}

// Random bias with a fraction of -inf entries.
DenseMask random_bias(DType dtype, std::vector<std::int64_t> shape, double masked, std::uint64_t seed) {
  DenseMask m = make_mask(dtype, std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::bernoulli_distribution hide(masked);
  for (std::int64_t e = 0; e < m.numel(); ++e) m.set(e, hide(rng) ? -kInf : normal(rng));
  return m;
}

// The block-sparse form of a boolean [mb, mh, seqlen_q, seqlen_k] mask: full blocks,
// partial blocks with bits, empty blocks left out; transposed lists too.
struct BlockLists {
  std::int64_t bq = 0, bk = 0, q_blocks = 0, kv_blocks = 0, mb = 1, mh = 1;
  std::vector<std::int32_t> kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx, ids, bits;
  std::int64_t partial_count = 0;
  BlockMaskArgs args(bool with_bits = true, bool with_q_lists = true) {
    BlockMaskArgs a;
    a.block_size_q = bq, a.block_size_kv = bk;
    a.kv_num_blocks = TensorView::contiguous(kv_num.data(), DType::int32, {mb, mh, q_blocks});
    a.kv_indices = TensorView::contiguous(kv_idx.data(), DType::int32, {mb, mh, q_blocks, kv_blocks});
    a.maybe_full_kv_num_blocks = TensorView::contiguous(full_kv_num.data(), DType::int32, {mb, mh, q_blocks});
    a.maybe_full_kv_indices = TensorView::contiguous(full_kv_idx.data(), DType::int32, {mb, mh, q_blocks, kv_blocks});
    if (with_q_lists) {
      a.maybe_q_num_blocks = TensorView::contiguous(q_num.data(), DType::int32, {mb, mh, kv_blocks});
      a.maybe_q_indices = TensorView::contiguous(q_idx.data(), DType::int32, {mb, mh, kv_blocks, q_blocks});
      a.maybe_full_q_num_blocks = TensorView::contiguous(full_q_num.data(), DType::int32, {mb, mh, kv_blocks});
      a.maybe_full_q_indices = TensorView::contiguous(full_q_idx.data(), DType::int32, {mb, mh, kv_blocks, q_blocks});
    }
    if (with_bits) {
      a.maybe_partial_bits = TensorView::contiguous(bits.data(), DType::int32, {partial_count, bq, (bk + 31) / 32});
      a.maybe_partial_ids = TensorView::contiguous(ids.data(), DType::int32, {mb, mh, q_blocks, kv_blocks});
    }
    return a;
  }
};

BlockLists block_lists(const DenseMask& mask, std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t bq, std::int64_t bk) {
  BlockLists l;
  l.bq = bq, l.bk = bk, l.mb = mask.shape[0], l.mh = mask.shape[1];
  l.q_blocks = (seqlen_q + bq - 1) / bq, l.kv_blocks = (seqlen_k + bk - 1) / bk;
  const std::int64_t words = (bk + 31) / 32;
  const auto heads = static_cast<std::size_t>(l.mb * l.mh);
  l.kv_num.assign(heads * l.q_blocks, 0), l.full_kv_num.assign(heads * l.q_blocks, 0);
  l.kv_idx.assign(heads * l.q_blocks * l.kv_blocks, -7), l.full_kv_idx.assign(l.kv_idx.size(), -7), l.ids.assign(l.kv_idx.size(), -7);
  l.q_num.assign(heads * l.kv_blocks, 0), l.full_q_num.assign(heads * l.kv_blocks, 0);
  l.q_idx.assign(heads * l.kv_blocks * l.q_blocks, -7), l.full_q_idx.assign(l.q_idx.size(), -7);
  for (std::int64_t b = 0; b < l.mb; ++b)
    for (std::int64_t h = 0; h < l.mh; ++h) {
      const std::int64_t head = b * l.mh + h;
      for (std::int64_t m = 0; m < l.q_blocks; ++m)
        for (std::int64_t n = 0; n < l.kv_blocks; ++n) {
          std::int64_t allowed = 0, total = 0;
          for (std::int64_t i = m * bq; i < std::min(seqlen_q, (m + 1) * bq); ++i)
            for (std::int64_t j = n * bk; j < std::min(seqlen_k, (n + 1) * bk); ++j, ++total) allowed += mask.get(mask.index(b, h, i, j)) != 0.0;
          if (allowed == 0) continue;
          const bool full = allowed == total;
          auto& num = full ? l.full_kv_num : l.kv_num;
          auto& idx = full ? l.full_kv_idx : l.kv_idx;
          const std::int64_t slot = num[static_cast<std::size_t>(head * l.q_blocks + m)]++;
          idx[static_cast<std::size_t>((head * l.q_blocks + m) * l.kv_blocks + slot)] = static_cast<std::int32_t>(n);
          auto& qnum = full ? l.full_q_num : l.q_num;
          auto& qidx = full ? l.full_q_idx : l.q_idx;
          const std::int64_t qslot = qnum[static_cast<std::size_t>(head * l.kv_blocks + n)]++;
          qidx[static_cast<std::size_t>((head * l.kv_blocks + n) * l.q_blocks + qslot)] = static_cast<std::int32_t>(m);
          if (full) continue;
          l.ids[static_cast<std::size_t>((head * l.q_blocks + m) * l.kv_blocks + slot)] = static_cast<std::int32_t>(l.partial_count);
          l.bits.resize(static_cast<std::size_t>((l.partial_count + 1) * bq * words), 0);
          for (std::int64_t r = 0; r < bq; ++r)
            for (std::int64_t c = 0; c < bk; ++c) {
              const std::int64_t i = m * bq + r, j = n * bk + c;
              if (i < seqlen_q && j < seqlen_k && mask.get(mask.index(b, h, i, j)) != 0.0)
                l.bits[static_cast<std::size_t>((l.partial_count * bq + r) * words + c / 32)] |= static_cast<std::int32_t>(1u << (c % 32));
            }
          ++l.partial_count;
        }
    }
  if (l.bits.empty()) l.bits.push_back(0);
  return l;
}

// Problem + masks: the reference is run on `reference_options` (the dense equivalent).
struct Masked {
  AttentionProblem problem;
  AttentionOptions extra;            // masks for the run under test
  AttentionOptions reference_extra;  // the dense equivalent for the oracle
  HostTensor dbias;
  bool with_dbias = false;

  explicit Masked(const ProblemShape& s) : problem(s) {}
  static void add(AttentionOptions& o, const AttentionOptions& masks) {
    o.maybe_attn_mask = masks.maybe_attn_mask;
    o.maybe_block_mask = masks.maybe_block_mask;
  }
  ForwardArgs forward_args(const AttentionOptions& masks, Algorithm algorithm = Algorithm::automatic) {
    ForwardArgs a = problem.forward_args(algorithm);
    add(a.options, masks);
    return a;
  }
  BackwardArgs backward_args(const AttentionOptions& masks, Algorithm algorithm = Algorithm::automatic) {
    BackwardArgs a = problem.backward_args(algorithm);
    add(a.options, masks);
    if (with_dbias) a.maybe_dbias = dbias.view();
    return a;
  }
};

void expect_masked_forward(Masked& t, const std::string& label, Algorithm algorithm = Algorithm::automatic) {
  forward(t.forward_args(t.extra, algorithm));
  const AttentionParams ref_params = validate_forward(t.forward_args(t.reference_extra, Algorithm::reference));
  const cpu::ReferenceResult ref = cpu::reference_forward(ref_params);
  const cpu::ReferenceResult low = cpu::naive_forward_in_precision(ref_params, ref_params.dtype);
  const cpu::ReferenceResult got = gather_output(t.problem);
  const double floor = tolerance_floor(ref_params.dtype);
  EXPECT_LE(max_abs_difference(got.out, ref.out), 2.0 * max_abs_difference(low.out, ref.out) + floor) << label << " (out)";
  EXPECT_LE(max_abs_difference(got.lse, ref.lse), 2.0 * max_abs_difference(low.lse, ref.lse) + floor) << label << " (lse)";
}

void expect_masked_backward(Masked& t, const std::string& label) {
  backward(t.backward_args(t.extra));
  const BackwardParams ref_params = validate_backward(t.backward_args(t.reference_extra));
  const cpu::ReferenceGradients ref = cpu::reference_backward(ref_params);
  const cpu::ReferenceGradients low = cpu::naive_backward_in_precision(ref_params, ref_params.dtype);
  const cpu::ReferenceGradients got = gather_gradients(t.problem);
  const double floor = tolerance_floor(ref_params.dtype);
  EXPECT_LE(max_abs_difference(got.dq, ref.dq), 3.0 * max_abs_difference(low.dq, ref.dq) + floor) << label << " (dq)";
  EXPECT_LE(max_abs_difference(got.dk, ref.dk), 3.0 * max_abs_difference(low.dk, ref.dk) + floor) << label << " (dk)";
  EXPECT_LE(max_abs_difference(got.dv, ref.dv), 3.0 * max_abs_difference(low.dv, ref.dv) + floor) << label << " (dv)";
  if (t.with_dbias) {
    std::vector<double> got_dbias(static_cast<std::size_t>(t.dbias.numel()));
    for (std::int64_t e = 0; e < t.dbias.numel(); ++e) got_dbias[static_cast<std::size_t>(e)] = t.dbias.get(e);
    EXPECT_LE(max_abs_difference(got_dbias, ref.dbias), 3.0 * max_abs_difference(low.dbias, ref.dbias) + floor) << label << " (dbias)";
  }
}

struct MaskCase {
  ProblemShape shape;
  std::vector<std::int64_t> mask_shape;  // with -1 = the full size
  DType mask_dtype;                      // boolean, or a float dtype for a bias
  bool dbias;
};

std::vector<std::int64_t> resolve(const std::vector<std::int64_t>& shape, const ProblemShape& s) {
  const std::int64_t full[4] = {s.batch, s.heads_q, s.seqlen_q, s.seqlen_k};
  std::vector<std::int64_t> r(4);
  for (int d = 0; d < 4; ++d) r[static_cast<std::size_t>(d)] = shape[static_cast<std::size_t>(d)] < 0 ? full[d] : shape[static_cast<std::size_t>(d)];
  return r;
}

class DenseMaskTest : public ::testing::TestWithParam<MaskCase> {};

TEST_P(DenseMaskTest, ForwardAndBackwardMatchReference) {
  const MaskCase& c = GetParam();
  Masked t(c.shape);
  DenseMask mask = c.mask_dtype == DType::boolean ? random_bool_mask(resolve(c.mask_shape, c.shape), 0.7, 11)
                                                  : random_bias(c.mask_dtype, resolve(c.mask_shape, c.shape), 0.2, 12);
  t.extra.maybe_attn_mask = mask.view();
  t.reference_extra = t.extra;
  if (c.dbias) {
    t.with_dbias = true;
    t.dbias = HostTensor(c.mask_dtype, mask.shape);
    t.dbias.fill_canary();
  }
  expect_masked_forward(t, c.shape.describe() + " flash2");
  expect_masked_forward(t, c.shape.describe() + " reference", Algorithm::reference);
  expect_masked_forward(t, c.shape.describe() + " flash1", Algorithm::flash1);
  forward(t.forward_args(t.extra));
  expect_masked_backward(t, c.shape.describe());
}

INSTANTIATE_TEST_SUITE_P(
    Masks, DenseMaskTest,
    ::testing::Values(
        MaskCase{make(DType::float32, 2, 97, 113, 4, 2, 32), {-1, -1, -1, -1}, DType::boolean, false},
        MaskCase{make(DType::float16, 1, 129, 75, 2, 1, 48), {-1, 1, -1, -1}, DType::boolean, false},
        MaskCase{make(DType::float32, 2, 65, 200, 2, 2, 16), {-1, -1, -1, -1}, DType::float32, true},
        MaskCase{make(DType::bfloat16, 2, 70, 33, 4, 2, 32), {1, -1, 1, -1}, DType::bfloat16, true},
        MaskCase{make(DType::float16, 2, 40, 150, 2, 1, 64), {-1, 1, -1, 1}, DType::float32, true},
        MaskCase{causal(make(DType::float32, 1, 130, 130, 2, 2, 32)), {1, 1, -1, -1}, DType::float32, true},
        MaskCase{softcap(make(DType::float32, 1, 50, 70, 2, 2, 32), 5.0), {1, -1, -1, -1}, DType::float32, true},
        MaskCase{alibi(make(DType::float32, 2, 33, 47, 2, 1, 32)), {-1, -1, -1, -1}, DType::boolean, false},
        MaskCase{dropout(make(DType::float32, 1, 64, 80, 2, 2, 32), 0.2), {-1, -1, -1, -1}, DType::float32, true}));

// A fully masked row and a whole empty query block: output 0, LSE -inf, gradients 0.
TEST(Masks, FullyMaskedRowsGiveZeros) {
  Masked t(make(DType::float32, 1, 96, 70, 2, 2, 32));
  DenseMask mask = random_bool_mask({1, 2, 96, 70}, 0.6, 5);
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t j = 0; j < 70; ++j) {
      mask.set(mask.index(0, h, 3, j), 0);
      for (std::int64_t i = 64; i < 96; ++i) mask.set(mask.index(0, h, i, j), 0);  // an empty query block
    }
  t.extra.maybe_attn_mask = mask.view();
  t.reference_extra = t.extra;
  expect_masked_forward(t, "masked rows");
  forward(t.forward_args(t.extra));
  const AttentionParams p = validate_forward(t.forward_args(t.extra));
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t i : {std::int64_t{3}, std::int64_t{64}, std::int64_t{95}}) {
      EXPECT_EQ(t.problem.lse.get(p.lse_offset(0, h) + i * p.lse_row_stride), -std::numeric_limits<float>::infinity());
      for (std::int64_t d = 0; d < 32; ++d) EXPECT_EQ(t.problem.out.get(p.out_offset(0, h) + i * p.out_row_stride + d), 0.0f);
    }
  backward(t.backward_args(t.extra));
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t d = 0; d < 32; ++d) EXPECT_EQ(t.problem.dq.get(p.q_offset(0, h) + 3 * p.q_row_stride + d), 0.0f);
  expect_masked_backward(t, "masked rows");
}

// A dense boolean mask and its block-sparse form give identical results, for block
// sizes below, equal to and above the CPU tiles.
TEST(BlockMasks, DenseAndBlockSparseAgree) {
  for (std::int64_t bq : {16, 64, 256})
    for (std::int64_t bk : {32, 128}) {
      Masked t(make(DType::float32, 2, 150, 260, 2, 1, 32));
      // Structured: a band plus random holes, so blocks of every kind occur.
      DenseMask mask = make_mask(DType::boolean, {2, 1, 150, 260});
      std::mt19937_64 rng(static_cast<std::uint64_t>(bq * 1000 + bk));
      std::bernoulli_distribution hole(0.1);
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t i = 0; i < 150; ++i)
          for (std::int64_t j = 0; j < 260; ++j) mask.set(mask.index(b, 0, i, j), (j <= i + 40 * b && j + 90 > i) && !(j % 7 == 0 && hole(rng)));
      BlockLists lists = block_lists(mask, 150, 260, bq, bk);
      t.extra.maybe_block_mask = lists.args();
      t.reference_extra.maybe_attn_mask = mask.view();
      const std::string label = "block " + std::to_string(bq) + "x" + std::to_string(bk);
      expect_masked_forward(t, label + " flash1", Algorithm::flash1);
      expect_masked_forward(t, label);
      HostTensor block_out = t.problem.out;
      forward(t.forward_args(t.reference_extra));
      EXPECT_TRUE(block_out.bitwise_equal(t.problem.out)) << label << ": dense and block-sparse outputs differ";
      expect_masked_backward(t, label);
      HostTensor block_dq = t.problem.dq, block_dk = t.problem.dk;
      backward(t.backward_args(t.reference_extra));
      EXPECT_TRUE(block_dq.bitwise_equal(t.problem.dq) && block_dk.bitwise_equal(t.problem.dk)) << label << ": gradients differ";
    }
}


// A boolean mask whose 64 x 64 blocks (the CPU conversion's) come in every kind: random
// elements (keep 0.7), row 3 and rows [64, 128) see nothing (whole empty blocks), keys
// [64, 128) of rows [128, 192) all allowed (whole full blocks); tails when the lengths
// are not multiples of 64.
DenseMask structured_bool_mask(std::vector<std::int64_t> shape, std::uint64_t seed) {
  DenseMask m = random_bool_mask(shape, 0.7, seed);
  for (std::int64_t b = 0; b < m.shape[0]; ++b)
    for (std::int64_t h = 0; h < m.shape[1]; ++h)
      for (std::int64_t i = 0; i < m.shape[2]; ++i)
        for (std::int64_t j = 0; j < m.shape[3]; ++j) {
          if (m.shape[2] > 1 && (i == 3 || (i >= 64 && i < 128))) m.set(m.index(b, h, i, j), 0);
          if (m.shape[2] > 1 && m.shape[3] > 1 && i >= 128 && i < 192 && j >= 64 && j < 128) m.set(m.index(b, h, i, j), 1);
        }
  return m;
}

// Equal values element by element (a gradient row that sees no key is 0 on both paths,
// +0 where the block form skips its tiles and maybe -0 where the dense path sums zeros).
bool same_values(const HostTensor& a, const HostTensor& b) { return a.to_double() == b.to_double(); }

// A dense boolean mask run as its block form (src/core/dense_mask_blocks.hpp) gives the
// per-element path's results (out and LSE bitwise, gradients as values), and the reference's within the rule: flash2,
// flash1 and the backward; tails, broadcast batch/head/rows, causal, GQA.
TEST(DenseMaskBlocks, EqualsThePerElementPath) {
  struct Case {
    ProblemShape shape;
    std::vector<std::int64_t> mask_shape;
  };
  for (const Case& c : {Case{make(DType::float32, 2, 200, 230, 4, 2, 32), {-1, -1, -1, -1}},
                        Case{make(DType::float16, 2, 197, 150, 2, 2, 48), {1, -1, -1, -1}},
                        Case{causal(make(DType::bfloat16, 2, 210, 260, 4, 1, 64)), {-1, 1, -1, -1}},
                        Case{make(DType::float32, 1, 140, 129, 2, 2, 32), {1, 1, -1, -1}},
                        Case{make(DType::float32, 2, 90, 100, 2, 2, 32), {-1, 1, 1, -1}},
                        Case{make(DType::float16, 1, 17, 33, 2, 1, 32), {-1, -1, -1, -1}}}) {
    const std::string label = c.shape.describe();
    Masked t(c.shape);
    DenseMask mask = structured_bool_mask(resolve(c.mask_shape, c.shape), 21);
    t.extra.maybe_attn_mask = mask.view();
    t.reference_extra = t.extra;
    // Which path "blocks" takes: the block form, except for a mask broadcast along rows
    // (the [B, 1, 1, Sk] case), which stays per element.
    const bool rows_broadcast = c.mask_shape[2] == 1;
    EXPECT_EQ(is_dense_mask_convertible(validate_forward(t.forward_args(t.extra, Algorithm::flash2))), !rows_broadcast)
        << label;
    for (Algorithm algorithm : {Algorithm::flash2, Algorithm::flash1}) {
      const std::string name = label + (algorithm == Algorithm::flash2 ? " flash2" : " flash1");
      {
        const DenseMaskMode per_element(nullptr);
        forward(t.forward_args(t.extra, algorithm));
      }
      const HostTensor dense_out = t.problem.out, dense_lse = t.problem.lse;
      {
        const DenseMaskMode as_blocks("blocks");
        t.problem.out.fill_canary(), t.problem.lse.fill_canary();
        expect_masked_forward(t, name + " as blocks", algorithm);
      }
      EXPECT_TRUE(t.problem.out.bitwise_equal(dense_out) && t.problem.lse.bitwise_equal(dense_lse))
          << name << ": the block form and the per-element path differ";
    }
    {
      const DenseMaskMode per_element(nullptr);
      forward(t.forward_args(t.extra));
      backward(t.backward_args(t.extra));
    }
    const HostTensor dense_dq = t.problem.dq, dense_dk = t.problem.dk, dense_dv = t.problem.dv;
    {
      const DenseMaskMode as_blocks("blocks");
      for (HostTensor* g : {&t.problem.dq, &t.problem.dk, &t.problem.dv}) g->fill_canary();
      expect_masked_backward(t, label + " as blocks");
    }
    EXPECT_TRUE(same_values(t.problem.dq, dense_dq) && same_values(t.problem.dk, dense_dk) && same_values(t.problem.dv, dense_dv))
        << label << ": block-form gradients differ from the per-element path";
  }
}

// Built-in element rules, checked against a dense mask written independently.
TEST(BlockMasks, BuiltInRules) {
  const std::int64_t sq = 100, sk = 140, bq = 32, bk = 32;
  std::vector<std::int32_t> q_docs(sq), k_docs(sk), prefix{30};
  for (std::int64_t i = 0; i < sq; ++i) q_docs[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i / 37);
  for (std::int64_t j = 0; j < sk; ++j) k_docs[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j / 45);
  struct Rule {
    std::string name;
    bool band, prefix_lm, documents;
    std::int64_t left, right;
  };
  for (const Rule& rule : {Rule{"causal top-left", true, false, false, -1, 0}, Rule{"sliding window", true, false, false, 20, 3},
                           Rule{"documents", false, false, true, -1, -1}, Rule{"prefix-LM", true, true, false, -1, 0},
                           Rule{"causal and documents", true, false, true, -1, 0}}) {
    auto allowed = [&](std::int64_t i, std::int64_t j) {
      bool ok = true;
      if (rule.band) {
        bool in_band = (rule.left < 0 || j >= i - rule.left) && (rule.right < 0 || j <= i + rule.right);
        if (rule.prefix_lm) in_band = in_band || j < prefix[0];
        ok = in_band;
      }
      if (rule.documents) ok = ok && q_docs[static_cast<std::size_t>(i)] == k_docs[static_cast<std::size_t>(j)];
      return ok;
    };
    DenseMask mask = make_mask(DType::boolean, {1, 1, sq, sk});
    for (std::int64_t i = 0; i < sq; ++i)
      for (std::int64_t j = 0; j < sk; ++j) mask.set(mask.index(0, 0, i, j), allowed(i, j));
    BlockLists lists = block_lists(mask, sq, sk, bq, bk);
    BlockMaskArgs args = lists.args(/*with_bits=*/false);
    args.has_band = rule.band, args.window_left = rule.left, args.window_right = rule.right;
    if (rule.prefix_lm) args.maybe_prefix_lengths = TensorView::contiguous(prefix.data(), DType::int32, {1});
    if (rule.documents) {
      args.maybe_q_document_ids = TensorView::contiguous(q_docs.data(), DType::int32, {1, sq});
      args.maybe_k_document_ids = TensorView::contiguous(k_docs.data(), DType::int32, {1, sk});
    }
    Masked t(make(DType::float16, 1, sq, sk, 2, 2, 32));
    t.extra.maybe_block_mask = args;
    t.reference_extra.maybe_attn_mask = mask.view();
    expect_masked_forward(t, rule.name + " flash1", Algorithm::flash1);
    expect_masked_forward(t, rule.name);
    expect_masked_backward(t, rule.name);
  }
}

// Bad input: the message names the argument and the outputs stay bitwise unchanged.
void expect_rejected(Masked& t, const AttentionOptions& masks, const std::string& argument) {
  t.problem.out.fill_canary();
  const HostTensor before = t.problem.out;
  try {
    forward(t.forward_args(masks));
    ADD_FAILURE() << "accepted bad " << argument;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flashattn: " + argument), std::string::npos) << e.what();
  }
  EXPECT_TRUE(before.bitwise_equal(t.problem.out)) << argument;
}

TEST(Masks, BadInputIsRejected) {
  Masked t(make(DType::float16, 2, 40, 50, 2, 2, 32));
  {
    DenseMask bad = random_bool_mask({2, 3, 40, 50}, 0.5, 1);  // heads 3 vs 2
    AttentionOptions o;
    o.maybe_attn_mask = bad.view();
    expect_rejected(t, o, "attn_mask");
  }
  {
    DenseMask bad = random_bias(DType::bfloat16, {1, 1, 40, 50}, 0.0, 1);  // q is float16
    AttentionOptions o;
    o.maybe_attn_mask = bad.view();
    expect_rejected(t, o, "attn_mask");
  }
  {
    std::vector<std::int32_t> wrong(2 * 40 * 50, 1);
    AttentionOptions o;
    o.maybe_attn_mask = TensorView::contiguous(wrong.data(), DType::int32, {2, 2, 10, 50});
    expect_rejected(t, o, "attn_mask");
  }
  DenseMask mask = random_bool_mask({1, 1, 40, 50}, 0.5, 2);
  BlockLists lists = block_lists(mask, 40, 50, 16, 16);
  {
    AttentionOptions o;
    o.maybe_block_mask = lists.args();
    o.maybe_block_mask->block_size_kv = 24;
    expect_rejected(t, o, "block_size_kv");
  }
  {
    BlockLists bad = lists;
    bad.kv_idx[0] = 99;
    if (bad.kv_num[0] == 0) bad.kv_num[0] = 1;
    AttentionOptions o;
    o.maybe_block_mask = bad.args(true, false);
    expect_rejected(t, o, "kv_indices");
  }
  {
    BlockLists bad = lists;
    bad.kv_num[1] = 1000;
    AttentionOptions o;
    o.maybe_block_mask = bad.args(true, false);
    expect_rejected(t, o, "kv_num_blocks");
  }
  {
    BlockLists bad = lists;
    bad.q_num[0] = 0;  // no longer the transpose
    AttentionOptions o;
    o.maybe_block_mask = bad.args();
    if (lists.q_num[0] > 0) expect_rejected(t, o, "q_indices");
  }
}

// Masks with a variable-length batch are refused (docs/algorithm.md §7b), naming the mask
// and cu_seqlens, outputs untouched.
TEST(Masks, VarlenIsRefused) {
  Masked t(varlen(make(DType::float16, 1, 1, 1, 2, 2, 32), {20, 35}, {30, 25}));
  DenseMask mask = random_bool_mask({2, 2, 35, 30}, 0.5, 4);
  AttentionOptions with_mask;
  with_mask.maybe_attn_mask = mask.view();
  expect_rejected(t, with_mask, "attn_mask");
  BlockLists lists = block_lists(random_bool_mask({1, 1, 35, 30}, 0.5, 5), 35, 30, 16, 16);
  AttentionOptions with_block_mask;
  with_block_mask.maybe_block_mask = lists.args();
  expect_rejected(t, with_block_mask, "block_mask");
  try {
    forward(t.forward_args(with_mask));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cu_seqlens_q"), std::string::npos) << e.what();
  }
}

TEST(Masks, DbiasValidation) {
  Masked t(make(DType::float32, 1, 20, 30, 2, 2, 16));
  DenseMask bias = random_bias(DType::float32, {1, 2, 20, 30}, 0.0, 3);
  t.extra.maybe_attn_mask = bias.view();
  forward(t.forward_args(t.extra));
  HostTensor wrong(DType::float32, {1, 2, 20, 29});
  BackwardArgs a = t.backward_args(t.extra);
  a.maybe_dbias = wrong.view();
  t.problem.dq.fill_canary();
  const HostTensor before = t.problem.dq;
  try {
    backward(a);
    ADD_FAILURE() << "accepted a dbias of the wrong shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flashattn: dbias"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(before.bitwise_equal(t.problem.dq));
}

}  // namespace
}  // namespace flashattn::testing
