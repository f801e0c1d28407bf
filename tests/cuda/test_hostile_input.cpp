// tests/cuda/test_hostile_input.cpp — hostile input through CUDA tensors (issue 18):
// the NaN rule of README.md on the GPU kernels (a NaN query row is NaN with LSE NaN;
// a hidden NaN value in a skipped tile never leaks — inside a partially masked tile it
// may, the documented exception), parameters judged as float32 like on the CPU, and a
// device-resident block_table entry past the page pool never read or written outside
// the cache; neither are device-resident cache_batch_idx, cache_leftpad and cu_seqlens
// out of range (CudaHostileIndices: inputs in exact-size allocations so that
// compute-sanitizer memcheck sees a stray read, outputs between canary bytes that must
// survive). Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "tests/cuda/device_problem.hpp"
#include "tests/support/host_tensor.hpp"

namespace {

using flashattn::Device;
using flashattn::DType;
using flashattn::TensorView;
using flashattn::testing::DeviceBuffer;
using flashattn::testing::HostTensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A host tensor mirrored on device 0 (uploaded now, downloaded on demand).
struct Mirrored {
  HostTensor host;
  DeviceBuffer device;
  explicit Mirrored(HostTensor t)
      : host(std::move(t)), device(static_cast<std::size_t>(host.numel()) * flashattn::dtype_size(host.dtype())) {
    device.upload(host.data());
  }
  TensorView view() {
    TensorView v = host.view();
    v.data = device.data();
    v.device = Device::cuda(0);
    return v;
  }
  void upload() { device.upload(host.data()); }
  HostTensor download() const {
    HostTensor copy = host;
    device.download(copy.data());
    return copy;
  }
};

HostTensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed) {
  HostTensor t(dtype, std::move(shape));
  t.fill_random(seed);
  return t;
}

