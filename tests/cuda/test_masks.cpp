// tests/cuda/test_masks.cpp — attn_mask (boolean and additive bias, broadcast through
// zero strides), block-sparse masks (FlexAttention lists, with partial bits or the
// built-in element rules) and dBias on the CUDA kernels, forward and backward, against
// the float64 CPU reference (STYLE.md: 2x the same-precision naive error for out/LSE,
// 3x for gradients). A block mask without an attn_mask is checked against the
// reference of its dense boolean equivalent, written independently of the lists.
//
// Forward: flash2 (the sm80 kernel) and flash3 (Hopper; skipped elsewhere). Backward:
// whichever kernel the library picks (the Hopper backward on sm_90 at head dims
// 64/128/256); the test_cuda_masks_sm80_backward binary is this file built with
// FLASHATTN_TEST_SM80_BACKWARD, which sets FLASHATTN_CUDA_BWD_SM90=0 before any call,
// so the FA2-class backward kernels run the same cases there.
//
// The tables themselves (src/cuda/masks) are checked against the rule they implement
// (CudaMasksTables). CudaMasksSmall* is a reduced set meant for compute-sanitizer
// (--gtest_filter='*Masks*Small*'): every tail-tile case, tiny shapes. Skips without a GPU.
//
// CudaMasksDenseBlocks*: a dense boolean attn_mask converted on the device into its block
// form (FLASHATTN_DENSE_MASK=blocks, set per test; src/core/dense_mask_blocks.hpp) equals
// the per-element path and the reference; its tables equal the host conversion
// (CudaMasksTables*.DenseMaskBlocksEqualTheHostConversion).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "src/core/backend.hpp"
#include "src/core/validate.hpp"
#include "src/core/dense_mask_blocks.hpp"
#include "tests/support/dense_mask_mode.hpp"
#include "src/cuda/masks/device_mask.hpp"
#include "tests/cuda/device_problem.hpp"

namespace flashattn::testing {
namespace {

#ifdef FLASHATTN_TEST_SM80_BACKWARD
// The FA2-class backward kernels on every GPU: set before any backward call (the
// library reads the variable once). Forward and table tests are test_cuda_masks' own.
constexpr bool kBackwardOnly = true;
const bool kSm80BackwardSet = [] { return setenv("FLASHATTN_CUDA_BWD_SM90", "0", 1) == 0; }();
#else
constexpr bool kBackwardOnly = false;
#endif

int device_capability() {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess)
    return 0;
  return major * 10 + minor;
}

// flash3 runs this head dim here (sm_90, built, a Hopper forward kernel for it).
bool runs_flash3(std::int64_t head_dim) {
  return cuda::limits().supports_algorithm[static_cast<int>(Algorithm::flash3)] && device_capability() == 90 &&
         (head_dim == 64 || head_dim == 128 || head_dim == 256) && head_dim <= cuda::limits().max_head_dim;
}

// ---- the masks of one case, in host tensors mirrored on the device ------------------

// Which dense attn_mask a case has.
enum class Dense { none, boolean, bias };
// Which block mask: none; lists + partial bits of a structured random pattern; lists
// of a built-in element rule (no bits): band, documents, prefix-LM.
enum class Block { none, pattern, band, documents, prefix };

struct MaskCase {
  std::string name;
  ProblemShape shape;  // dtype, sizes, causal/window/softcap/ALiBi/dropout options
  Dense dense = Dense::none;
  DType bias_dtype = DType::float32;
  std::vector<std::int64_t> mask_shape{-1, -1, -1, -1};  // -1 = the full size, 1 = broadcast
  Block block = Block::none;
  std::int64_t block_q = 128, block_k = 128;
  bool block_per_head = false;   // lists [B, H, ...] instead of [1, 1, ...]
  bool masked_rows = false;      // some rows and a whole 64-row band see no key
  bool block_structure = false;  // Dense::boolean: whole empty and whole full 128 x 128 blocks too
  std::int64_t band_left = -1, band_right = 0, band_diagonal = 0;  // Block::band / prefix
  bool documents_unsorted = false;  // Block::documents: ids not ascending (the kernels' per-element pass)
  bool shared_pattern = false;      // Block::pattern: one block-periodic pattern stored once (every partial id 0)
  bool dbias = false;
  bool deterministic = false;
};
void PrintTo(const MaskCase& c, std::ostream* os) { *os << c.name << " " << c.shape.describe(); }

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}
// A deterministic pseudo-random draw in [0, 1) per element.
double draw(std::uint64_t seed, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  const std::uint64_t x = mix(seed ^ mix(static_cast<std::uint64_t>(b) * 1000003u + static_cast<std::uint64_t>(h)) ^
                              mix(static_cast<std::uint64_t>(i) * 7919u + static_cast<std::uint64_t>(j) * 104729u));
  return static_cast<double>(x >> 11) / 9007199254740992.0;
}

// Owns every host tensor of a case and its device mirror.
class MaskedRun {
 public:
  explicit MaskedRun(const MaskCase& c) : c_(c), problem_(c.shape) {
    const ProblemShape& s = c.shape;
    const std::int64_t full[4] = {s.batch, s.heads_q, s.seqlen_q, s.seqlen_k};
    for (int d = 0; d < 4; ++d) mask_shape_[d] = c.mask_shape[static_cast<std::size_t>(d)] < 0 ? full[d] : 1;
    if (c.dense != Dense::none) build_dense();
    if (c.block != Block::none) build_block();
    if (c.dbias) {
      dbias_ = HostTensor(c.bias_dtype, {mask_shape_[0], mask_shape_[1], mask_shape_[2], mask_shape_[3]});
      dbias_.fill_canary();
    }
    for (HostTensor* t : {&problem_.q, &problem_.k, &problem_.v, &problem_.out, &problem_.lse, &problem_.dout, &problem_.dq,
                          &problem_.dk, &problem_.dv, &problem_.alibi_slopes, &attn_mask_, &dense_equivalent_, &dbias_,
                          &kv_num_, &kv_idx_, &full_kv_num_, &full_kv_idx_, &q_num_, &q_idx_, &full_q_num_, &full_q_idx_,
                          &ids_, &q_ids_, &bits_, &prefix_, &q_docs_, &k_docs_})
      if (t->numel() > 0) add_mirror(t);
  }
  MaskedRun(const MaskedRun&) = delete;
  MaskedRun& operator=(const MaskedRun&) = delete;

  AttentionProblem& problem() { return problem_; }
  const HostTensor& dbias() const { return dbias_; }
  std::int64_t list_batches() const { return mb_; }
  std::int64_t list_heads() const { return mh_; }
  // The kind of mask block (m, n) of (b, h) in the dense truth of the block mask.
  TileKind block_kind(std::int64_t b, std::int64_t h, std::int64_t m, std::int64_t n) const {
    const ProblemShape& s = c_.shape;
    std::int64_t allowed = 0, total = 0;
    for (std::int64_t i = m * c_.block_q; i < std::min(s.seqlen_q, (m + 1) * c_.block_q); ++i)
      for (std::int64_t j = n * c_.block_k; j < std::min(s.seqlen_k, (n + 1) * c_.block_k); ++j, ++total)
        allowed += block_allows(b, h, i, j);
    return allowed == 0 ? TileKind::empty : allowed == total ? TileKind::full : TileKind::partial;
  }

  // The call's masks on the host (reference = true: the oracle's — a block mask alone
  // becomes its dense boolean equivalent).
  AttentionOptions with_masks(AttentionOptions o, bool reference) {
    if (c_.dense != Dense::none) o.maybe_attn_mask = broadcast_view(attn_mask_);
    if (c_.block != Block::none) {
      if (reference && c_.dense == Dense::none) o.maybe_attn_mask = broadcast_view(dense_equivalent_);
      else o.maybe_block_mask = block_args_;
    }
    o.deterministic = c_.deterministic;
    return o;
  }
  ForwardArgs host_forward_args(Algorithm algorithm, bool reference) {
    ForwardArgs a = problem_.forward_args(algorithm);
    a.options = with_masks(a.options, reference);
    return a;
  }
  BackwardArgs host_backward_args(bool reference) {
    BackwardArgs a = problem_.backward_args();
    a.options = with_masks(a.options, reference);
    if (c_.dbias) a.maybe_dbias = dbias_.view();
    return a;
  }

