// forward_with_kvcache on the GPU (split-KV decode kernel, append + rotary, combine):
// the host problems of tests/cpu/kvcache_problem.hpp mirrored to device memory,
// checked against the float64 reference of the gathered cache, the exact-append
// rule, and the CPU path. Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "flashattn/error.hpp"
#include "flashattn/kvcache.hpp"
#include "src/cuda/decode/tma_config.hpp"
#include "tests/cpu/kvcache_problem.hpp"
#include "tests/cuda/device_problem.hpp"

namespace flashattn::testing {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

// Device mirrors of every host buffer of a DecodeProblem, byte for byte.
class DeviceDecode {
 public:
  explicit DeviceDecode(DecodeProblem& p) : p_(p) {
    for (HostTensor* t : {&p.q, &p.k_cache, &p.v_cache, &p.k_new, &p.v_new, &p.cache_seqlens, &p.cache_batch_idx, &p.cache_leftpad,
                          &p.block_table, &p.rotary_cos, &p.rotary_sin, &p.alibi_slopes, &p.out, &p.lse}) {
      if (t->numel() == 0 && t->shape().empty()) continue;  // never allocated
      DeviceBuffer buffer(host_bytes(*t));
      buffer.upload(t->data());
      mirrors_.emplace(t->data(), std::move(buffer));
    }
  }

  // The host arguments with every tensor moved onto the device mirror.
  KVCacheArgs args(const KVCacheArgs& host) {
    KVCacheArgs a = host;
    for (TensorView* t : {&a.q, &a.k_cache, &a.v_cache, &a.maybe_k_new, &a.maybe_v_new, &a.maybe_cache_seqlens, &a.maybe_cache_batch_idx,
                          &a.maybe_cache_leftpad, &a.maybe_block_table, &a.maybe_rotary_cos, &a.maybe_rotary_sin,
                          &a.options.maybe_alibi_slopes, &a.out, &a.maybe_lse}) {
      if (!t->defined()) continue;
      auto it = mirrors_.find(t->data);
      if (it == mirrors_.end()) throw std::runtime_error("tensor without a device mirror");
      t->data = it->second.data();
      t->device = Device::cuda(0);
    }
    return a;
  }

  // Runs on the GPU (allocating the split workspace the call asks for), then copies
  // out, LSE and both caches back into the host problem.
  void run(const KVCacheArgs& host_args) {
    KVCacheArgs a = args(host_args);
    const std::size_t bytes = kvcache_workspace_bytes(a);
    DeviceBuffer workspace(bytes ? bytes : 16);
    if (bytes) a.maybe_workspace = TensorView::contiguous(workspace.data(), DType::uint8, {static_cast<std::int64_t>(bytes)}, Device::cuda(0));
    forward_with_kvcache(a);
    cuda_or_throw(cudaGetLastError(), "launch");
    cuda_or_throw(cudaDeviceSynchronize(), "forward_with_kvcache");
    download();
  }
  void download() {
    for (HostTensor* t : {&p_.out, &p_.lse, &p_.k_cache, &p_.v_cache}) mirrors_.at(t->data()).download(t->data());
  }