struct CudaHostile : ::testing::Test {
  void SetUp() override {
    if (!flashattn::cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// q [1, 512, 2, 64], k/v [1, 512, 1, 64] bf16 (GQA 2:1).
struct ForwardProblem {
  static constexpr std::int64_t kRows = 512, kDim = 64;
  Mirrored q{random_tensor(DType::bfloat16, {1, kRows, 2, kDim}, 1)};
  Mirrored k{random_tensor(DType::bfloat16, {1, kRows, 1, kDim}, 2)};
  Mirrored v{random_tensor(DType::bfloat16, {1, kRows, 1, kDim}, 3)};
  Mirrored out{HostTensor(DType::bfloat16, {1, kRows, 2, kDim})};
  Mirrored lse{HostTensor(DType::float32, {1, 2, kRows})};
  flashattn::ForwardArgs args() {
    flashattn::ForwardArgs a;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view(), a.maybe_lse = lse.view();
    return a;
  }
};

TEST_F(CudaHostile, NanQueryRowIsNanWithNanLse) {
  ForwardProblem p;
  for (std::int64_t d = 0; d < ForwardProblem::kDim; ++d) p.q.host.set((5 * 2 + 0) * ForwardProblem::kDim + d, kNaN);
  p.q.upload();
  flashattn::forward(p.args());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor out = p.out.download(), lse = p.lse.download();
  EXPECT_TRUE(std::isnan(lse.get(5)));  // head 0, row 5: never LSE -inf with a finite output
  for (std::int64_t d = 0; d < ForwardProblem::kDim; ++d) EXPECT_TRUE(std::isnan(out.get((5 * 2 + 0) * ForwardProblem::kDim + d)));
  EXPECT_TRUE(std::isfinite(lse.get(6)));
  EXPECT_TRUE(std::isfinite(lse.get(ForwardProblem::kRows + 5)));  // head 1
}

TEST_F(CudaHostile, HiddenNanValueInASkippedTileNeverLeaks) {
  ForwardProblem p;
  p.v.host.set(400 * ForwardProblem::kDim + 3, kNaN);  // causal: rows < 400 never see key 400
  p.v.upload();
  flashattn::ForwardArgs a = p.args();
  a.options.causal = true;
  flashattn::forward(a);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor out = p.out.download();
  // Rows < 256 are in query tiles that skip key 400's tile whatever the tile sizes
  // (<= 256 rows, <= 176 keys); rows nearer the diagonal may meet the documented exception.
  for (std::int64_t e = 0; e < 256 * 2 * ForwardProblem::kDim; ++e) ASSERT_TRUE(std::isfinite(out.get(e))) << "element " << e;
  EXPECT_TRUE(std::isnan(out.get((450 * 2 + 1) * ForwardProblem::kDim + 3)));  // visible: propagates
}

TEST_F(CudaHostile, ParametersAreJudgedAsFloat32) {
  ForwardProblem p;
  const HostTensor before = p.out.download();
  for (double value : {1e-50, 1e39}) {
    flashattn::ForwardArgs a = p.args();
    a.options.softcap = value;
    EXPECT_THROW(flashattn::forward(a), flashattn::Error);
    a.options.softcap = 0.0;
    a.options.softmax_scale = value;
    EXPECT_THROW(flashattn::forward(a), flashattn::Error);
  }
  EXPECT_TRUE(p.out.download().bitwise_equal(before));
  flashattn::ForwardArgs a = p.args();
  a.options.causal = true, a.options.window_left = 8, a.options.window_right = 3;  // window_right becomes 0
  EXPECT_NO_THROW(flashattn::forward(a));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// A paged cache of 4 pages whose device block_table names page 7: the host may check it
// (an Error naming block_table) or the device guard clamps reads and skips the append;
// either way nothing outside k_cache/v_cache is touched and the cache is not corrupted.
TEST_F(CudaHostile, BlockTableEntryPastThePagePool) {
  Mirrored q{random_tensor(DType::bfloat16, {1, 1, 2, 64}, 4)};
  Mirrored k_cache{random_tensor(DType::bfloat16, {4, 16, 1, 64}, 5)};
  Mirrored v_cache{random_tensor(DType::bfloat16, {4, 16, 1, 64}, 6)};
  Mirrored k_new{random_tensor(DType::bfloat16, {1, 1, 1, 64}, 7)};
  Mirrored v_new{random_tensor(DType::bfloat16, {1, 1, 1, 64}, 8)};
  HostTensor table_host(DType::int32, {1, 2}), seqlens_host(DType::int32, {1});
  const std::int32_t table[2] = {0, 7}, seqlens[1] = {20};  // position 20 is on page 1 -> block 7
  std::memcpy(table_host.data(), table, sizeof table);
  std::memcpy(seqlens_host.data(), seqlens, sizeof seqlens);
  Mirrored block_table{table_host}, cache_seqlens{seqlens_host};
  Mirrored out{HostTensor(DType::bfloat16, {1, 1, 2, 64})};
  const HostTensor k_before = k_cache.host, v_before = v_cache.host;
  flashattn::KVCacheArgs a;
  a.q = q.view(), a.k_cache = k_cache.view(), a.v_cache = v_cache.view();
  a.maybe_k_new = k_new.view(), a.maybe_v_new = v_new.view();
  a.maybe_block_table = block_table.view(), a.maybe_cache_seqlens = cache_seqlens.view();
  a.out = out.view();
  a.num_splits = 1;
  try {
    flashattn::forward_with_kvcache(a);
  } catch (const flashattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("flashattn: block_table:"), std::string::npos) << e.what();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(k_cache.download().bitwise_equal(k_before));
  EXPECT_TRUE(v_cache.download().bitwise_equal(v_before));
}

// --- device-resident indices out of range (kvcache_params.hpp, params.hpp): clamped
// reads, skipped writes, never an access outside the tensors.

// A device output between two canary regions: the kernels may write the tensor itself,
// never the bytes around it.
struct Guarded {
  static constexpr std::size_t kGuard = 4096;
  static constexpr unsigned char kCanary = 0xA5;
  HostTensor host;
  DeviceBuffer device;
  explicit Guarded(HostTensor t) : host(std::move(t)), device(bytes() + 2 * kGuard) {
    std::vector<unsigned char> all(bytes() + 2 * kGuard, kCanary);
    std::memcpy(all.data() + kGuard, host.data(), bytes());
    device.upload(all.data());
  }
  std::size_t bytes() const { return static_cast<std::size_t>(host.numel()) * flashattn::dtype_size(host.dtype()); }
  TensorView view() {
    TensorView v = host.view();
    v.data = static_cast<char*>(device.data()) + kGuard;
    v.device = Device::cuda(0);
    return v;
  }
  std::vector<unsigned char> download_all() const {
    std::vector<unsigned char> all(bytes() + 2 * kGuard);
    device.download(all.data());
    return all;
  }
  // Whether the canaries are intact.
  bool guards_intact() const {
    const auto all = download_all();
    for (std::size_t i = 0; i < kGuard; ++i)
      if (all[i] != kCanary || all[kGuard + bytes() + i] != kCanary) return false;
    return true;
  }
  HostTensor download() const {
    HostTensor copy = host;
    const auto all = download_all();
    std::memcpy(copy.data(), all.data() + kGuard, bytes());
    return copy;
  }
};

HostTensor int32_tensor(std::vector<std::int32_t> values) {
  HostTensor t(DType::int32, {static_cast<std::int64_t>(values.size())});
  std::memcpy(t.data(), values.data(), values.size() * sizeof(std::int32_t));
  return t;
}

bool all_finite(const HostTensor& t, std::int64_t begin = 0, std::int64_t end = -1) {
  for (std::int64_t e = begin; e < (end < 0 ? t.numel() : end); ++e)
    if (!std::isfinite(t.get(e))) return false;
  return true;
}

// Runs `call`; a flashattn::Error is accepted only when it names `argument` (the host
// may check a device tensor on an eager call). Returns whether the call ran.
template <class Call>
bool runs_or_names(Call&& call, const std::string& argument) {
  try {
    call();
  } catch (const flashattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("flashattn: " + argument + ":"), std::string::npos) << e.what();
    return false;
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return true;
}

// Contiguous cache [2, 64, 1, 64] bf16, q [2, 1|4, 2, 64], one appended key per sequence.
struct DecodeProblem {
  static constexpr std::int64_t kBatch = 2, kCapacity = 64, kDim = 64;
  std::int64_t seqlen_q;
  Mirrored q;
  Guarded k_cache{random_tensor(DType::bfloat16, {kBatch, kCapacity, 1, kDim}, 22)};
  Guarded v_cache{random_tensor(DType::bfloat16, {kBatch, kCapacity, 1, kDim}, 23)};
  Mirrored k_new{random_tensor(DType::bfloat16, {kBatch, 1, 1, kDim}, 24)};
  Mirrored v_new{random_tensor(DType::bfloat16, {kBatch, 1, 1, kDim}, 25)};
  Guarded out;
  Guarded lse{HostTensor(DType::float32, {kBatch, 2, 1})};
  Mirrored cache_seqlens{int32_tensor({30, 40})};
  DeviceBuffer workspace{std::size_t{1} << 20};  // the split-KV scratch (more than 3 splits of this size need)
  explicit DecodeProblem(std::int64_t seqlen_q_)
      : seqlen_q(seqlen_q_), q{random_tensor(DType::bfloat16, {kBatch, seqlen_q_, 2, kDim}, 21)},
        out{HostTensor(DType::bfloat16, {kBatch, seqlen_q_, 2, kDim})}, lse{HostTensor(DType::float32, {kBatch, 2, seqlen_q_})} {}
  flashattn::KVCacheArgs args(int num_splits, bool append) {
    flashattn::KVCacheArgs a;
    a.q = q.view(), a.k_cache = k_cache.view(), a.v_cache = v_cache.view();
    if (append) a.maybe_k_new = k_new.view(), a.maybe_v_new = v_new.view();
    a.maybe_cache_seqlens = cache_seqlens.view();
    a.out = out.view(), a.maybe_lse = lse.view();
    a.num_splits = num_splits;
    if (num_splits > 1)
      a.maybe_workspace = TensorView::contiguous(workspace.data(), DType::uint8, {std::int64_t{1} << 20}, Device::cuda(0));
    return a;
  }
  void expect_guards_intact() {
    EXPECT_TRUE(k_cache.guards_intact());
    EXPECT_TRUE(v_cache.guards_intact());
    EXPECT_TRUE(out.guards_intact());
    EXPECT_TRUE(lse.guards_intact());
  }
};

struct CudaHostileIndices : CudaHostile {};

// cache_batch_idx {5, -3} for a 2-row cache: reads clamp into the cache (output
// garbage-but-in-range: finite), the append of both sequences is skipped.
TEST_F(CudaHostileIndices, CacheBatchIdxPastTheCache) {
  for (const std::int64_t seqlen_q : {1, 4})
    for (const int num_splits : {1, 3}) {
      DecodeProblem p(seqlen_q);
      const HostTensor k_before = p.k_cache.host, v_before = p.v_cache.host;
      Mirrored batch_idx{int32_tensor({5, -3})};
      flashattn::KVCacheArgs a = p.args(num_splits, true);
      a.maybe_cache_batch_idx = batch_idx.view();
      a.options.causal = true;
      if (!runs_or_names([&] { flashattn::forward_with_kvcache(a); }, "cache_batch_idx")) continue;
      p.expect_guards_intact();
      EXPECT_TRUE(p.k_cache.download().bitwise_equal(k_before)) << "seqlen_q " << seqlen_q << " splits " << num_splits;
      EXPECT_TRUE(p.v_cache.download().bitwise_equal(v_before));
      EXPECT_TRUE(all_finite(p.out.download()));
    }
}

// cache_leftpad {-50, 1000} of a 64-position cache: -50 reads as 0 (the same output as
// leftpad 0), 1000 as the capacity (no key left: output 0, LSE -inf).
TEST_F(CudaHostileIndices, CacheLeftpadOutOfRange) {
  for (const std::int64_t seqlen_q : {1, 4})
    for (const int num_splits : {1, 3}) {
      DecodeProblem clean(seqlen_q);
      Mirrored zero_pad{int32_tensor({0, 0})};
      flashattn::KVCacheArgs a0 = clean.args(num_splits, false);
      a0.maybe_cache_leftpad = zero_pad.view();
      ASSERT_TRUE(runs_or_names([&] { flashattn::forward_with_kvcache(a0); }, "cache_leftpad"));
      const HostTensor clean_out = clean.out.download();

      DecodeProblem p(seqlen_q);
      Mirrored leftpad{int32_tensor({-50, 1000})};
      flashattn::KVCacheArgs a = p.args(num_splits, false);
      a.maybe_cache_leftpad = leftpad.view();
      if (!runs_or_names([&] { flashattn::forward_with_kvcache(a); }, "cache_leftpad")) continue;
      p.expect_guards_intact();
      const HostTensor out = p.out.download();
      const std::int64_t per_sequence = seqlen_q * 2 * DecodeProblem::kDim;
      for (std::int64_t e = 0; e < per_sequence; ++e) ASSERT_EQ(out.get(e), clean_out.get(e)) << "sequence 0, element " << e;
      for (std::int64_t e = per_sequence; e < 2 * per_sequence; ++e) ASSERT_EQ(out.get(e), 0.0f) << "sequence 1, element " << e;
    }
}

// Varlen q/k/v [96, heads, 64] bf16 with device cu_seqlens past the total, negative or
// decreasing: forward (sm80 and, on sm_90, Hopper) and backward run, nothing outside
// out/LSE/dq/dk/dv is written (the lead runs this under compute-sanitizer memcheck for the reads).
TEST_F(CudaHostileIndices, VarlenCuSeqlensOutOfRange) {
  constexpr std::int64_t kTotal = 96, kDim = 64;
  const std::vector<std::vector<std::int32_t>> bad_cu = {{0, 40, 500}, {-100, 40, 96}, {0, 80, 20}, {0, 96, 100000}};
  for (const auto& cu : bad_cu)
    for (const auto algorithm : {flashattn::Algorithm::flash2, flashattn::Algorithm::flash3})
      for (const bool causal : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "cu {" << cu[0] << ", " << cu[1] << ", " << cu[2] << "} algorithm " << flashattn::algorithm_name(algorithm)
                                          << " causal " << causal);
        Mirrored q{random_tensor(DType::bfloat16, {kTotal, 2, kDim}, 31)};
        Mirrored k{random_tensor(DType::bfloat16, {kTotal, 1, kDim}, 32)};
        Mirrored v{random_tensor(DType::bfloat16, {kTotal, 1, kDim}, 33)};
        Mirrored dout{random_tensor(DType::bfloat16, {kTotal, 2, kDim}, 34)};
        Guarded out{HostTensor(DType::bfloat16, {kTotal, 2, kDim})};
        Guarded lse{HostTensor(DType::float32, {2, kTotal})};
        Guarded dq{HostTensor(DType::bfloat16, {kTotal, 2, kDim})};
        Guarded dk{HostTensor(DType::bfloat16, {kTotal, 1, kDim})};
        Guarded dv{HostTensor(DType::bfloat16, {kTotal, 1, kDim})};
        Mirrored cu_q{int32_tensor(cu)}, cu_k{int32_tensor(cu)};
        flashattn::VarlenArgs varlen;
        varlen.cu_seqlens_q = cu_q.view(), varlen.cu_seqlens_k = cu_k.view();
        varlen.max_seqlen_q = kTotal, varlen.max_seqlen_k = kTotal;
        flashattn::ForwardArgs f;
        f.q = q.view(), f.k = k.view(), f.v = v.view(), f.out = out.view(), f.maybe_lse = lse.view();
        f.maybe_varlen = varlen;
        f.options.causal = causal;
        f.options.algorithm = algorithm;
        if (!flashattn::why_unsupported(f).empty()) continue;  // flash3 off sm_90
        if (!runs_or_names([&] { flashattn::forward(f); }, "cu_seqlens_q")) continue;
        EXPECT_TRUE(out.guards_intact());
        EXPECT_TRUE(lse.guards_intact());

        flashattn::BackwardArgs b;
        b.q = q.view(), b.k = k.view(), b.v = v.view(), b.out = out.view(), b.dout = dout.view(), b.lse = lse.view();
        b.dq = dq.view(), b.dk = dk.view(), b.dv = dv.view();
        b.maybe_varlen = varlen;
        b.options = f.options;
        const std::size_t workspace_bytes = flashattn::backward_workspace_bytes(b);
        DeviceBuffer workspace(workspace_bytes < 1 ? 1 : workspace_bytes);
        b.maybe_workspace = TensorView::contiguous(workspace.data(), DType::uint8,
                                                   {static_cast<std::int64_t>(workspace_bytes < 1 ? 1 : workspace_bytes)}, Device::cuda(0));
        if (!runs_or_names([&] { flashattn::backward(b); }, "cu_seqlens_q")) continue;
        EXPECT_TRUE(dq.guards_intact());
        EXPECT_TRUE(dk.guards_intact());
        EXPECT_TRUE(dv.guards_intact());
      }
}

}  // namespace
