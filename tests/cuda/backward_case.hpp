// tests/cuda/backward_case.hpp — one backward test case against the float64 oracle:
// inputs, O/LSE from the CPU reference, the CUDA backward on poisoned outputs, and
// the gradient rule of STYLE.md (see test_backward.cpp). Shared by the backward
// test files; include inside no namespace.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "src/core/validate.hpp"
#include "src/cpu/reference.hpp"
#include "tests/support/host_tensor.hpp"

namespace flashattn {
namespace {

using testing::HostTensor;

#define CUDA_OK(expression) ASSERT_EQ((expression), cudaSuccess) << #expression

// Owning device copy of a host buffer (the same bytes, so the same strides).
class DeviceCopy {
 public:
  DeviceCopy() = default;
  explicit DeviceCopy(std::size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&data_, std::max<std::size_t>(bytes, 16)) != cudaSuccess) throw std::runtime_error("cudaMalloc");
  }
  DeviceCopy(const void* host, std::size_t bytes) : DeviceCopy(bytes) {
    if (cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) throw std::runtime_error("upload");
  }
  ~DeviceCopy() { cudaFree(data_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  void* data() const { return data_; }
  void download(void* host) const {
    if (cudaMemcpy(host, data_, bytes_, cudaMemcpyDeviceToHost) != cudaSuccess) throw std::runtime_error("download");
  }
  void poison() const {
    if (cudaMemset(data_, 0xFF, bytes_) != cudaSuccess) throw std::runtime_error("memset");
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

struct Case {
  DType dtype = DType::float16;
  std::int64_t batch = 2, seqlen_q = 128, seqlen_k = 128, heads_q = 2, heads_kv = 2, head_dim = 64;
  bool causal = false;
  std::int64_t window_left = -1, window_right = -1;
  double softcap = 0.0;
  bool deterministic = false;
  std::vector<std::int32_t> varlen_q, varlen_k;  // sequence lengths; empty = padded batch
  float q_scale = 1.0f;
  std::int64_t dout_head_padding = 0;  // > 0: dout's heads strided apart (non-contiguous; 3 = unaligned)
  std::uint64_t seed = 1;
  // ALiBi slopes: none, one per query head ([heads_q]) or one per (batch, head) ([batch, heads_q]).
  enum class Alibi { none, per_head, per_batch_head } alibi = Alibi::none;
  // Dropout (flashattn/dropout.hpp); the seed and offset as host values or, with
  // seed_offset_in_memory, in an int64 {seed, offset} tensor on the device.
  double dropout_p = 0.0;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  bool seed_offset_in_memory = false;

  std::string name() const {
    std::string s = std::string(dtype_name(dtype)) + " b" + std::to_string(batch) + " sq" + std::to_string(seqlen_q) +
                    " sk" + std::to_string(seqlen_k) + " h" + std::to_string(heads_q) + "/" + std::to_string(heads_kv) +
                    " d" + std::to_string(head_dim);
    if (causal) s += " causal";
    if (window_left >= 0 || window_right >= 0)
      s += " window(" + std::to_string(window_left) + "," + std::to_string(window_right) + ")";
    if (softcap > 0) s += " softcap" + std::to_string(softcap);
    if (deterministic) s += " deterministic";
    if (!varlen_q.empty()) s += " varlen";
    if (q_scale != 1.0f) s += " q*" + std::to_string(q_scale);
    if (dout_head_padding) s += " dout_pad" + std::to_string(dout_head_padding);
    if (alibi == Alibi::per_head) s += " alibi(head)";
    if (alibi == Alibi::per_batch_head) s += " alibi(batch,head)";
    if (dropout_p > 0)
      s += " dropout" + std::to_string(dropout_p) + "(seed " + std::to_string(dropout_seed) + ", offset " +
           std::to_string(dropout_offset) + (seed_offset_in_memory ? ", in memory)" : ")");
    return s;
  }
};

struct Gradients {
  HostTensor dq, dk, dv;
};

// Everything one case needs on the host: inputs, O/LSE from the oracle, the
// reference gradients, and BackwardArgs builders for host or device pointers.
struct Problem {
  Case c;
  bool is_varlen = false;
  std::int64_t total_q = 0, total_k = 0, max_q = 0, max_k = 0;
  HostTensor q, k, v, out, dout, lse, cu_q, cu_k;
  HostTensor alibi_slopes;  // float32 [heads_q] or [batch, heads_q]; empty without ALiBi
  HostTensor seed_offset;   // int64 {seed, offset}
  std::vector<std::int64_t> q_shape, k_shape, lse_shape;

  explicit Problem(const Case& test_case) : c(test_case) {
    is_varlen = !c.varlen_q.empty();
    if (is_varlen) {
      cu_q = HostTensor(DType::int32, {static_cast<std::int64_t>(c.varlen_q.size()) + 1});
      cu_k = HostTensor(DType::int32, {static_cast<std::int64_t>(c.varlen_k.size()) + 1});
      auto* cq = static_cast<std::int32_t*>(cu_q.data());
      auto* ck = static_cast<std::int32_t*>(cu_k.data());
      cq[0] = ck[0] = 0;
      for (std::size_t b = 0; b < c.varlen_q.size(); ++b) {
        cq[b + 1] = cq[b] + c.varlen_q[b];
        ck[b + 1] = ck[b] + c.varlen_k[b];
        max_q = std::max<std::int64_t>(max_q, c.varlen_q[b]);
        max_k = std::max<std::int64_t>(max_k, c.varlen_k[b]);
      }
      total_q = cq[c.varlen_q.size()];
      total_k = ck[c.varlen_k.size()];
      q_shape = {total_q, c.heads_q, c.head_dim};
      k_shape = {total_k, c.heads_kv, c.head_dim};
      lse_shape = {c.heads_q, total_q};
    } else {
      total_q = c.batch * c.seqlen_q;
      total_k = c.batch * c.seqlen_k;
      q_shape = {c.batch, c.seqlen_q, c.heads_q, c.head_dim};
      k_shape = {c.batch, c.seqlen_k, c.heads_kv, c.head_dim};
      lse_shape = {c.batch, c.heads_q, c.seqlen_q};
    }
    q = HostTensor(c.dtype, q_shape);
    k = HostTensor(c.dtype, k_shape);
    v = HostTensor(c.dtype, k_shape);
    std::vector<std::int64_t> dout_storage = q_shape;
    dout_storage.back() += c.dout_head_padding;
    dout = HostTensor(c.dtype, dout_storage);
    q.fill_random(c.seed * 4 + 0, c.q_scale);
    k.fill_random(c.seed * 4 + 1);
    v.fill_random(c.seed * 4 + 2);
    dout.fill_random(c.seed * 4 + 3);
    out = HostTensor(c.dtype, q_shape);
    lse = HostTensor(DType::float32, lse_shape);
    // ALiBi's geometric slopes 2^(-8 (h + 1) / heads), varied per batch item (0.75 + b / 4)
    // so that a kernel reading the wrong item's slope fails.
    if (c.alibi != Case::Alibi::none) {
      const std::int64_t batches = c.alibi == Case::Alibi::per_batch_head ? (is_varlen ? std::int64_t(c.varlen_q.size()) : c.batch) : 1;
      alibi_slopes = c.alibi == Case::Alibi::per_batch_head ? HostTensor(DType::float32, {batches, c.heads_q})
                                                            : HostTensor(DType::float32, {c.heads_q});
      for (std::int64_t b = 0; b < batches; ++b)
        for (std::int64_t h = 0; h < c.heads_q; ++h)
          alibi_slopes.set(b * c.heads_q + h, static_cast<float>(std::exp2(-8.0 * static_cast<double>(h + 1) /
                                                                           static_cast<double>(c.heads_q)) *
                                                                 (c.alibi == Case::Alibi::per_batch_head ? 0.75 + 0.25 * b : 1.0)));
    }
    seed_offset = HostTensor(DType::int64, {2});
    set_dropout_seed_offset(c.dropout_seed, c.dropout_offset);

    // O and LSE from the float64 forward, O rounded to the dtype.
    ForwardArgs forward_args;
    forward_args.q = q.view(), forward_args.k = k.view(), forward_args.v = v.view(), forward_args.out = out.view();
    forward_args.maybe_lse = lse.view();
    forward_args.maybe_varlen = varlen(cu_q.view(), cu_k.view());
    forward_args.options = options();
    const AttentionParams params = validate_forward(forward_args);
    const cpu::ReferenceResult reference = cpu::reference_forward(params);
    for (std::int64_t i = 0; i < out.numel(); ++i) out.set(i, static_cast<float>(reference.out[static_cast<std::size_t>(i)]));
    // reference.lse is [total_q, heads_q]; lse is [batch, heads, seqlen] or [heads, total_q].
    for (std::int64_t row = 0; row < total_q; ++row)
      for (std::int64_t h = 0; h < c.heads_q; ++h) {
        const auto value = static_cast<float>(reference.lse_at(row, h));
        const std::int64_t index = is_varlen ? h * total_q + row
                                             : ((row / c.seqlen_q) * c.heads_q + h) * c.seqlen_q + row % c.seqlen_q;
        static_cast<float*>(lse.data())[index] = value;
      }
  }

  // The seed and offset of later runs (the host values and the tensor), keeping O and
  // the LSE of the forward pass computed at construction.
  void set_dropout_seed_offset(std::uint64_t seed, std::uint64_t offset) {
    c.dropout_seed = seed, c.dropout_offset = offset;
    static_cast<std::int64_t*>(seed_offset.data())[0] = static_cast<std::int64_t>(seed);
    static_cast<std::int64_t*>(seed_offset.data())[1] = static_cast<std::int64_t>(offset);
  }
  // The options with the slopes and seed/offset tensors at `alibi_data`/`seed_offset_data`
  // (the host tensors' copies on `device`); options() for the host tensors.
  AttentionOptions options_on(const void* alibi_data, const void* seed_offset_data, Device device) const {
    AttentionOptions o;
    o.causal = c.causal;
    o.window_left = c.window_left;
    o.window_right = c.window_right;
    o.softcap = c.softcap;
    o.deterministic = c.deterministic;
    if (c.alibi != Case::Alibi::none)
      o.maybe_alibi_slopes = on(alibi_slopes, const_cast<void*>(alibi_data), device);
    o.dropout_p = c.dropout_p;
    o.dropout_seed = c.dropout_seed;
    o.dropout_offset = c.dropout_offset;
    if (c.seed_offset_in_memory) o.maybe_dropout_seed_offset = on(seed_offset, const_cast<void*>(seed_offset_data), device);
    return o;
  }
  AttentionOptions options() const { return options_on(alibi_slopes.data(), seed_offset.data(), Device::cpu()); }
  std::optional<VarlenArgs> varlen(TensorView cu_seqlens_q, TensorView cu_seqlens_k) const {
    if (!is_varlen) return std::nullopt;
    return VarlenArgs{cu_seqlens_q, cu_seqlens_k, max_q, max_k};
  }
  TensorView dout_view(void* data, Device device) const {
    TensorView t = TensorView::contiguous(data, c.dtype, {1}, device);
    t.rank = static_cast<int>(q_shape.size());
    std::int64_t stride = 1;
    for (int d = t.rank - 1; d >= 0; --d) {
      t.shape[static_cast<std::size_t>(d)] = q_shape[static_cast<std::size_t>(d)];
      t.strides[static_cast<std::size_t>(d)] = stride;
      stride *= q_shape[static_cast<std::size_t>(d)] + (d == t.rank - 1 ? c.dout_head_padding : 0);
    }
    return t;
  }
  static TensorView on(const HostTensor& host, void* data, Device device) {
    TensorView t = const_cast<HostTensor&>(host).view();
    t.data = data;
    t.device = device;
    return t;
  }
};

// The oracle's dq/dk/dv in the dense layout of contiguous outputs.
struct ReferencePair {
  cpu::ReferenceGradients exact, lowprec;
};

ReferencePair reference_gradients(Problem& p) {
  HostTensor dq(p.c.dtype, p.q_shape), dk(p.c.dtype, p.k_shape), dv(p.c.dtype, p.k_shape);
  BackwardArgs args;
  args.q = p.q.view(), args.k = p.k.view(), args.v = p.v.view(), args.out = p.out.view();
  args.dout = p.dout_view(p.dout.data(), Device::cpu());
  args.lse = p.lse.view();
  args.dq = dq.view(), args.dk = dk.view(), args.dv = dv.view();
  args.maybe_varlen = p.varlen(p.cu_q.view(), p.cu_k.view());
  args.options = p.options();
  const BackwardParams params = validate_backward(args);
  return {cpu::reference_backward(params), cpu::naive_backward_in_precision(params, p.c.dtype)};
}

// Runs the CUDA backward `repeats` times on fresh poisoned outputs; returns each run's gradients.
std::vector<Gradients> run_cuda(Problem& p, int repeats) {
  const Device gpu = Device::cuda(0);
  DeviceCopy q(p.q.data(), p.q.numel() * dtype_size(p.c.dtype)), k(p.k.data(), p.k.numel() * dtype_size(p.c.dtype)),
      v(p.v.data(), p.v.numel() * dtype_size(p.c.dtype)), out(p.out.data(), p.out.numel() * dtype_size(p.c.dtype)),
      dout(p.dout.data(), p.dout.numel() * dtype_size(p.c.dtype)), lse(p.lse.data(), p.lse.numel() * sizeof(float)),
      cu_q(p.cu_q.data(), p.cu_q.numel() * sizeof(std::int32_t)), cu_k(p.cu_k.data(), p.cu_k.numel() * sizeof(std::int32_t)),
      alibi_slopes(p.alibi_slopes.data(), p.alibi_slopes.numel() * sizeof(float)),
      seed_offset(p.seed_offset.data(), p.seed_offset.numel() * sizeof(std::int64_t));
  std::vector<Gradients> results;
  for (int r = 0; r < repeats; ++r) {
    Gradients g{HostTensor(p.c.dtype, p.q_shape), HostTensor(p.c.dtype, p.k_shape), HostTensor(p.c.dtype, p.k_shape)};
    DeviceCopy dq(p.q.numel() * dtype_size(p.c.dtype)), dk(p.k.numel() * dtype_size(p.c.dtype)),
        dv(p.k.numel() * dtype_size(p.c.dtype));
    dq.poison(), dk.poison(), dv.poison();
    BackwardArgs args;
    args.q = Problem::on(p.q, q.data(), gpu), args.k = Problem::on(p.k, k.data(), gpu);
    args.v = Problem::on(p.v, v.data(), gpu), args.out = Problem::on(p.out, out.data(), gpu);
    args.dout = p.dout_view(dout.data(), gpu);
    args.lse = Problem::on(p.lse, lse.data(), gpu);
    args.dq = Problem::on(g.dq, dq.data(), gpu), args.dk = Problem::on(g.dk, dk.data(), gpu);
    args.dv = Problem::on(g.dv, dv.data(), gpu);
    args.maybe_varlen = p.varlen(Problem::on(p.cu_q, cu_q.data(), gpu), Problem::on(p.cu_k, cu_k.data(), gpu));
    args.options = p.options_on(alibi_slopes.data(), seed_offset.data(), gpu);
    const std::size_t workspace_bytes = backward_workspace_bytes(args);
    DeviceCopy workspace(workspace_bytes);
    workspace.poison();  // the kernels must not rely on a zeroed workspace
    args.maybe_workspace = TensorView::contiguous(workspace.data(), DType::uint8,
                                                  {static_cast<std::int64_t>(std::max<std::size_t>(workspace_bytes, 1))}, gpu);
    backward(args);
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("backward failed on the device");
    dq.download(g.dq.data()), dk.download(g.dk.data()), dv.download(g.dv.data());
    results.push_back(std::move(g));
  }
  return results;
}

// max|ours - ref| <= 3 max|lowprec - ref| + floor, and no NaN/Inf anywhere.
void expect_close(const char* what, const HostTensor& ours, const std::vector<double>& exact,
                  const std::vector<double>& lowprec, const std::string& name) {
  ASSERT_EQ(static_cast<std::size_t>(ours.numel()), exact.size()) << what;
  double error = 0, lowprec_error = 0, magnitude = 0;
  std::int64_t worst = -1, non_finite = 0;
  for (std::int64_t i = 0; i < ours.numel(); ++i) {
    const double x = ours.get(i), ref = exact[static_cast<std::size_t>(i)];
    if (!std::isfinite(x)) {
      ++non_finite;
      continue;
    }
    if (std::abs(x - ref) > error) error = std::abs(x - ref), worst = i;
    lowprec_error = std::max(lowprec_error, std::abs(lowprec[static_cast<std::size_t>(i)] - ref));
    magnitude = std::max(magnitude, std::abs(ref));
  }
  EXPECT_EQ(non_finite, 0) << name << ": " << what << " has non-finite (or unwritten) elements";
  const double floor = 1e-4 * std::max(1.0, magnitude);
  EXPECT_LE(error, 3 * lowprec_error + floor)
      << name << ": " << what << " max error " << error << " at " << worst << " (ours " << (worst >= 0 ? ours.get(worst) : 0)
      << ", ref " << (worst >= 0 ? exact[static_cast<std::size_t>(worst)] : 0) << "), same-precision naive error "
      << lowprec_error << ", max|ref| " << magnitude;
}

void check_case(const Case& c) {
  SCOPED_TRACE(c.name());
  Problem p(c);
  const ReferencePair ref = reference_gradients(p);
  const std::vector<Gradients> runs = run_cuda(p, 1);
  expect_close("dq", runs[0].dq, ref.exact.dq, ref.lowprec.dq, c.name());
  expect_close("dk", runs[0].dk, ref.exact.dk, ref.lowprec.dk, c.name());
  expect_close("dv", runs[0].dv, ref.exact.dv, ref.lowprec.dv, c.name());
}

}  // namespace
}  // namespace flashattn