  // Poison out/LSE, run the forward on the device, download.
  void run_forward(Algorithm algorithm) {
    poison(problem_.out), poison(problem_.lse);
    ForwardArgs a = host_forward_args(algorithm, false);
    for (TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.maybe_lse}) to_device(*t);
    options_to_device(a.options);
    forward(a, ExecutionContext{});
    cuda_or_throw(cudaDeviceSynchronize(), "masked forward on the device");
    download(problem_.out), download(problem_.lse);
  }
  // The call's backward arguments on the device mirrors (no workspace).
  BackwardArgs device_backward_args() {
    BackwardArgs a = host_backward_args(false);
    for (TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.lse, &a.dq, &a.dk, &a.dv, &a.maybe_dbias}) to_device(*t);
    options_to_device(a.options);
    return a;
  }
  // Poison dq/dk/dv/dbias and the workspace, run the backward of the device's out/LSE, download.
  void run_backward() {
    for (HostTensor* t : {&problem_.dq, &problem_.dk, &problem_.dv}) poison(*t);
    if (c_.dbias) poison(dbias_);
    BackwardArgs a = device_backward_args();
    const std::size_t workspace_bytes = backward_workspace_bytes(a);
    DeviceBuffer workspace(std::max<std::size_t>(workspace_bytes, 1));
    cuda_or_throw(cudaMemset(workspace.data(), 0xFF, workspace.bytes()), "poison the workspace");
    a.maybe_workspace = TensorView::contiguous(workspace.data(), DType::uint8,
                                               {static_cast<std::int64_t>(workspace.bytes())}, Device::cuda(0));
    backward(a, ExecutionContext{});
    cuda_or_throw(cudaDeviceSynchronize(), "masked backward on the device");
    for (HostTensor* t : {&problem_.dq, &problem_.dk, &problem_.dv}) download(*t);
    if (c_.dbias) download(dbias_);
  }

  // out and LSE against the float64 reference (2x rule).
  void expect_forward_matches(const std::string& label) {
    const AttentionParams params = validate_forward(host_forward_args(Algorithm::reference, true));
    const cpu::ReferenceResult ref = cpu::reference_forward(params);
    const cpu::ReferenceResult low = cpu::naive_forward_in_precision(params, params.dtype);
    const cpu::ReferenceResult got = gather_output(problem_);
    const double floor = tolerance_floor(params.dtype);
    EXPECT_LE(max_abs_difference(got.out, ref.out), 2.0 * max_abs_difference(low.out, ref.out) + floor) << label << " (out)";
    EXPECT_LE(max_abs_difference(got.lse, ref.lse), 2.0 * max_abs_difference(low.lse, ref.lse) + floor) << label << " (lse)";
  }
  // dq/dk/dv (and dbias) against the float64 reference of the device's out/LSE (3x rule).
  void expect_backward_matches(const std::string& label) {
    const BackwardParams params = validate_backward(host_backward_args(true));
    const cpu::ReferenceGradients ref = cpu::reference_backward(params);
    const cpu::ReferenceGradients low = cpu::naive_backward_in_precision(params, params.dtype);
    const cpu::ReferenceGradients got = gather_gradients(problem_);
    expect_gradient(label + " (dq)", got.dq, ref.dq, low.dq, params.dtype);
    expect_gradient(label + " (dk)", got.dk, ref.dk, low.dk, params.dtype);
    expect_gradient(label + " (dv)", got.dv, ref.dv, low.dv, params.dtype);
    // dBias needs a float attn_mask, so the oracle ran the call's own masks; its dbias is
    // in the dbias shape too (broadcast dimensions summed).
    if (c_.dbias) expect_gradient(label + " (dbias)", dbias_.to_double(), ref.dbias, low.dbias, c_.bias_dtype);
  }

 private:
  // max|got - ref| <= 3 max|low - ref| + floor, floor = one rounding of the output's dtype
  // at the gradient's magnitude; non-finite values fail.
  static void expect_gradient(const std::string& label, const std::vector<double>& got, const std::vector<double>& ref,
                              const std::vector<double>& low, DType dtype) {
    ASSERT_EQ(got.size(), ref.size()) << label;
    double magnitude = 0;
    for (double x : ref) magnitude = std::max(magnitude, std::isfinite(x) ? std::abs(x) : 0.0);
    const double epsilon = dtype == DType::bfloat16 ? 1.0 / 256 : dtype == DType::float16 ? 1.0 / 2048 : 1e-6;
    const double floor = std::max(1e-4, epsilon) * std::max(1.0, magnitude);
    const double error = max_abs_difference(got, ref);
    EXPECT_LE(error, 3.0 * max_abs_difference(low, ref) + floor) << label << ", max |ref| " << magnitude;
  }

  // A 4-d mask tensor's view with stride 0 on its size-1 dimensions (torch's expand()).
  TensorView broadcast_view(HostTensor& t) const {
    const auto& sh = t.shape();
    auto stride = [&](int d, std::int64_t dense) { return sh[static_cast<std::size_t>(d)] == 1 ? 0 : dense; };
    return TensorView::strided(t.data(), t.dtype(), {sh[0], sh[1], sh[2], sh[3]},
                               {stride(0, sh[1] * sh[2] * sh[3]), stride(1, sh[2] * sh[3]), stride(2, sh[3]), stride(3, 1)});
  }
  std::int64_t mask_index(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    const std::int64_t* m = mask_shape_;
    return (((m[0] == 1 ? 0 : b) * m[1] + (m[1] == 1 ? 0 : h)) * m[2] + (m[2] == 1 ? 0 : i)) * m[3] + (m[3] == 1 ? 0 : j);
  }
  // Rows that see no key when masked_rows: row 3 and rows [64, 128) (a whole kernel tile
  // at block_m 64, half of one at 128), in every (b, h).
  bool is_masked_row(std::int64_t i) const { return c_.masked_rows && (i == 3 || (i >= 64 && i < 128)); }

  void build_dense() {
    const ProblemShape& s = c_.shape;
    const bool is_bool = c_.dense == Dense::boolean;
    attn_mask_ = HostTensor(is_bool ? DType::boolean : c_.bias_dtype, {mask_shape_[0], mask_shape_[1], mask_shape_[2], mask_shape_[3]});
    for (std::int64_t b = 0; b < mask_shape_[0]; ++b)
      for (std::int64_t h = 0; h < mask_shape_[1]; ++h)
        for (std::int64_t i = 0; i < mask_shape_[2]; ++i)
          for (std::int64_t j = 0; j < mask_shape_[3]; ++j) {
            const double u = draw(17, b, h, i, j);
            bool hidden = is_masked_row(i) || (is_bool ? u < 0.3 : u < 0.15);
            if (is_bool && c_.block_structure) {
              // 128 x 128 blocks (in mask coordinates) all hidden, all allowed, or random, by
              // a pattern that moves with (b, h): every kind at every block size <= 128.
              const std::int64_t kind = (i / 128 + j / 128 + b + 2 * h) % 3;
              if (kind == 1) hidden = true;
              if (kind == 2) hidden = is_masked_row(i);
            }
            const std::int64_t e = mask_index(b, h, i, j);
            if (is_bool) static_cast<std::uint8_t*>(attn_mask_.data())[e] = hidden ? 0 : 1;
            else attn_mask_.set(e, hidden ? -std::numeric_limits<float>::infinity() : static_cast<float>(4.0 * u - 2.0));
          }
    (void)s;
  }

  // The dense truth of the block mask's pattern or rule for (b, h, i, j).
  // The shared pattern's element (r, col) of a mask block.
  static bool periodic_allows(std::int64_t r, std::int64_t col) { return draw(11, 0, 0, r, col) < 0.6; }
  bool block_allows(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    if (is_masked_row(i)) return false;
    const ProblemShape& s = c_.shape;
    const auto band = [&] {
      const std::int64_t diagonal = i + c_.band_diagonal;
      return (c_.band_left < 0 || j >= diagonal - c_.band_left) && (c_.band_right < 0 || j <= diagonal + c_.band_right);
    };
    switch (c_.block) {
      case Block::pattern: {
        if (c_.shared_pattern) return periodic_allows(i % c_.block_q, j % c_.block_k);
        // A band that moves with (b, h), and holes: empty, full and partial blocks.
        const std::int64_t shift = c_.block_per_head ? 40 * b + 13 * h : 0;
        const bool in_band = j <= i + shift + (s.seqlen_k - s.seqlen_q) + 50 && j + 150 > i;
        return in_band && !(j % 7 == 0 && draw(5, c_.block_per_head ? b : 0, c_.block_per_head ? h : 0, i, j) < 0.5);
      }
      case Block::band: return band();
      case Block::documents: return q_doc(b, i) == k_doc(b, j) && (c_.band_right < 0 || band());
      case Block::prefix: return band() || j < prefix_of(b);
      case Block::none: return true;
    }
    return true;
  }
  // Ascending ids (packed sequences), or with documents_unsorted the same documents
  // renamed out of order (id ^ 1: 1, 0, 3, 2, ...).
  std::int32_t q_doc(std::int64_t b, std::int64_t i) const {
    return static_cast<std::int32_t>((i + 11 * b) / 37) ^ (c_.documents_unsorted ? 1 : 0);
  }
  std::int32_t k_doc(std::int64_t b, std::int64_t j) const {
    return static_cast<std::int32_t>((j + 5 * b) / 45) ^ (c_.documents_unsorted ? 1 : 0);
  }
  std::int32_t prefix_of(std::int64_t b) const { return static_cast<std::int32_t>(30 + 20 * b); }

  // FlexAttention lists of the pattern/rule: full blocks, partial blocks (with bits
  // for Block::pattern), empty ones left out; the transposed lists too.
  void build_block() {
    const ProblemShape& s = c_.shape;
    const std::int64_t bq = c_.block_q, bk = c_.block_k;
    // Lists per batch item where the truth depends on it (documents, prefix; block_per_head
    // patterns), per head for block_per_head; else one broadcast set.
    const bool per_batch = c_.block_per_head || c_.block == Block::documents || c_.block == Block::prefix;
    mb_ = per_batch ? s.batch : 1, mh_ = c_.block_per_head ? s.heads_q : 1;
    const std::int64_t mb = mb_, mh = mh_;
    const std::int64_t q_blocks = (s.seqlen_q + bq - 1) / bq, kv_blocks = (s.seqlen_k + bk - 1) / bk;
    const std::int64_t words = (bk + 31) / 32;
    const bool with_bits = c_.block == Block::pattern;
    kv_num_ = HostTensor(DType::int32, {mb, mh, q_blocks});
    full_kv_num_ = HostTensor(DType::int32, {mb, mh, q_blocks});
    kv_idx_ = HostTensor(DType::int32, {mb, mh, q_blocks, kv_blocks});
    full_kv_idx_ = HostTensor(DType::int32, {mb, mh, q_blocks, kv_blocks});
    ids_ = HostTensor(DType::int32, {mb, mh, q_blocks, kv_blocks});
    q_num_ = HostTensor(DType::int32, {mb, mh, kv_blocks});
    full_q_num_ = HostTensor(DType::int32, {mb, mh, kv_blocks});
    q_idx_ = HostTensor(DType::int32, {mb, mh, kv_blocks, q_blocks});
    full_q_idx_ = HostTensor(DType::int32, {mb, mh, kv_blocks, q_blocks});
    q_ids_ = HostTensor(DType::int32, {mb, mh, kv_blocks, q_blocks});
    auto* kv_num = static_cast<std::int32_t*>(kv_num_.data());
    auto* full_kv_num = static_cast<std::int32_t*>(full_kv_num_.data());
    auto* kv_idx = static_cast<std::int32_t*>(kv_idx_.data());
    auto* full_kv_idx = static_cast<std::int32_t*>(full_kv_idx_.data());
    auto* ids = static_cast<std::int32_t*>(ids_.data());
    auto* q_num = static_cast<std::int32_t*>(q_num_.data());
    auto* full_q_num = static_cast<std::int32_t*>(full_q_num_.data());
    auto* q_idx = static_cast<std::int32_t*>(q_idx_.data());
    auto* full_q_idx = static_cast<std::int32_t*>(full_q_idx_.data());
    auto* q_ids = static_cast<std::int32_t*>(q_ids_.data());
    // Unused slots hold garbage, as a real BlockMask's may.
    std::fill(kv_idx, kv_idx + kv_idx_.numel(), -7), std::fill(full_kv_idx, full_kv_idx + full_kv_idx_.numel(), 999);
    std::fill(q_idx, q_idx + q_idx_.numel(), -7), std::fill(full_q_idx, full_q_idx + full_q_idx_.numel(), 999);
    std::fill(ids, ids + ids_.numel(), -7), std::fill(q_ids, q_ids + q_ids_.numel(), -7);
    std::vector<std::int32_t> bits;
    std::int32_t partial_count = 0;
    for (std::int64_t b = 0; b < mb; ++b)
      for (std::int64_t h = 0; h < mh; ++h) {
        const std::int64_t head = b * mh + h;
        for (std::int64_t m = 0; m < q_blocks; ++m)
          for (std::int64_t n = 0; n < kv_blocks; ++n) {
            std::int64_t allowed = 0, total = 0;
            for (std::int64_t i = m * bq; i < std::min(s.seqlen_q, (m + 1) * bq); ++i)
              for (std::int64_t j = n * bk; j < std::min(s.seqlen_k, (n + 1) * bk); ++j, ++total) allowed += block_allows(b, h, i, j);
            if (allowed == 0) continue;
            const bool is_full = allowed == total;
            std::int32_t* num = is_full ? full_kv_num : kv_num;
            std::int32_t* idx = is_full ? full_kv_idx : kv_idx;
            const std::int32_t slot = num[head * q_blocks + m]++;
            idx[(head * q_blocks + m) * kv_blocks + slot] = static_cast<std::int32_t>(n);
            std::int32_t* qnum = is_full ? full_q_num : q_num;
            std::int32_t* qidx = is_full ? full_q_idx : q_idx;
            const std::int32_t qslot = qnum[head * kv_blocks + n]++;
            qidx[(head * kv_blocks + n) * q_blocks + qslot] = static_cast<std::int32_t>(m);
            if (is_full || !with_bits) continue;
            if (c_.shared_pattern) {
              // Every partial block names bit-mask 0, the pattern stored once (a tile over
              // several such blocks must not read them as one block's bits).
              ids[(head * q_blocks + m) * kv_blocks + slot] = 0;
              q_ids[(head * kv_blocks + n) * q_blocks + qslot] = 0;
              if (partial_count == 0) {
                bits.assign(static_cast<std::size_t>(bq * words), 0);
                for (std::int64_t r = 0; r < bq; ++r)
                  for (std::int64_t col = 0; col < bk; ++col)
                    if (periodic_allows(r, col))
                      bits[static_cast<std::size_t>(r * words + col / 32)] |= static_cast<std::int32_t>(1u << (col % 32));
                partial_count = 1;
              }
              continue;
            }
            ids[(head * q_blocks + m) * kv_blocks + slot] = partial_count;
            q_ids[(head * kv_blocks + n) * q_blocks + qslot] = partial_count;
            bits.resize(static_cast<std::size_t>((partial_count + 1) * bq * words), 0);
            for (std::int64_t r = 0; r < bq; ++r)
              for (std::int64_t col = 0; col < bk; ++col) {
                const std::int64_t i = m * bq + r, j = n * bk + col;
                if (i < s.seqlen_q && j < s.seqlen_k && block_allows(b, h, i, j))
                  bits[static_cast<std::size_t>((partial_count * bq + r) * words + col / 32)] |= static_cast<std::int32_t>(1u << (col % 32));
              }
            ++partial_count;
          }
      }
    BlockMaskArgs& a = block_args_;
    a.block_size_q = bq, a.block_size_kv = bk;
    a.kv_num_blocks = kv_num_.view(), a.kv_indices = kv_idx_.view();
    a.maybe_full_kv_num_blocks = full_kv_num_.view(), a.maybe_full_kv_indices = full_kv_idx_.view();
    a.maybe_q_num_blocks = q_num_.view(), a.maybe_q_indices = q_idx_.view();
    a.maybe_full_q_num_blocks = full_q_num_.view(), a.maybe_full_q_indices = full_q_idx_.view();
    if (with_bits) {
      bits_ = HostTensor(DType::int32, {partial_count, bq, words});
      if (!bits.empty()) std::memcpy(bits_.data(), bits.data(), bits.size() * sizeof(std::int32_t));
      a.maybe_partial_bits = bits_.view(), a.maybe_partial_ids = ids_.view(), a.maybe_q_partial_ids = q_ids_.view();
    }
    if (c_.block == Block::band || c_.block == Block::prefix || (c_.block == Block::documents && c_.band_right >= 0)) {
      a.has_band = true, a.diagonal_offset = c_.band_diagonal, a.window_left = c_.band_left, a.window_right = c_.band_right;
    }
    if (c_.block == Block::prefix) {
      prefix_ = HostTensor(DType::int32, {s.batch});
      for (std::int64_t b = 0; b < s.batch; ++b) static_cast<std::int32_t*>(prefix_.data())[b] = prefix_of(b);
      a.maybe_prefix_lengths = prefix_.view();
    }
    if (c_.block == Block::documents) {
      q_docs_ = HostTensor(DType::int32, {s.batch, s.seqlen_q});
      k_docs_ = HostTensor(DType::int32, {s.batch, s.seqlen_k});
      for (std::int64_t b = 0; b < s.batch; ++b) {
        for (std::int64_t i = 0; i < s.seqlen_q; ++i) static_cast<std::int32_t*>(q_docs_.data())[b * s.seqlen_q + i] = q_doc(b, i);
        for (std::int64_t j = 0; j < s.seqlen_k; ++j) static_cast<std::int32_t*>(k_docs_.data())[b * s.seqlen_k + j] = k_doc(b, j);
      }
      a.maybe_q_document_ids = q_docs_.view(), a.maybe_k_document_ids = k_docs_.view();
    }
    const std::int64_t eb = mb, eh = mh;
    dense_equivalent_ = HostTensor(DType::boolean, {eb, eh, s.seqlen_q, s.seqlen_k});
    auto* dense = static_cast<std::uint8_t*>(dense_equivalent_.data());
    for (std::int64_t b = 0; b < eb; ++b)
      for (std::int64_t h = 0; h < eh; ++h)
        for (std::int64_t i = 0; i < s.seqlen_q; ++i)
          for (std::int64_t j = 0; j < s.seqlen_k; ++j)
            dense[((b * eh + h) * s.seqlen_q + i) * s.seqlen_k + j] = block_allows(b, h, i, j) ? 1 : 0;
  }

  // ---- device mirrors -----------------------------------------------------------
  struct Mirror {
    HostTensor* host;
    DeviceBuffer device;
  };
  void add_mirror(HostTensor* t) {
    Mirror m{t, DeviceBuffer(host_bytes(*t))};
    m.device.upload(t->data());
    mirrors_.push_back(std::move(m));
  }
  Mirror& mirror_of(const HostTensor& t) {
    for (auto& m : mirrors_)
      if (m.host == &t) return m;
    throw std::runtime_error("tensor not mirrored");
  }
  void poison(HostTensor& t) {
    t.fill_canary();
    mirror_of(t).device.upload(t.data());
  }
  void download(HostTensor& t) { mirror_of(t).device.download(t.data()); }
  void to_device(TensorView& view) {
    if (!view.defined()) return;
    const auto* p = static_cast<const unsigned char*>(view.data);
    for (auto& m : mirrors_) {
      const auto* base = static_cast<const unsigned char*>(m.host->data());
      if (p >= base && p < base + host_bytes(*m.host)) {
        view.data = static_cast<unsigned char*>(m.device.data()) + (p - base);
        view.device = Device::cuda(0);
        return;
      }
    }
    throw std::runtime_error("view points into no mirrored host buffer");
  }
  void options_to_device(AttentionOptions& o) {
    to_device(o.maybe_alibi_slopes);
    to_device(o.maybe_attn_mask);
    if (!o.maybe_block_mask) return;
    BlockMaskArgs& a = *o.maybe_block_mask;
    for (TensorView* t : {&a.kv_num_blocks, &a.kv_indices, &a.maybe_full_kv_num_blocks, &a.maybe_full_kv_indices,
                          &a.maybe_q_num_blocks, &a.maybe_q_indices, &a.maybe_full_q_num_blocks, &a.maybe_full_q_indices,
                          &a.maybe_prefix_lengths, &a.maybe_q_document_ids, &a.maybe_k_document_ids, &a.maybe_partial_bits,
                          &a.maybe_partial_ids, &a.maybe_q_partial_ids})
      to_device(*t);
  }

  MaskCase c_;
  AttentionProblem problem_;
  std::int64_t mask_shape_[4] = {1, 1, 1, 1};
  std::int64_t mb_ = 1, mh_ = 1;  // batch and head sizes of the block lists
  HostTensor attn_mask_, dense_equivalent_, dbias_;
  HostTensor kv_num_, kv_idx_, full_kv_num_, full_kv_idx_, q_num_, q_idx_, full_q_num_, full_q_idx_, ids_, q_ids_, bits_;
  HostTensor prefix_, q_docs_, k_docs_;
  BlockMaskArgs block_args_;
  std::vector<Mirror> mirrors_;
};

