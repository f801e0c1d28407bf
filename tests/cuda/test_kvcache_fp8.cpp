// forward_with_kvcache over an FP8 (e4m3) cache on the GPU (kernel_mma_fp8.cuh, the
// quantising append, the combine): the host problems of tests/cpu/kvcache_fp8_problem.hpp
// mirrored to device memory, against the float64 attention over the dequantised cache
// and the append's exact bytes; every split path (one split, two in a cluster, the
// combine), contiguous / paged / cache_batch_idx, GQA, head dims 64/96/128/256.
// Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "flashattn/error.hpp"
#include "flashattn/kvcache.hpp"
#include "tests/cpu/kvcache_fp8_problem.hpp"
#include "tests/cuda/device_problem.hpp"

namespace flashattn::testing {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

// Device mirrors of every host buffer of the problem, byte for byte.
class DeviceFp8Decode {
 public:
  explicit DeviceFp8Decode(Fp8DecodeProblem& p) : p_(p) {
    DecodeProblem& d = p.base;
    for (HostTensor* t : {&d.q, &d.k_new, &d.v_new, &d.cache_seqlens, &d.cache_batch_idx, &d.cache_leftpad, &d.block_table, &d.rotary_cos,
                          &d.rotary_sin, &d.out, &d.lse, &p.k_cache, &p.v_cache, &p.k_new, &p.v_new, &p.k_descale, &p.v_descale}) {
      if (t->numel() == 0 && t->shape().empty()) continue;  // never allocated
      DeviceBuffer buffer(host_bytes(*t));
      buffer.upload(t->data());
      mirrors_.emplace(t->data(), std::move(buffer));
    }
  }

  // Runs on the GPU (with the split workspace the call asks for), then copies out, LSE
  // and both caches back into the host problem.
  void run(const KVCacheArgs& host) {
    KVCacheArgs a = host;
    for (TensorView* t : {&a.q, &a.k_cache, &a.v_cache, &a.maybe_k_new, &a.maybe_v_new, &a.maybe_cache_seqlens, &a.maybe_cache_batch_idx,
                          &a.maybe_cache_leftpad, &a.maybe_block_table, &a.maybe_rotary_cos, &a.maybe_rotary_sin, &a.options.maybe_k_descale,
                          &a.options.maybe_v_descale, &a.out, &a.maybe_lse}) {
      if (!t->defined()) continue;
      t->data = mirrors_.at(t->data).data();
      t->device = Device::cuda(0);
    }
    const std::size_t bytes = kvcache_workspace_bytes(a);
    DeviceBuffer workspace(bytes ? bytes : 16);
    if (bytes) a.maybe_workspace = TensorView::contiguous(workspace.data(), DType::uint8, {static_cast<std::int64_t>(bytes)}, Device::cuda(0));
    forward_with_kvcache(a);
    cuda_or_throw(cudaGetLastError(), "launch");
    cuda_or_throw(cudaDeviceSynchronize(), "forward_with_kvcache");
    for (HostTensor* t : {&p_.base.out, &p_.base.lse, &p_.k_cache, &p_.v_cache}) mirrors_.at(t->data()).download(t->data());
  }

 private:
  Fp8DecodeProblem& p_;
  std::map<void*, DeviceBuffer> mirrors_;
};

class KVCacheFp8Cuda : public ::testing::TestWithParam<Fp8DecodeShape> {};

// The GPU rounds P to q's dtype before P V (relative 2^-9 for bfloat16, 2^-12 for
// float16, times max|v| ~ 4.5 after dequantisation), then the output to q's dtype.
TEST_P(KVCacheFp8Cuda, MatchesDequantisedReferenceAndAppendsExactly) {
  SKIP_WITHOUT_GPU();
  const Fp8DecodeShape& shape = GetParam();
  Fp8DecodeProblem p(shape, 7);
  DeviceFp8Decode device(p);
  try {
    device.run(p.args());
  } catch (const NotSupported& e) {
    if (std::string(e.what()).find("head_dim") == std::string::npos) throw;
    GTEST_SKIP() << shape.describe() << ": head dim not built";
  }
  const bool is_bf16 = shape.base.dtype == DType::bfloat16;
  p.expect_matches_reference(is_bf16 ? 1.0 / 256 : 1.0 / 2048, is_bf16 ? 1e-2 : 2e-3, 1e-3, shape.describe());
  if (shape.base.seqlen_new > 0) p.expect_append_exact(shape.describe());
}

std::vector<Fp8DecodeShape> shapes() {
  std::vector<Fp8DecodeShape> v;
  for (DType dtype : {DType::float16, DType::bfloat16})
    for (std::int64_t head_dim : {64, 96, 128, 256})
      for (std::int64_t page : {0, 16, 48, 256})
        for (int splits : {1, 2, 3, 0}) {  // one split, a cluster of two, the combine, the heuristic
          Fp8DecodeShape s;
          s.base.dtype = dtype, s.base.head_dim = head_dim, s.base.page_size = page, s.base.capacity = 300;
          s.base.heads_q = 8, s.base.heads_kv = 2, s.base.num_splits = splits;
          v.push_back(s);  // plain decode, GQA 4
          s.base.seqlen_new = 3, s.base.seqlen_q = 3, s.base.causal = true, s.base.rotary_dim = head_dim / 2;
          s.descale = Fp8DecodeShape::Descale::per_tensor;
          v.push_back(s);  // speculative decode, append quantised after rotary
          s.base.rotary_dim = 0, s.fp8_new = true, s.descale = Fp8DecodeShape::Descale::none;
          v.push_back(s);  // e4m3 rows appended as they are
        }
  Fp8DecodeShape mqa;  // 16 query heads on one kv head: two query blocks; long cache
  mqa.base.heads_q = 16, mqa.base.heads_kv = 1, mqa.base.seqlen_q = 2, mqa.base.capacity = 1025, mqa.base.head_dim = 128;
  mqa.base.num_splits = 5, mqa.base.causal = true;
  v.push_back(mqa);
  mqa.base.page_size = 32, mqa.base.softcap = 30.0;
  v.push_back(mqa);
  Fp8DecodeShape batch_idx;  // cache rows permuted
  batch_idx.base.permute_batch = true, batch_idx.base.batch = 3, batch_idx.base.seqlen_new = 2, batch_idx.base.head_dim = 128;
  v.push_back(batch_idx);
  Fp8DecodeShape leftpad;  // leftpad and an empty sequence
  leftpad.base.batch = 3, leftpad.base.cache_seqlens = {40, 0, 90}, leftpad.base.leftpad = {5, 0, 0}, leftpad.base.capacity = 100;
  leftpad.base.head_dim = 64, leftpad.base.num_splits = 2;
  v.push_back(leftpad);
  return v;
}
INSTANTIATE_TEST_SUITE_P(Shapes, KVCacheFp8Cuda, ::testing::ValuesIn(shapes()));

// The CUDA-only requirement: 16-byte rows of e4m3 (head_dim a multiple of 16).
TEST(KVCacheFp8CudaValidation, HeadDimNotAMultipleOf16) {
  SKIP_WITHOUT_GPU();
  Fp8DecodeShape s;
  s.base.head_dim = 40, s.base.capacity = 64;
  Fp8DecodeProblem p(s);
  DeviceFp8Decode device(p);
  try {
    device.run(p.args());
    ADD_FAILURE() << "accepted";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("flashattn: k_cache:"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flashattn::testing