 private:
  DecodeProblem& p_;
  std::map<void*, DeviceBuffer> mirrors_;
};

// true if the case ran; false (and a note) if this build has no kernel for its head dim.
bool run_on_gpu(DecodeProblem& p) {
  p.snapshot();
  DeviceDecode device(p);
  try {
    device.run(p.args());
  } catch (const NotSupported& e) {
    if (std::string(e.what()).find("head_dim") == std::string::npos) throw;
    return false;
  }
  return true;
}

void run_and_check(DecodeProblem& p, const std::string& label) {
  if (!run_on_gpu(p)) {
    GTEST_SKIP() << label << ": head dim not built";
  }
  expect_matches_reference(p, label);
  if (p.shape().seqlen_new > 0) expect_append_exact(p, label);
}

class KVCacheCuda : public ::testing::TestWithParam<DecodeShape> {};

TEST_P(KVCacheCuda, MatchesReferenceAndAppendsExactly) {
  SKIP_WITHOUT_GPU();
  DecodeProblem p(GetParam(), 3);
  run_and_check(p, GetParam().describe());
}

std::vector<DecodeShape> shapes() {
  std::vector<DecodeShape> v;
  for (DType dtype : {DType::float16, DType::bfloat16})
    for (std::int64_t head_dim : {64, 96, 128, 256})
      for (std::int64_t page : {0, 16, 48, 256}) {
        DecodeShape s;
        s.dtype = dtype, s.head_dim = head_dim, s.page_size = page, s.capacity = 300, s.heads_q = 8, s.heads_kv = 2, s.num_splits = 0;
        v.push_back(s);  // plain decode, GQA 4 (4 rows per CTA), heuristic splits
        s.seqlen_new = 3, s.seqlen_q = 3, s.causal = true, s.rotary_dim = head_dim / 2, s.num_splits = 3;
        v.push_back(s);  // speculative decode: 12 packed rows (8-row CTAs, 2 query blocks), append + rotary
        s.rotary_interleaved = false, s.rotary_dim = head_dim;
        v.push_back(s);
      }
  DecodeShape mqa;  // 16 query heads on one kv head, window + softcap, many splits
  mqa.heads_q = 16, mqa.heads_kv = 1, mqa.seqlen_q = 2, mqa.capacity = 1025, mqa.window_left = 100, mqa.window_right = 0,
  mqa.softcap = 30.0, mqa.num_splits = 7, mqa.head_dim = 128, mqa.page_size = 32, mqa.dtype = DType::bfloat16;
  v.push_back(mqa);
  DecodeShape prefill;  // chunked prefill: 40 query rows, 40 new keys
  prefill.seqlen_q = 40, prefill.seqlen_new = 40, prefill.cache_seqlens = {0, 60, 200}, prefill.batch = 3, prefill.capacity = 256,
  prefill.causal = true, prefill.head_dim = 128, prefill.num_splits = 2;
  v.push_back(prefill);
  DecodeShape leftpad;
  leftpad.batch = 3, leftpad.cache_seqlens = {40, 7, 90}, leftpad.leftpad = {5, 7, 0}, leftpad.seqlen_new = 2, leftpad.seqlen_q = 4,
  leftpad.causal = true, leftpad.rotary_dim = 32, leftpad.head_dim = 64, leftpad.num_splits = 2;
  v.push_back(leftpad);
  DecodeShape batch_idx;
  batch_idx.permute_batch = true, batch_idx.batch = 3, batch_idx.seqlen_new = 1, batch_idx.head_dim = 128, batch_idx.rotary_dim = 64,
  batch_idx.rotary_interleaved = false;
  v.push_back(batch_idx);
  DecodeShape uniform;
  uniform.uniform_seqlen = true, uniform.cache_seqlens = {97, 97}, uniform.seqlen_new = 1, uniform.head_dim = 128, uniform.num_splits = 0;
  v.push_back(uniform);
  // Paged with left padding: the key range starts mid-page, so the kernel's page lookup
  // (one division per tile, then advancing row by row) crosses pages at odd offsets;
  // every kernel head dim (16, 8 and 4 key rows per copy pass), several tiles per split.
  for (std::int64_t head_dim : {64, 128, 256})
    for (std::int64_t page : {16, 48}) {
      DecodeShape paged_leftpad;
      paged_leftpad.batch = 3, paged_leftpad.capacity = 300, paged_leftpad.page_size = page, paged_leftpad.head_dim = head_dim;
      paged_leftpad.cache_seqlens = {200, 7, 290}, paged_leftpad.leftpad = {5, 7, 33}, paged_leftpad.seqlen_new = 2;
      paged_leftpad.num_splits = page == 16 ? 2 : 3, paged_leftpad.dtype = DType::bfloat16;
      v.push_back(paged_leftpad);
    }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Shapes, KVCacheCuda, ::testing::ValuesIn(shapes()));

TEST(KVCacheCudaProperties, EverySplitCountAgrees) {
  SKIP_WITHOUT_GPU();
  DecodeShape s;
  s.dtype = DType::bfloat16, s.head_dim = 128, s.heads_q = 8, s.heads_kv = 2, s.capacity = 2000, s.cache_seqlens = {1999, 700},
  s.page_size = 16, s.seqlen_new = 1;
  for (int splits = 1; splits <= 64; ++splits) {
    s.num_splits = splits;
    DecodeProblem p(s, 4);
    run_and_check(p, "splits " + std::to_string(splits));
  }
}

TEST(KVCacheCudaProperties, AgreesWithTheCpuPath) {
  SKIP_WITHOUT_GPU();
  DecodeShape s;
  s.dtype = DType::float16, s.head_dim = 128, s.heads_q = 32, s.heads_kv = 8, s.capacity = 4096, s.page_size = 256, s.seqlen_new = 1,
  s.rotary_dim = 128, s.num_splits = 0, s.batch = 2;
  DecodeProblem gpu(s, 8), cpu(s, 8);
  if (!run_on_gpu(gpu)) GTEST_SKIP() << "head dim not built";
  cpu.snapshot();
  forward_with_kvcache(cpu.args());
  std::vector<double> gpu_out, gpu_lse, cpu_out, cpu_lse;
  gather(gpu, gpu_out, gpu_lse);
  gather(cpu, cpu_out, cpu_lse);
  EXPECT_LE(max_abs_diff(gpu_out, cpu_out), 2e-3);  // fp16 outputs of O(0.1): a couple of roundings apart
  EXPECT_LE(max_abs_diff(gpu_lse, cpu_lse), 1e-4);
  expect_matches_reference(gpu, "gpu vs reference");
}

TEST(KVCacheCudaProperties, ZeroLengthCachesAndFullCapacity) {
  SKIP_WITHOUT_GPU();
  DecodeShape s;
  s.head_dim = 128, s.cache_seqlens = {0, 0}, s.num_splits = 4;
  DecodeProblem empty(s);
  if (!run_on_gpu(empty)) GTEST_SKIP() << "head dim not built";
  for (std::int64_t i = 0; i < empty.out.numel(); ++i) ASSERT_EQ(empty.out.get(i), 0.0f);
  for (std::int64_t i = 0; i < empty.lse.numel(); ++i) ASSERT_EQ(empty.lse.get(i), -INFINITY);
  s.cache_seqlens = {98, 0}, s.capacity = 100, s.seqlen_new = 2, s.page_size = 0;
  DecodeProblem full(s);
  run_and_check(full, "exactly full after the append");
}

TEST(KVCacheCudaValidation, OnePastCapacityAndMissingWorkspaceAreRejected) {
  SKIP_WITHOUT_GPU();
  DecodeShape s;
  s.head_dim = 128, s.capacity = 64, s.page_size = 16, s.seqlen_new = 2, s.uniform_seqlen = true, s.cache_seqlens = {62, 62};
  DecodeProblem p(s);
  p.snapshot();
  const HostTensor out_before = p.out, lse_before = p.lse;
  DeviceDecode device(p);
  KVCacheArgs args = device.args(p.args());
  args.maybe_uniform_cache_seqlen = 63;  // host-visible: checked before any launch
  try {
    forward_with_kvcache(args);
    ADD_FAILURE() << "one past capacity accepted";
  } catch (const Error& e) {
    // A paged cache names its page table (flash_attn's rule: the capacity is block_table's).
    EXPECT_NE(std::string(e.what()).find("block_table"), std::string::npos) << e.what();
  }
  args = device.args(p.args());
  args.num_splits = 4;
  try {
    forward_with_kvcache(args);
    ADD_FAILURE() << "4 splits without a workspace accepted";
  } catch (const NotSupported& e) {
    GTEST_SKIP() << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
  }
  device.download();
  EXPECT_TRUE(p.k_cache.bitwise_equal(p.k_cache_initial));
  EXPECT_TRUE(p.v_cache.bitwise_equal(p.v_cache_initial));
  EXPECT_TRUE(p.out.bitwise_equal(out_before));
  EXPECT_TRUE(p.lse.bitwise_equal(lse_before));
}

// Both split-KV kernels forced on every shape (the default is the TMA kernel on Hopper,
// the cp.async kernel elsewhere; the Shapes suite above runs the default): the library
// reads FLASHATTN_DECODE_KERNEL at every call, and a forced "tma" also runs its
// pre-wait L2 prefetch, which the default leaves off. On a GPU without sm_90 (and with
// cache_batch_idx) the TMA choice falls back to the cp.async kernel (the same checks
// then run twice). The TMA kernel's own edges are in the shapes: pages of 16/48 (boxes
// of 16 keys, several pages per 64-key tile), ranges starting mid-page (left padding,
// windows: the tile grid starts below the range, V rows before it zeroed), partial last
// tiles (V rows past the range zeroed, rows past the cache zero-filled), head dims below
// the kernel's (96 on 128: columns zero-filled), 2-7 splits with and without the
// in-cluster merge, and below, more tiles than ring stages.
class ForcedDecodeKernel {
 public:
  explicit ForcedDecodeKernel(const std::string& name) { setenv("FLASHATTN_DECODE_KERNEL", name.c_str(), 1); }
  ~ForcedDecodeKernel() { unsetenv("FLASHATTN_DECODE_KERNEL"); }
  ForcedDecodeKernel(const ForcedDecodeKernel&) = delete;
  ForcedDecodeKernel& operator=(const ForcedDecodeKernel&) = delete;
};

class KVCacheCudaKernel : public ::testing::TestWithParam<std::tuple<std::string, DecodeShape>> {};

TEST_P(KVCacheCudaKernel, MatchesReferenceAndAppendsExactly) {
  SKIP_WITHOUT_GPU();
  const auto& [kernel, shape] = GetParam();
  const ForcedDecodeKernel forced(kernel);
  DecodeProblem p(shape, 5);
  run_and_check(p, kernel + " " + shape.describe());
}
INSTANTIATE_TEST_SUITE_P(BothKernels, KVCacheCudaKernel,
                         ::testing::Combine(::testing::Values(std::string("cp_async"), std::string("tma")), ::testing::ValuesIn(shapes())));

TEST(KVCacheCudaKernels, LongRangesWrapTheRingAtEverySplitCount) {
  SKIP_WITHOUT_GPU();
  // 4000 keys: 63 tiles at one split (21 turns of a 3-stage ring), paged 16 and 48 (the
  // producer's page look-ahead), contiguous with left padding; splits 1-5.
  for (const std::string kernel : {"cp_async", "tma"}) {
    const ForcedDecodeKernel forced(kernel);
    for (std::int64_t page : {0, 16, 48})
      for (int splits = 1; splits <= 5; ++splits) {
        DecodeShape s;
        s.dtype = DType::bfloat16, s.head_dim = 128, s.heads_q = 8, s.heads_kv = 2, s.capacity = 4032, s.cache_seqlens = {4000, 1000},
        s.page_size = page, s.seqlen_new = 1, s.num_splits = splits;
        if (page == 0) s.leftpad = {3, 900};
        DecodeProblem p(s, 6);
        run_and_check(p, kernel + " page " + std::to_string(page) + " splits " + std::to_string(splits));
      }
  }
}

TEST(KVCacheCudaKernels, ZeroLengthCachesOnBothKernels) {
  SKIP_WITHOUT_GPU();
  for (const std::string kernel : {"cp_async", "tma"}) {
    const ForcedDecodeKernel forced(kernel);
    for (int splits : {1, 2, 4}) {
      DecodeShape s;
      s.head_dim = 128, s.cache_seqlens = {0, 0}, s.num_splits = splits, s.page_size = splits == 2 ? 16 : 0;
      DecodeProblem empty(s);
      if (!run_on_gpu(empty)) GTEST_SKIP() << "head dim not built";
      for (std::int64_t i = 0; i < empty.out.numel(); ++i) ASSERT_EQ(empty.out.get(i), 0.0f) << kernel << " splits " << splits;
      for (std::int64_t i = 0; i < empty.lse.numel(); ++i) ASSERT_EQ(empty.lse.get(i), -INFINITY) << kernel << " splits " << splits;
    }
  }
}

TEST(KVCacheCudaKernels, UnknownKernelNameIsRejected) {
  SKIP_WITHOUT_GPU();
  const ForcedDecodeKernel forced("bulk");
  DecodeShape s;
  s.head_dim = 128;
  DecodeProblem p(s);
  p.snapshot();
  DeviceDecode device(p);
  EXPECT_THROW(forward_with_kvcache(device.args(p.args())), Error);
}

// ALiBi (flashattn/score.hpp: s = scale q.k - slope |i + seqlen_k - seqlen_q - j|, the
// distance from the row's position i within the query block to the key's position j
// within the sequence's keys, seqlen_k = cache_seqlens[b] (+ new keys) - leftpad[b]) on
// both split-KV kernels, against the float64 reference of the gathered cache. Each shape
// with slopes per query head (head 1: slope 0, so a GQA group packs biased and unbiased
// rows into one CTA) and per (sequence, query head): a slope given to the wrong row of a
// packed GQA group, a diagonal taken from the capacity instead of the sequence's length,
// or a distance counted from the split's or tile's first key shows as the rows listed in
// the failure. Contiguous and paged (pages of 16, 48, 256: boxes below, inside and above
// the tile), GQA 4, MQA 16, MHA, seqlen_q 1 and > 1 (causal or not, with new keys),
// windows, softcap, left padding, head dims 64/96/128/256, 1 to 7 splits and the heuristic.
std::vector<DecodeShape> alibi_shapes() {
  std::vector<DecodeShape> v;
  for (DecodeShape::Alibi alibi : {DecodeShape::Alibi::per_head, DecodeShape::Alibi::per_batch_head}) {
    const DType dtype = alibi == DecodeShape::Alibi::per_head ? DType::float16 : DType::bfloat16;
    for (std::int64_t page : {0, 16, 48, 256}) {
      DecodeShape s;
      s.alibi = alibi, s.dtype = dtype, s.head_dim = 128, s.page_size = page, s.capacity = 300, s.heads_q = 8, s.heads_kv = 2;
      s.num_splits = 0;
      v.push_back(s);  // plain decode, GQA 4, heuristic splits
      s.seqlen_q = 3, s.seqlen_new = 3, s.causal = true, s.rotary_dim = 64, s.num_splits = 3;
      v.push_back(s);  // speculative decode: 12 packed rows, append + rotary
      s.causal = false, s.rotary_dim = 0, s.num_splits = 1;
      v.push_back(s);  // several queries, not causal: every key is biased, before and after the diagonal
    }
    for (std::int64_t head_dim : {64, 96, 256}) {
      DecodeShape s;
      s.alibi = alibi, s.dtype = dtype, s.head_dim = head_dim, s.page_size = head_dim == 64 ? 16 : 0, s.capacity = 400, s.heads_q = 6,
      s.heads_kv = 2, s.seqlen_q = 2, s.seqlen_new = 2, s.causal = true, s.num_splits = 2;
      v.push_back(s);  // GQA 3 (6 packed rows), two splits merged in a cluster
    }
    DecodeShape mqa;  // 16 query heads on one kv head (one CTA per query position), window + softcap, many splits
    mqa.alibi = alibi, mqa.heads_q = 16, mqa.heads_kv = 1, mqa.seqlen_q = 2, mqa.capacity = 1025, mqa.window_left = 100, mqa.window_right = 0,
    mqa.softcap = 30.0, mqa.num_splits = 7, mqa.head_dim = 128, mqa.page_size = 32, mqa.dtype = DType::bfloat16;
    v.push_back(mqa);
    DecodeShape mha;  // one query head per kv head, 5 queries
    mha.alibi = alibi, mha.heads_q = 4, mha.heads_kv = 4, mha.seqlen_q = 5, mha.seqlen_new = 5, mha.causal = true, mha.head_dim = 64,
    mha.capacity = 700, mha.num_splits = 4, mha.dtype = dtype;
    v.push_back(mha);
    DecodeShape prefill;  // chunked prefill: 40 queries x GQA 2 = 5 query blocks of 16 rows, 40 new keys
    prefill.alibi = alibi, prefill.seqlen_q = 40, prefill.seqlen_new = 40, prefill.cache_seqlens = {0, 60, 200}, prefill.batch = 3,
    prefill.capacity = 256, prefill.causal = true, prefill.head_dim = 128, prefill.num_splits = 2, prefill.page_size = 16;
    v.push_back(prefill);
    DecodeShape leftpad;  // the keys start at leftpad[b]: the distance counts from there
    leftpad.alibi = alibi, leftpad.batch = 3, leftpad.cache_seqlens = {40, 7, 290}, leftpad.leftpad = {5, 7, 33}, leftpad.seqlen_new = 2,
    leftpad.seqlen_q = 4, leftpad.causal = true, leftpad.head_dim = 64, leftpad.capacity = 300, leftpad.num_splits = 2;
    v.push_back(leftpad);
    leftpad.page_size = 48, leftpad.num_splits = 3;
    v.push_back(leftpad);
    DecodeShape batch_idx;  // cache_batch_idx (the cp.async kernel either way)
    batch_idx.alibi = alibi, batch_idx.permute_batch = true, batch_idx.batch = 3, batch_idx.seqlen_new = 1, batch_idx.head_dim = 128,
    batch_idx.capacity = 200;
    v.push_back(batch_idx);
  }
  return v;
}

class KVCacheCudaAlibi : public ::testing::TestWithParam<std::tuple<std::string, DecodeShape>> {};

TEST_P(KVCacheCudaAlibi, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto& [kernel, shape] = GetParam();
  const ForcedDecodeKernel forced(kernel);
  DecodeProblem p(shape, 7);
  run_and_check(p, kernel + " " + shape.describe());
}
INSTANTIATE_TEST_SUITE_P(BothKernels, KVCacheCudaAlibi,
                         ::testing::Combine(::testing::Values(std::string("cp_async"), std::string("tma")), ::testing::ValuesIn(alibi_shapes())));

TEST(KVCacheCudaAlibiSplits, EverySplitCountOnBothKernels) {
  SKIP_WITHOUT_GPU();
  // Splits 1-64: each split's range starts at its own key, the distance must not. Paged
  // and contiguous alternate, as do seqlen_q 1 and 2 (causal, with new keys) and the
  // two slope layouts; two sequences of very different lengths.
  for (const std::string kernel : {"cp_async", "tma"}) {
    const ForcedDecodeKernel forced(kernel);
    for (int splits = 1; splits <= 64; ++splits) {
      DecodeShape s;
      s.dtype = DType::bfloat16, s.head_dim = 128, s.heads_q = 8, s.heads_kv = 2, s.capacity = 2000, s.cache_seqlens = {1997, 700};
      s.page_size = splits % 2 == 0 ? 16 : 0, s.num_splits = splits;
      s.seqlen_q = splits % 4 < 2 ? 1 : 2, s.seqlen_new = s.seqlen_q, s.causal = true;
      s.alibi = splits % 3 == 0 ? DecodeShape::Alibi::per_head : DecodeShape::Alibi::per_batch_head;
      DecodeProblem p(s, 8);
      run_and_check(p, kernel + " " + s.describe());
      if (::testing::Test::HasFailure()) return;  // one failing split count says enough
    }
  }
}

// The TMA kernel's tile geometry, host arithmetic only (runs without a GPU).
template <int kHeadDim>
void check_tma_layout() {
  using Config = cuda::decode::TmaDecodeConfig<kHeadDim>;
  // K/V tiles: tile_offset is the TMA's 128-byte swizzle of the tile written as 64-column
  // panels of 128-byte rows (CUTLASS Swizzle<3, 4, 3>: byte bits 4-6 ^= bits 7-9 of the
  // unswizzled offset), a bijection, and ldmatrix-conflict-free (8 consecutive rows at one
  // logical chunk in 8 distinct 16-byte bank groups).
  std::set<int> offsets;
  for (int row = 0; row < Config::kTileN; ++row)
    for (int chunk = 0; chunk < Config::kChunks; ++chunk) {
      const int unswizzled = (chunk / 8) * Config::kPanelBytes + row * 128 + (chunk % 8) * 16;
      const int swizzled = unswizzled ^ (((unswizzled >> 7) & 7) << 4);
      EXPECT_EQ(Config::tile_offset(row, chunk) * 2, swizzled) << "d" << kHeadDim << " row " << row << " chunk " << chunk;
      offsets.insert(Config::tile_offset(row, chunk));
    }
  EXPECT_EQ(static_cast<int>(offsets.size()), Config::kTileN * Config::kChunks);
  EXPECT_EQ(*offsets.rbegin() + 8, Config::kTileBytes / 2);
  for (int row0 = 0; row0 < Config::kTileN; row0 += 8)
    for (int chunk = 0; chunk < Config::kChunks; ++chunk) {
      std::set<int> tile_groups, q_groups;
      for (int r = row0; r < row0 + 8; ++r) {
        tile_groups.insert(Config::tile_offset(r, chunk) / 8 % 8);
        if (row0 < Config::kRows) q_groups.insert(Config::q_offset(r, chunk) / 8 % 8);
      }
      EXPECT_EQ(tile_groups.size(), 8u) << "d" << kHeadDim << " rows " << row0 << " chunk " << chunk;
      if (row0 < Config::kRows) {
        EXPECT_EQ(q_groups.size(), 8u) << "q, d" << kHeadDim << " rows " << row0 << " chunk " << chunk;
      }
    }
  // Shared memory: the ring and q below the barriers, the merge area too; TMA stages on
  // 1024-byte boundaries; two CTAs per SM (228 KB, 1 KB reserved each) for d <= 128.
  EXPECT_LE(Config::kRingBytes + Config::kQBytes, Config::kBarrierOffset);
  EXPECT_LE(Config::kMergeBytes, Config::kBarrierOffset);
  EXPECT_EQ(Config::kStageBytes % 1024, 0);
  EXPECT_EQ(Config::kPanelBytes % 1024, 0);
  EXPECT_LE(Config::kSharedBytes, 227 * 1024);
  if (kHeadDim <= 128) {
    EXPECT_LE(2 * (Config::kSharedBytes + 1024), 228 * 1024);
  }
  // Every box size fills a stage exactly: the bytes the producer's expect_tx announces.
  for (int box_rows : {16, 32, 64}) EXPECT_EQ((Config::kTileN / box_rows) * Config::kPanels * 2 * box_rows * 128, Config::kStageBytes);
}

TEST(KVCacheTmaLayout, SwizzleBanksAndSharedMemoryAtEveryKernelHeadDim) {
  check_tma_layout<64>();
  check_tma_layout<128>();
  check_tma_layout<256>();
}

TEST(KVCacheTmaLayout, BoxesTileTheTileAndThePage) {
  EXPECT_EQ(cuda::decode::tma_box_rows(0), 64);  // contiguous
  for (std::int64_t page = 16; page <= 256; page += 16) {
    const int box = cuda::decode::tma_box_rows(page);
    EXPECT_EQ(box, std::gcd(page, std::int64_t{64})) << page;
    EXPECT_EQ(64 % box, 0) << page;
    EXPECT_EQ(page % box, 0) << page;
  }
}

}  // namespace
}  // namespace flashattn::testing