// ---- the cases ----------------------------------------------------------------------

MaskCase dense_case(std::string name, ProblemShape shape, Dense dense, std::vector<std::int64_t> mask_shape,
                    DType bias_dtype = DType::float32, bool dbias = false) {
  MaskCase c;
  c.name = std::move(name), c.shape = shape, c.dense = dense, c.mask_shape = std::move(mask_shape);
  c.bias_dtype = bias_dtype, c.dbias = dbias;
  return c;
}
MaskCase block_case(std::string name, ProblemShape shape, Block block, std::int64_t block_q, std::int64_t block_k) {
  MaskCase c;
  c.name = std::move(name), c.shape = shape, c.block = block, c.block_q = block_q, c.block_k = block_k;
  return c;
}
MaskCase& with_masked_rows(MaskCase& c) { return c.masked_rows = true, c; }

std::vector<MaskCase> full_cases() {
  const DType f16 = DType::float16, bf16 = DType::bfloat16, f32 = DType::float32;
  const std::vector<std::int64_t> all{-1, -1, -1, -1};
  std::vector<MaskCase> cases = {
      // Dense masks: boolean and additive bias (with -inf), broadcast shapes, dBias.
      dense_case("bool", make(f16, 2, 97, 113, 4, 2, 64), Dense::boolean, all),
      dense_case("bool [B,1,Sq,Sk]", make(bf16, 2, 300, 200, 2, 2, 128), Dense::boolean, {-1, 1, -1, -1}),
      dense_case("bool [1,1,Sq,Sk] causal", causal(make(f16, 2, 129, 257, 2, 1, 128)), Dense::boolean, {1, 1, -1, -1}),
      dense_case("bias f32 [1,1,Sq,Sk]", make(f16, 2, 130, 257, 2, 2, 64), Dense::bias, {1, 1, -1, -1}, f32, true),
      dense_case("bias bf16 [B,1,1,Sk]", make(bf16, 2, 203, 190, 4, 2, 128), Dense::bias, {-1, 1, 1, -1}, bf16, true),
      dense_case("bias f16 [B,H,Sq,Sk] causal", causal(make(f16, 1, 200, 333, 2, 2, 128)), Dense::bias, all, f16, true),
      dense_case("bias f32 [1,H,Sq,1]", make(bf16, 2, 150, 77, 2, 1, 64), Dense::bias, {1, -1, -1, 1}, f32, true),
      dense_case("bias f32 window", window(make(f16, 1, 257, 300, 2, 2, 64), 40, 8), Dense::bias, all, f32, true),
      dense_case("bias bf16 dropout", dropout(make(bf16, 1, 160, 170, 2, 2, 64), 0.2), Dense::bias, {1, -1, -1, -1}, bf16, true),
      dense_case("bool softcap", softcap(make(f16, 1, 150, 170, 2, 1, 64), 5.0), Dense::boolean, all),
      dense_case("bias alibi", alibi(make(bf16, 2, 113, 129, 2, 2, 128), 2), Dense::bias, all, f32, true),
      dense_case("bias softcap causal", softcap(causal(make(f16, 1, 170, 150, 2, 2, 128)), 2.0), Dense::bias, all, f16, true),
      dense_case("bool seqlen_q 1", make(bf16, 2, 1, 300, 2, 2, 64), Dense::boolean, all),
      dense_case("bias hdim 96 (flash2 only)", make(f16, 1, 100, 140, 2, 2, 96), Dense::bias, all, f32, true),
      // Block masks: pattern with partial bits, mask blocks below / equal to / above the kernel tiles.
      block_case("pattern 16x32", make(f16, 2, 150, 260, 2, 1, 64), Block::pattern, 16, 32),
      block_case("pattern 64x64", make(bf16, 2, 300, 200, 2, 2, 128), Block::pattern, 64, 64),
      block_case("pattern 128x128", make(f16, 1, 257, 385, 4, 2, 128), Block::pattern, 128, 128),
      block_case("pattern 256x128", make(bf16, 2, 300, 333, 2, 2, 64), Block::pattern, 256, 128),
      block_case("pattern 64x256 causal", causal(make(f16, 1, 200, 300, 2, 2, 64)), Block::pattern, 64, 256),
      block_case("pattern window", window(make(bf16, 1, 300, 300, 2, 2, 128), 100, 20), Block::pattern, 32, 64),
      block_case("pattern dropout", dropout(make(f16, 1, 200, 230, 2, 2, 64), 0.25), Block::pattern, 64, 128),
      block_case("pattern softcap", softcap(make(bf16, 1, 190, 210, 2, 2, 64), 4.0), Block::pattern, 128, 64),
      // Built-in rules (no bits).
      block_case("band causal top-left", make(f16, 2, 200, 300, 2, 2, 64), Block::band, 64, 64),
      block_case("band sliding bottom-right", make(bf16, 1, 257, 129, 4, 1, 128), Block::band, 128, 32),
      block_case("documents", make(f16, 2, 230, 260, 2, 2, 128), Block::documents, 32, 64),
      block_case("documents causal", make(bf16, 2, 200, 200, 2, 1, 64), Block::documents, 64, 128),
      block_case("prefix-LM", make(f16, 2, 180, 180, 2, 2, 64), Block::prefix, 16, 16),
      block_case("band + options causal", causal(make(f16, 1, 160, 260, 2, 2, 128)), Block::band, 256, 256),
  };
  // Per-case adjustments beyond the helpers.
  for (MaskCase& c : cases) {
    if (c.name == "pattern 64x64" || c.name == "pattern 256x128" || c.name == "documents") c.block_per_head = true;
    if (c.name == "band sliding bottom-right") c.band_left = 50, c.band_right = 10, c.band_diagonal = 129 - 257;
    if (c.name == "documents") c.band_right = -1;
    if (c.name == "documents causal") c.band_right = 0;
    if (c.name == "band + options causal") c.band_left = 64, c.band_right = 0, c.band_diagonal = 20;
  }
  {
    // The kernels' fast element pass (a tile code: mask blocks at least as large as the
    // kernel tiles, no dense mask, ascending documents): band, sliding band, prefix-LM
    // (two spans per row), documents with and without the band, bits over sequence tails;
    // unsorted documents take the per-element pass. d256 Hopper key tiles of 80 straddle
    // 128-blocks (per-element) or sit inside them (fast).
    MaskCase a = block_case("fast band causal 128", make(bf16, 2, 300, 300, 2, 2, 128), Block::band, 128, 128);
    cases.push_back(a);
    MaskCase b = block_case("fast band sliding 256", make(f16, 1, 333, 290, 2, 2, 64), Block::band, 256, 256);
    b.band_left = 70, b.band_right = 10, b.band_diagonal = 5;
    cases.push_back(b);
    MaskCase c = block_case("fast documents causal 128", make(bf16, 2, 260, 260, 2, 2, 128), Block::documents, 128, 128);
    c.block_per_head = true;
    cases.push_back(c);
    MaskCase d = block_case("fast documents 256", make(f16, 2, 300, 270, 2, 1, 64), Block::documents, 256, 256);
    d.band_right = -1;
    cases.push_back(d);
    // One pattern stored once (every partial id 0) under 32- and 64-wide mask blocks: the
    // kernels' tiles span several blocks sharing the id and must take the general pass.
    MaskCase shared64 = block_case("shared pattern 64x64", make(bf16, 2, 300, 330, 2, 2, 128), Block::pattern, 64, 64);
    shared64.shared_pattern = true;
    cases.push_back(shared64);
    MaskCase shared32 = block_case("shared pattern 32x32 d256", make(f16, 1, 200, 260, 2, 1, 256), Block::pattern, 32, 32);
    shared32.shared_pattern = true;
    cases.push_back(shared32);
    MaskCase e = block_case("documents unsorted 128", make(bf16, 2, 260, 260, 2, 2, 128), Block::documents, 128, 128);
    e.documents_unsorted = true;
    cases.push_back(e);
    MaskCase f = block_case("fast prefix-LM sliding 128", make(f16, 2, 230, 230, 2, 2, 64), Block::prefix, 128, 128);
    f.band_left = 40;
    cases.push_back(f);
    MaskCase g = block_case("fast prefix-LM causal 256", causal(make(bf16, 1, 300, 300, 2, 2, 128)), Block::prefix, 256, 256);
    cases.push_back(g);
    MaskCase h = block_case("fast pattern 256 tails", make(bf16, 1, 300, 390, 2, 2, 128), Block::pattern, 256, 256);
    h.block_per_head = true;
    cases.push_back(h);
    MaskCase i = block_case("fast band d256", make(bf16, 1, 260, 300, 2, 2, 256), Block::band, 128, 128);
    cases.push_back(i);
    MaskCase j = block_case("fast pattern dropout 128", dropout(make(f16, 1, 200, 230, 2, 2, 64), 0.25), Block::pattern, 128, 128);
    cases.push_back(j);
    MaskCase k = block_case("fast band softcap 128", softcap(make(bf16, 1, 190, 210, 2, 2, 128), 4.0), Block::band, 128, 128);
    cases.push_back(k);
    // Documents on the Hopper forward's dropout kernel and on d256's key tiles of 80 (the
    // row-interval pass, FLASHATTN_CUDA_MASKS_ROW_INTERVALS, runs in both).
    MaskCase l = block_case("fast documents causal dropout 128", dropout(make(bf16, 1, 260, 300, 2, 2, 128), 0.2),
                            Block::documents, 128, 128);
    cases.push_back(l);
    MaskCase m = block_case("fast documents causal d256", make(f16, 2, 300, 260, 2, 1, 256), Block::documents, 128, 128);
    cases.push_back(m);
    // The Hopper backward's key-interval pass (the default; off under the masks_bwd_fast_pass. prefix):
    // deterministic turns with GQA on both tile shapes, prefix-LM with a window at d128
    // (query rows of two spans, keys of one), ALiBi's affine path on partial tiles.
    MaskCase n = block_case("fast documents causal deterministic 128", make(bf16, 2, 260, 300, 4, 2, 128),
                            Block::documents, 128, 128);
    n.deterministic = true;
    cases.push_back(n);
    MaskCase o = block_case("fast band sliding deterministic 64", make(f16, 1, 333, 290, 4, 1, 64), Block::band, 128, 128);
    o.band_left = 70, o.band_right = 10, o.band_diagonal = 5, o.deterministic = true;
    cases.push_back(o);
    MaskCase q = block_case("fast prefix-LM sliding d128", make(bf16, 2, 230, 260, 2, 2, 128), Block::prefix, 128, 128);
    q.band_left = 40;
    cases.push_back(q);
    MaskCase r = block_case("fast documents alibi 128", alibi(make(bf16, 1, 260, 260, 2, 2, 128), 2), Block::documents, 128, 128);
    cases.push_back(r);
  }
  {
    // Block mask and a bias together (the oracle reads both), dBias through both.
    MaskCase c = block_case("pattern + bias f32 [1,1,Sq,Sk]", make(f16, 2, 200, 220, 2, 2, 64), Block::pattern, 64, 32);
    c.dense = Dense::bias, c.mask_shape = {1, 1, -1, -1}, c.dbias = true, c.block_per_head = true;
    cases.push_back(c);
    MaskCase d = block_case("band + bool causal", causal(make(bf16, 1, 190, 190, 2, 2, 128)), Block::band, 32, 32);
    d.dense = Dense::boolean, d.band_left = 60, d.band_right = -1;
    cases.push_back(d);
  }
  {
    // Fully masked rows and a whole empty query band: output 0, LSE -inf, zero gradients.
    MaskCase a = dense_case("masked rows bool", make(f16, 1, 150, 130, 2, 2, 64), Dense::boolean, all);
    cases.push_back(with_masked_rows(a));
    MaskCase b = dense_case("masked rows bias", causal(make(bf16, 2, 140, 160, 2, 1, 128)), Dense::bias, {1, -1, -1, -1}, f32, true);
    cases.push_back(with_masked_rows(b));
    MaskCase p = block_case("masked rows pattern", make(f16, 1, 200, 180, 2, 2, 64), Block::pattern, 32, 64);
    cases.push_back(with_masked_rows(p));
    MaskCase q = block_case("masked rows pattern 128", make(bf16, 1, 200, 180, 2, 2, 128), Block::pattern, 128, 128);
    cases.push_back(with_masked_rows(q));
  }
  {
    // Deterministic backward (GQA): also bitwise repeatable (Backward test).
    MaskCase a = dense_case("deterministic bias", make(bf16, 2, 190, 210, 4, 2, 128), Dense::bias, {1, 1, -1, -1}, bf16, true);
    a.deterministic = true;
    cases.push_back(a);
    MaskCase b = block_case("deterministic pattern", causal(make(f16, 2, 230, 200, 4, 1, 64)), Block::pattern, 64, 64);
    b.deterministic = true, b.block_per_head = true;
    cases.push_back(b);
  }
  return cases;
}

// Tiny shapes covering the tail tiles, for compute-sanitizer.
std::vector<MaskCase> small_cases() {
  const DType f16 = DType::float16, bf16 = DType::bfloat16, f32 = DType::float32;
  std::vector<MaskCase> cases = {
      dense_case("small bool", make(f16, 1, 17, 33, 2, 1, 64), Dense::boolean, {-1, -1, -1, -1}),
      dense_case("small bias [1,1,1,Sk]", causal(make(bf16, 2, 65, 31, 2, 2, 128)), Dense::bias, {1, 1, 1, -1}, bf16, true),
      block_case("small pattern 16x16", make(f16, 1, 70, 130, 2, 2, 64), Block::pattern, 16, 16),
      block_case("small documents", make(bf16, 1, 129, 65, 2, 1, 128), Block::documents, 64, 32),
      block_case("small fast documents", make(f16, 1, 129, 97, 2, 1, 64), Block::documents, 128, 128),
      block_case("small fast prefix-LM", make(bf16, 1, 97, 113, 2, 2, 128), Block::prefix, 256, 256),
      block_case("small fast pattern", make(f16, 1, 70, 130, 2, 2, 64), Block::pattern, 128, 128),
      block_case("small fast band sliding", make(bf16, 1, 97, 130, 2, 1, 128), Block::band, 128, 128),
      block_case("small fast band sliding d64", make(f16, 1, 130, 97, 2, 2, 64), Block::band, 128, 128),
  };
  MaskCase c = block_case("small pattern + bias deterministic", make(f16, 1, 97, 80, 2, 2, 64), Block::pattern, 32, 16);
  c.dense = Dense::bias, c.bias_dtype = f32, c.mask_shape = {1, 1, -1, -1}, c.dbias = true, c.deterministic = true;
  c.masked_rows = true;
  cases.push_back(c);
  cases[3].band_right = -1;
  cases[7].band_left = 30, cases[7].band_right = 5;
  cases[8].band_left = 20, cases[8].band_right = 0, cases[8].band_diagonal = -33;
  return cases;
}

// Dense boolean masks for FLASHATTN_DENSE_MASK=blocks (the device conversion into the
// block form, src/core/dense_mask_blocks.hpp): whole empty and full blocks, rows that see
// nothing, tails, broadcast batch/head/rows, causal and window, GQA, d256 (Hopper key
// tiles of 80: 16-row mask blocks), dropout, deterministic; plus every dense boolean
// case of full_cases (random elements: partial tiles on the bits' fast pass).
MaskCase structured(MaskCase c) { return c.block_structure = true, c; }
std::vector<MaskCase> dense_blocks_cases() {
  const DType f16 = DType::float16, bf16 = DType::bfloat16;
  const std::vector<std::int64_t> all{-1, -1, -1, -1};
  MaskCase rows = structured(dense_case("blocks [B,H,Sq,Sk] tails GQA", make(f16, 2, 300, 333, 4, 2, 64), Dense::boolean, all));
  MaskCase deterministic =
      structured(dense_case("blocks deterministic GQA", make(bf16, 2, 260, 230, 4, 2, 128), Dense::boolean, all));
  deterministic.deterministic = true;
  MaskCase deterministic_hopper_wide =
      structured(dense_case("blocks deterministic d256", causal(make(f16, 1, 270, 300, 2, 2, 256)), Dense::boolean, {1, 1, -1, -1}));
  deterministic_hopper_wide.deterministic = true;
  std::vector<MaskCase> cases = {
      with_masked_rows(rows),
      structured(dense_case("blocks [1,1,Sq,Sk] causal", causal(make(bf16, 2, 257, 300, 2, 1, 128)), Dense::boolean, {1, 1, -1, -1})),
      structured(dense_case("blocks [B,1,Sq,Sk] d256", make(bf16, 1, 290, 270, 2, 2, 256), Dense::boolean, {-1, 1, -1, -1})),
      structured(dense_case("blocks [1,H,1,Sk]", make(f16, 2, 200, 390, 2, 2, 128), Dense::boolean, {1, -1, 1, -1})),
      structured(dense_case("blocks window softcap", softcap(window(make(f16, 1, 300, 280, 2, 2, 64), 90, 10), 3.0),
                            Dense::boolean, all)),
      structured(dense_case("blocks dropout", dropout(make(f16, 1, 200, 230, 2, 2, 64), 0.2), Dense::boolean, {1, -1, -1, -1})),
      structured(dense_case("blocks seqlen_k < seqlen_q causal", causal(make(bf16, 1, 390, 140, 2, 1, 128)), Dense::boolean, all)),
      deterministic,
      deterministic_hopper_wide,
  };
  for (const MaskCase& c : full_cases())
    if (c.dense == Dense::boolean && c.block == Block::none) cases.push_back(c);
  return cases;
}
// Tiny dense boolean cases for compute-sanitizer on the conversion kernel and the lists.
std::vector<MaskCase> small_dense_blocks_cases() {
  const DType f16 = DType::float16, bf16 = DType::bfloat16;
  MaskCase masked = structured(dense_case("small blocks masked rows", make(bf16, 1, 140, 97, 2, 2, 64), Dense::boolean, {-1, -1, -1, -1}));
  return {
      dense_case("small blocks bool", make(f16, 1, 17, 33, 2, 1, 64), Dense::boolean, {-1, -1, -1, -1}),
      structured(dense_case("small blocks [1,1,Sq,Sk] causal", causal(make(f16, 2, 129, 65, 2, 2, 128)), Dense::boolean, {1, 1, -1, -1})),
      structured(dense_case("small blocks d256", make(bf16, 1, 97, 130, 2, 1, 256), Dense::boolean, {1, -1, -1, -1})),
      with_masked_rows(masked),
  };
}


// ---- the tests ------------------------------------------------------------------------

void skip_without_gpu() {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
}
void skip_unless_forward_binary() {
  if (kBackwardOnly) GTEST_SKIP() << "run by test_cuda_masks";
}

void check_forward(const MaskCase& c, Algorithm algorithm) {
  skip_unless_forward_binary();
  if (::testing::Test::IsSkipped()) return;
  if (c.shape.head_dim > cuda::limits().max_head_dim) GTEST_SKIP() << "head_dim not built";
  if (algorithm == Algorithm::flash3 && !runs_flash3(c.shape.head_dim)) GTEST_SKIP() << "flash3 does not run here";
  MaskedRun run(c);
  run.run_forward(algorithm);
  run.expect_forward_matches(c.name + (algorithm == Algorithm::flash3 ? " [flash3]" : " [flash2]"));
  if (c.masked_rows) {
    // Rows that see no key: exactly 0 and -inf, never NaN.
    const AttentionParams p = validate_forward(run.host_forward_args(Algorithm::reference, false));
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads_q; ++h)
        for (std::int64_t i : {std::int64_t{3}, std::int64_t{64}, std::int64_t{127}}) {
          if (i >= p.seqlen_q) continue;
          EXPECT_EQ(run.problem().lse.get(p.lse_offset(b, h) + i * p.lse_row_stride), -std::numeric_limits<float>::infinity())
              << c.name << " row " << i;
          for (std::int64_t d = 0; d < p.head_dim; ++d)
            ASSERT_EQ(run.problem().out.get(p.out_offset(b, h) + i * p.out_row_stride + d), 0.0f) << c.name << " row " << i;
        }
  }
}

void check_backward(const MaskCase& c) {
  if (c.shape.head_dim > cuda::limits().max_head_dim) GTEST_SKIP() << "head_dim not built";
  MaskedRun run(c);
  run.run_forward(Algorithm::flash2);
  run.run_backward();
  run.expect_backward_matches(c.name);
  if (c.masked_rows) {
    const BackwardParams p = validate_backward(run.host_backward_args(false));
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads_q; ++h)
        for (std::int64_t i : {std::int64_t{3}, std::int64_t{64}, std::int64_t{127}}) {
          if (i >= p.seqlen_q) continue;
          for (std::int64_t d = 0; d < p.head_dim; ++d)
            ASSERT_EQ(run.problem().dq.get(p.dq_offset(b, h) + i * p.dq_row_stride + d), 0.0f) << c.name << " row " << i;
        }
  }
  if (c.deterministic) {
    // Bitwise repeatable dq/dk/dv (dBias is summed with atomics: not covered).
    const HostTensor dq = run.problem().dq, dk = run.problem().dk, dv = run.problem().dv;
    for (int repeat = 0; repeat < 3; ++repeat) {
      run.run_backward();
      EXPECT_TRUE(run.problem().dq.bitwise_equal(dq) && run.problem().dk.bitwise_equal(dk) && run.problem().dv.bitwise_equal(dv))
          << c.name << ": deterministic backward differs on repeat " << repeat;
    }
  }
}

class CudaMasks : public ::testing::TestWithParam<MaskCase> {
 protected:
  void SetUp() override { skip_without_gpu(); }
};
TEST_P(CudaMasks, ForwardFlash2) { check_forward(GetParam(), Algorithm::flash2); }
TEST_P(CudaMasks, ForwardFlash3) { check_forward(GetParam(), Algorithm::flash3); }
TEST_P(CudaMasks, Backward) { check_backward(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Cases, CudaMasks, ::testing::ValuesIn(full_cases()));

class CudaMasksSmall : public ::testing::TestWithParam<MaskCase> {
 protected:
  void SetUp() override { skip_without_gpu(); }
};
TEST_P(CudaMasksSmall, ForwardFlash2) { check_forward(GetParam(), Algorithm::flash2); }
TEST_P(CudaMasksSmall, ForwardFlash3) { check_forward(GetParam(), Algorithm::flash3); }
TEST_P(CudaMasksSmall, Backward) { check_backward(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Sanitizer, CudaMasksSmall, ::testing::ValuesIn(small_cases()));

// Equal values element by element (a row that sees no key is 0 on both paths, possibly
// +0 on one and -0 on the other); NaN never equals.
bool same_values(const HostTensor& a, const HostTensor& b) { return a.to_double() == b.to_double(); }

// The dense mask as its block form: out/LSE within the rule of the reference and equal to
// the per-element path's (the same kernel without FLASHATTN_DENSE_MASK).
void check_forward_as_blocks(const MaskCase& c, Algorithm algorithm) {
  skip_unless_forward_binary();
  if (::testing::Test::IsSkipped()) return;
  if (c.shape.head_dim > cuda::limits().max_head_dim) GTEST_SKIP() << "head_dim not built";
  if (algorithm == Algorithm::flash3 && !runs_flash3(c.shape.head_dim)) GTEST_SKIP() << "flash3 does not run here";
  const std::string label = c.name + (algorithm == Algorithm::flash3 ? " [flash3 as blocks]" : " [flash2 as blocks]");
  MaskedRun run(c);
  {
    const DenseMaskMode per_element(nullptr);
    run.run_forward(algorithm);
  }
  const HostTensor out = run.problem().out, lse = run.problem().lse;
  {
    const DenseMaskMode as_blocks("blocks");
    run.run_forward(algorithm);
  }
  run.expect_forward_matches(label);
  EXPECT_TRUE(same_values(run.problem().out, out)) << label << ": out differs from the per-element path";
  EXPECT_TRUE(same_values(run.problem().lse, lse)) << label << ": LSE differs from the per-element path";
}

// The backward of the block form within the rule; deterministic cases also bitwise
// repeatable on the block form (the others sum dQ with atomics in no fixed order). Not
// bitwise equal to the per-element path: a tile the conversion finds full takes the
// kernels' unmasked arithmetic (the d256 kernel's differs from its masked score loop in
// rounding), where the per-element path runs every visited tile as partial.
void check_backward_as_blocks(const MaskCase& c) {
  if (c.shape.head_dim > cuda::limits().max_head_dim) GTEST_SKIP() << "head_dim not built";
  const std::string label = c.name + " [backward as blocks]";
  MaskedRun run(c);
  run.run_forward(Algorithm::flash2);
  {
    const DenseMaskMode per_element(nullptr);
    run.run_backward();
  }
  {
    const DenseMaskMode as_blocks("blocks");
    run.run_backward();
  }
  run.expect_backward_matches(label);
  if (c.deterministic) {
    const HostTensor dq = run.problem().dq, dk = run.problem().dk, dv = run.problem().dv;
    {
      const DenseMaskMode as_blocks("blocks");
      run.run_backward();
    }
    EXPECT_TRUE(same_values(run.problem().dq, dq) && same_values(run.problem().dk, dk) && same_values(run.problem().dv, dv))
        << label << ": deterministic gradients differ between two runs of the block form";
  }
}

class CudaMasksDenseBlocks : public ::testing::TestWithParam<MaskCase> {
 protected:
  void SetUp() override { skip_without_gpu(); }
};
TEST_P(CudaMasksDenseBlocks, ForwardFlash2) { check_forward_as_blocks(GetParam(), Algorithm::flash2); }
TEST_P(CudaMasksDenseBlocks, ForwardFlash3) { check_forward_as_blocks(GetParam(), Algorithm::flash3); }
TEST_P(CudaMasksDenseBlocks, Backward) { check_backward_as_blocks(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Cases, CudaMasksDenseBlocks, ::testing::ValuesIn(dense_blocks_cases()));

class CudaMasksDenseBlocksSmall : public ::testing::TestWithParam<MaskCase> {
 protected:
  void SetUp() override { skip_without_gpu(); }
};
TEST_P(CudaMasksDenseBlocksSmall, ForwardFlash2) { check_forward_as_blocks(GetParam(), Algorithm::flash2); }
TEST_P(CudaMasksDenseBlocksSmall, ForwardFlash3) { check_forward_as_blocks(GetParam(), Algorithm::flash3); }
TEST_P(CudaMasksDenseBlocksSmall, Backward) { check_backward_as_blocks(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Sanitizer, CudaMasksDenseBlocksSmall, ::testing::ValuesIn(small_dense_blocks_cases()));

// ---- the tables (src/cuda/masks) against the rule they implement ----------------------

// Downloads an int32 device array.
std::vector<std::int32_t> download_int32(const std::int32_t* device, std::int64_t count) {
  std::vector<std::int32_t> host(static_cast<std::size_t>(count));
  if (count > 0) cuda_or_throw(cudaMemcpy(host.data(), device, host.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost), "download");
  return host;
}

// For each (b, h, outer tile) of `lists`: the inner tiles in descending order that the
// interval rule and the block kinds (from the dense truth of the pattern's blocks) say a
// kernel visits, and which of them are partial (see mask_tables.hpp).
void expect_lists_follow_rule(const TileLists& lists, const AttentionParams& p, bool is_outer_query, int query_tile,
                              int key_tile, const std::vector<std::int32_t>& host_codes, const DeviceMask& mask,
                              const std::string& label) {
  const std::int64_t list_batches = mask.code_batch_stride ? p.batch : 1;
  const std::int64_t list_heads = mask.code_head_stride ? p.heads_q : 1;
  const std::vector<std::int32_t> counts = download_int32(lists.counts, list_batches * list_heads * lists.outer_tiles);
  const std::vector<std::int32_t> entries =
      download_int32(lists.entries, list_batches * list_heads * lists.outer_tiles * lists.capacity);
  const MaskRule rule = p.mask_of(0);
  const BlockMaskView& view = p.block_mask;
  for (std::int64_t b = 0; b < list_batches; ++b)
    for (std::int64_t h = 0; h < list_heads; ++h)
      for (std::int64_t outer = 0; outer < lists.outer_tiles; ++outer) {
        std::vector<std::int32_t> expected;
        for (std::int64_t inner = lists.inner_tiles - 1; inner >= 0; --inner) {
          const std::int64_t mt = is_outer_query ? outer : inner, nt = is_outer_query ? inner : outer;
          const std::int64_t r0 = mt * query_tile, c0 = nt * key_tile;
          const std::int64_t r1 = std::min(r0 + query_tile, p.seqlen_q), c1 = std::min(c0 + key_tile, p.seqlen_k);
          const TileKind kind = rule.tile_kind(r0, r1, c0, c1);
          if (kind == TileKind::empty) continue;
          bool is_partial = kind == TileKind::partial || r0 + query_tile > p.seqlen_q || c0 + key_tile > p.seqlen_k || p.has_attn_mask();
          if (p.has_block_mask()) {
            bool any = false, all_full = true;
            for (std::int64_t qb = r0 / view.block_m; qb <= (r1 - 1) / view.block_m; ++qb)
              for (std::int64_t kb = c0 / view.block_n; kb <= (c1 - 1) / view.block_n; ++kb) {
                const std::int32_t code = host_codes[static_cast<std::size_t>(b * mask.code_batch_stride + h * mask.code_head_stride +
                                                                              qb * view.kv_blocks + kb)];
                any = any || code != DeviceMask::kEmptyBlock;
                all_full = all_full && code == DeviceMask::kFullBlock;
              }
            if (!any) continue;
            is_partial = is_partial || !all_full;
          }
          expected.push_back(static_cast<std::int32_t>(inner << 1 | (is_partial ? 1 : 0)));
        }
        const std::int64_t list = lists.list(b, h, outer);
        ASSERT_EQ(counts[static_cast<std::size_t>(list)], static_cast<std::int32_t>(expected.size()))
            << label << " list (" << b << ", " << h << ", " << outer << ")";
        for (std::size_t i = 0; i < expected.size(); ++i)
          ASSERT_EQ(entries[static_cast<std::size_t>(list * lists.capacity) + i], expected[i])
              << label << " list (" << b << ", " << h << ", " << outer << ") entry " << i;
      }
}

void check_tables(const MaskCase& c, int query_tile, int key_tile) {
  skip_unless_forward_binary();
  if (::testing::Test::IsSkipped()) return;
  const std::string label = c.name + " tiles " + std::to_string(query_tile) + "x" + std::to_string(key_tile);
  MaskedRun run(c);
  const BackwardParams params = validate_backward(run.device_backward_args());
  const DenseMaskMode per_element(nullptr);  // a dense mask's tables as it is (the block form: check_dense_blocks_tables)
  const cuda::masks::MaskTables tables =
      cuda::masks::prepare(params, cuda::masks::KernelTiles{query_tile, key_tile, true, true}, nullptr);
  cuda_or_throw(cudaDeviceSynchronize(), "mask tables");
  const DeviceMask& mask = tables.view();
  ASSERT_TRUE(mask.present()) << label;
  ASSERT_TRUE(mask.by_query_tile.present() && mask.by_key_tile.present()) << label;
  std::vector<std::int32_t> codes;
  if (params.has_block_mask()) {
    const BlockMaskView& view = params.block_mask;
    const std::int64_t code_batches = mask.code_batch_stride ? params.batch : 1;
    const std::int64_t code_heads = mask.code_head_stride ? params.heads_q : 1;
    // A broadcast list dimension gives one set of codes (and lists) for all.
    EXPECT_EQ(code_batches, run.list_batches()) << label;
    EXPECT_EQ(code_heads, run.list_heads()) << label;
    codes = download_int32(mask.maybe_block_codes, code_batches * code_heads * view.q_blocks * view.kv_blocks);
    // Each code is the block's kind in the dense truth (a partial block: its id, >= 0).
    for (std::int64_t b = 0; b < code_batches; ++b)
      for (std::int64_t h = 0; h < code_heads; ++h)
        for (std::int64_t m = 0; m < view.q_blocks; ++m)
          for (std::int64_t n = 0; n < view.kv_blocks; ++n) {
            const std::int32_t code =
                codes[static_cast<std::size_t>(b * mask.code_batch_stride + h * mask.code_head_stride + m * view.kv_blocks + n)];
            const TileKind kind = run.block_kind(b, h, m, n);
            const bool agrees = kind == TileKind::empty ? code == DeviceMask::kEmptyBlock
                                : kind == TileKind::full ? code == DeviceMask::kFullBlock
                                                         : code >= 0;
            ASSERT_TRUE(agrees) << label << " block (" << b << ", " << h << ", " << m << ", " << n << "): code " << code;
          }
  }
  expect_lists_follow_rule(mask.by_query_tile, params, true, query_tile, key_tile, codes, mask, label + " by query tile");
  expect_lists_follow_rule(mask.by_key_tile, params, false, query_tile, key_tile, codes, mask, label + " by key tile");
  if (c.dbias) {
    ASSERT_NE(mask.maybe_dbias_sum, nullptr) << label;
    std::vector<float> sum(static_cast<std::size_t>(run.dbias().numel()));
    cuda_or_throw(cudaMemcpy(sum.data(), mask.maybe_dbias_sum, sum.size() * sizeof(float), cudaMemcpyDeviceToHost), "download");
    EXPECT_TRUE(std::all_of(sum.begin(), sum.end(), [](float x) { return x == 0.0f; })) << label << ": accumulator not zeroed";
  } else {
    EXPECT_EQ(mask.maybe_dbias_sum, nullptr) << label;
  }
}

TEST(CudaMasksTables, ListsFollowTheRule) {
  skip_without_gpu();
  if (::testing::Test::IsSkipped()) return;
  for (const MaskCase& c : full_cases())
    for (const auto& [query_tile, key_tile] : {std::pair{128, 64}, std::pair{64, 128}, std::pair{128, 32}, std::pair{16, 256}})
      check_tables(c, query_tile, key_tile);
}

TEST(CudaMasksTablesSmall, ListsFollowTheRule) {
  skip_without_gpu();
  if (::testing::Test::IsSkipped()) return;
  for (const MaskCase& c : small_cases()) check_tables(c, 64, 64);
}

// Downloads a uint32 device array.
std::vector<std::uint32_t> download_words(const std::uint32_t* device, std::int64_t count) {
  std::vector<std::uint32_t> host(static_cast<std::size_t>(count));
  if (count > 0) cuda_or_throw(cudaMemcpy(host.data(), device, host.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost), "download");
  return host;
}

// The device conversion of a dense boolean mask (FLASHATTN_DENSE_MASK=blocks) equals the
// host one (src/core/dense_mask_blocks.cpp, itself checked element by element in
// tests/core): mask blocks of the kernel's tiles, codes and bits bitwise, broadcast
// dimensions kept; bind() gives the kernels the block form and no attn_mask; the lists
// follow the rule of the converted block mask; the bits by key are the transpose.
void check_dense_blocks_tables(const MaskCase& c, int query_tile, int key_tile) {
  skip_unless_forward_binary();
  if (::testing::Test::IsSkipped()) return;
  const std::string label = c.name + " as blocks, tiles " + std::to_string(query_tile) + "x" + std::to_string(key_tile);
  MaskedRun run(c);
  const BackwardParams params = validate_backward(run.device_backward_args());
  const DenseMaskMode as_blocks("blocks");
  const cuda::masks::MaskTables tables =
      cuda::masks::prepare(params, cuda::masks::KernelTiles{query_tile, key_tile, true, true}, nullptr);
  cuda_or_throw(cudaDeviceSynchronize(), "mask tables");
  if (!is_dense_mask_convertible(params)) {  // broadcast along rows or columns: read per element
    EXPECT_FALSE(tables.has_dense_mask_blocks()) << label;
    return;
  }
  ASSERT_TRUE(tables.has_dense_mask_blocks()) << label;
  BackwardParams bound = params;
  tables.bind(bound);
  EXPECT_FALSE(bound.has_attn_mask()) << label;
  ASSERT_TRUE(bound.has_block_mask()) << label;
  const BlockMaskView& view = bound.block_mask;
  EXPECT_EQ(view.block_m, dense_mask_block_for_tile(query_tile)) << label;
  EXPECT_EQ(view.block_n, dense_mask_block_for_tile(key_tile)) << label;

  const BackwardParams host_params = validate_backward(run.host_backward_args(false));
  DenseBlockMask host;
  build_dense_block_mask(host_params, view.block_m, view.block_n, host);
  const DenseMaskGrid& grid = host.grid;
  const DeviceMask& mask = tables.view();
  const std::int64_t set_blocks = grid.q_blocks * grid.kv_blocks;
  EXPECT_EQ(mask.code_batch_stride, grid.batches > 1 ? grid.heads * set_blocks : 0) << label << ": batch broadcast";
  EXPECT_EQ(mask.code_head_stride, grid.heads > 1 ? set_blocks : 0) << label << ": head broadcast";
  EXPECT_EQ(view.rule.partial_block_count, grid.block_count()) << label;
  const std::vector<std::int32_t> codes = download_int32(mask.maybe_block_codes, grid.block_count());
  EXPECT_TRUE(codes == host.codes) << label << ": device codes differ from the host conversion";
  const std::vector<std::uint32_t> bits = download_words(view.rule.maybe_partial_bits, grid.block_count() * grid.words_per_block());
  EXPECT_TRUE(bits == host.bits) << label << ": device bits differ from the host conversion";
  // The transposed bits (dK/dV kernels): bit (r, c) of block p at word (p block_n + c) words_per_key + r / 32.
  ASSERT_NE(mask.maybe_partial_bits_by_key, nullptr) << label;
  const std::vector<std::uint32_t> by_key =
      download_words(mask.maybe_partial_bits_by_key, grid.block_count() * grid.block_n * mask.words_per_key);
  for (std::int64_t p = 0; p < grid.block_count(); ++p)
    for (std::int64_t r = 0; r < grid.block_m; ++r)
      for (std::int64_t col = 0; col < grid.block_n; ++col) {
        const std::uint32_t bit = (host.bits[static_cast<std::size_t>((p * grid.block_m + r) * grid.words_per_row + col / 32)] >> (col % 32)) & 1u;
        const std::uint32_t transposed = (by_key[static_cast<std::size_t>((p * grid.block_n + col) * mask.words_per_key + r / 32)] >> (r % 32)) & 1u;
        ASSERT_EQ(transposed, bit) << label << " block " << p << " bit (" << r << ", " << col << ")";
      }
  expect_lists_follow_rule(mask.by_query_tile, bound, true, query_tile, key_tile, codes, mask, label + " by query tile");
  expect_lists_follow_rule(mask.by_key_tile, bound, false, query_tile, key_tile, codes, mask, label + " by key tile");
  EXPECT_EQ(mask.maybe_dbias_sum, nullptr) << label;
}

// The kernels' tiles: sm80 forward/backward (64/128), Hopper forward (128 x 128, d256's
// 128 x 80), Hopper backward (d128's 64 x 128, the wide kernel's 64 x 64).
TEST(CudaMasksTables, DenseMaskBlocksEqualTheHostConversion) {
  skip_without_gpu();
  if (::testing::Test::IsSkipped()) return;
  for (const MaskCase& c : dense_blocks_cases())
    for (const auto& [query_tile, key_tile] : {std::pair{128, 128}, std::pair{64, 128}, std::pair{128, 32}, std::pair{128, 80}, std::pair{64, 64}})
      check_dense_blocks_tables(c, query_tile, key_tile);
}

TEST(CudaMasksTablesSmall, DenseMaskBlocksEqualTheHostConversion) {
  skip_without_gpu();
  if (::testing::Test::IsSkipped()) return;
  for (const MaskCase& c : small_dense_blocks_cases()) check_dense_blocks_tables(c, 64, 80);
}

// The conversion off (FLASHATTN_DENSE_MASK=elements): a dense boolean mask is read per element.
TEST(CudaMasksTablesSmall, DenseMaskStaysDenseWhenTheConversionIsOff) {
  skip_without_gpu();
  if (::testing::Test::IsSkipped()) return;
  skip_unless_forward_binary();
  if (::testing::Test::IsSkipped()) return;
  MaskedRun run(small_dense_blocks_cases().front());
  const BackwardParams params = validate_backward(run.device_backward_args());
  const DenseMaskMode unset(nullptr);
  const cuda::masks::MaskTables tables = cuda::masks::prepare(params, cuda::masks::KernelTiles{64, 64, true, false}, nullptr);
  cuda_or_throw(cudaDeviceSynchronize(), "mask tables");
  EXPECT_FALSE(tables.has_dense_mask_blocks());
  BackwardParams bound = params;
  tables.bind(bound);
  EXPECT_TRUE(bound.has_attn_mask());
  EXPECT_FALSE(bound.has_block_mask());
}

// No masks: no tables, no allocation (the interval path of every kernel).
TEST(CudaMasksTablesSmall, NoMasksGiveNoTables) {
  skip_without_gpu();
  if (::testing::Test::IsSkipped()) return;
  skip_unless_forward_binary();
  if (::testing::Test::IsSkipped()) return;
  MaskCase c;
  c.name = "none", c.shape = make(DType::float16, 1, 40, 50, 2, 2, 64);
  MaskedRun run(c);
  const BackwardParams params = validate_backward(run.device_backward_args());
  const cuda::masks::MaskTables tables = cuda::masks::prepare(params, cuda::masks::KernelTiles{64, 64, true, true}, nullptr);
  EXPECT_FALSE(tables.view().present());
}

}  // namespace
}  // namespace flashattn::testing
