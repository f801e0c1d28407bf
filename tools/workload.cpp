// tools/workload.cpp — see workload.hpp.
#include "tools/workload.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashattn::tools {

namespace {
std::size_t byte_size(const HostTensor& t) { return static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()); }

// A host tensor, or an error that says which one and how many bytes could not be had
// (`--head-dim 100000` or `--batch 99999999999` used to end in a bare std::bad_alloc).
HostTensor allocate(DType dtype, std::vector<std::int64_t> shape, const char* name) {
  long double bytes = static_cast<long double>(dtype_size(dtype));
  std::string dims;
  for (std::int64_t s : shape) bytes *= static_cast<long double>(s), dims += (dims.empty() ? "" : ", ") + std::to_string(s);
  try {
    if (bytes > static_cast<long double>(PTRDIFF_MAX)) throw std::bad_alloc();
    return HostTensor(dtype, std::move(shape));
  } catch (const std::bad_alloc&) {
    char text[64];
    std::snprintf(text, sizeof text, "%.3Lg", bytes);
    throw std::runtime_error(std::string("cannot allocate ") + text + " bytes on the host for " + name + " [" + dims + "]");
  } catch (const std::length_error&) {
    throw std::runtime_error(std::string("cannot allocate ") + name + " [" + dims + "]: too large");
  }
}
}  // namespace

Workload::Workload(const Problem& problem, std::uint64_t seed, bool with_backward)
    : problem_(problem), with_backward_(with_backward) {
  const Problem& p = problem_;
  q = allocate(p.dtype, {p.batch, p.seqlen_q, p.heads, p.head_dim}, "q");
  k = allocate(p.dtype, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim}, "k");
  v = allocate(p.dtype, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim}, "v");
  out = allocate(p.dtype, {p.batch, p.seqlen_q, p.heads, p.head_dim}, "out");
  lse = allocate(DType::float32, {p.batch, p.heads, p.seqlen_q}, "lse");
  q.fill_random(seed * 4 + 1);
  k.fill_random(seed * 4 + 2);
  v.fill_random(seed * 4 + 3);
  if (with_backward_) {
    dout = allocate(p.dtype, {p.batch, p.seqlen_q, p.heads, p.head_dim}, "dout");
    dq = allocate(p.dtype, {p.batch, p.seqlen_q, p.heads, p.head_dim}, "dq");
    dk = allocate(p.dtype, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim}, "dk");
    dv = allocate(p.dtype, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim}, "dv");
    dout.fill_random(seed * 4 + 4);
  }
  if (on_gpu()) {
    auto upload = [](HostTensor& host, DeviceBuffer& buffer) {
      buffer = DeviceBuffer(byte_size(host));
      buffer.upload(host.data(), byte_size(host));
    };
    upload(q, q_gpu_);
    upload(k, k_gpu_);
    upload(v, v_gpu_);
    out_gpu_ = DeviceBuffer(byte_size(out));
    lse_gpu_ = DeviceBuffer(byte_size(lse));
    if (with_backward_) {
      upload(dout, dout_gpu_);
      dq_gpu_ = DeviceBuffer(byte_size(dq));
      dk_gpu_ = DeviceBuffer(byte_size(dk));
      dv_gpu_ = DeviceBuffer(byte_size(dv));
    }
  }
  poison_outputs();
}

TensorView Workload::device_view(HostTensor& host, DeviceBuffer& buffer) {
  TensorView view = host.view();
  if (on_gpu()) {
    view.data = buffer.data();
    view.device = problem_.device;
  }
  return view;
}

ExecutionContext Workload::context() const {
  ExecutionContext c;
  c.num_threads = problem_.threads;
  return c;
}

ForwardArgs Workload::forward_args() {
  ForwardArgs args;
  args.q = device_view(q, q_gpu_);
  args.k = device_view(k, k_gpu_);
  args.v = device_view(v, v_gpu_);
  args.out = device_view(out, out_gpu_);
  args.maybe_lse = device_view(lse, lse_gpu_);
  args.options = problem_.options();
  return args;
}

ForwardArgs Workload::host_forward_args() {
  ForwardArgs args;
  args.q = q.view();
  args.k = k.view();
  args.v = v.view();
  args.out = out.view();
  args.maybe_lse = lse.view();
  args.options = problem_.options();
  args.options.algorithm = Algorithm::reference;
  return args;
}

BackwardArgs Workload::backward_args() {
  BackwardArgs args;
  args.q = device_view(q, q_gpu_);
  args.k = device_view(k, k_gpu_);
  args.v = device_view(v, v_gpu_);
  args.out = device_view(out, out_gpu_);
  args.lse = device_view(lse, lse_gpu_);
  args.dout = device_view(dout, dout_gpu_);
  args.dq = device_view(dq, dq_gpu_);
  args.dk = device_view(dk, dk_gpu_);
  args.dv = device_view(dv, dv_gpu_);
  args.options = problem_.options();
  if (on_gpu()) {
    const std::size_t bytes = backward_workspace_bytes(args);
    if (workspace_gpu_.bytes() < bytes || workspace_gpu_.data() == nullptr) workspace_gpu_ = DeviceBuffer(bytes);
    args.maybe_workspace = TensorView::contiguous(workspace_gpu_.data(), DType::uint8,
                                                  {static_cast<std::int64_t>(bytes > 0 ? bytes : 1)}, problem_.device);
  }
  return args;
}

BackwardArgs Workload::host_backward_args() {
  BackwardArgs args;
  args.q = q.view();
  args.k = k.view();
  args.v = v.view();
  args.out = out.view();
  args.lse = lse.view();
  args.dout = dout.view();
  args.dq = dq.view();
  args.dk = dk.view();
  args.dv = dv.view();
  args.options = problem_.options();
  args.options.algorithm = Algorithm::reference;
  return args;
}

void Workload::poison_outputs() {
  if (on_gpu()) {
    for (DeviceBuffer* b : {&out_gpu_, &lse_gpu_, &dq_gpu_, &dk_gpu_, &dv_gpu_})
      if (b->data() != nullptr) b->fill_bytes(0xFF);
  }
  for (HostTensor* t : {&out, &lse, &dq, &dk, &dv}) t->fill_canary();
}

void Workload::run_forward() {
  forward(forward_args(), context());
  has_forward_run_ = true;
}

void Workload::run_backward() {
  if (!has_forward_run_) run_forward();
  backward(backward_args(), context());
}

template <class Call>
double Workload::time_ms(Call&& call, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) call();
  std::vector<double> times;
  times.reserve(static_cast<std::size_t>(repeats));
  if (on_gpu()) {
    device_synchronize();
    EventTimer timer;
    for (int i = 0; i < repeats; ++i) {
      timer.start();
      call();
      times.push_back(timer.stop_ms());
    }
  } else {
    for (int i = 0; i < repeats; ++i) {
      const auto start = std::chrono::steady_clock::now();
      call();
      times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
  }
  return median(times);
}

double Workload::time_forward_ms(int warmup, int repeats) {
  const ForwardArgs args = forward_args();
  const ExecutionContext c = context();
  has_forward_run_ = true;
  return time_ms([&] { forward(args, c); }, warmup, repeats);
}

double Workload::time_backward_ms(int warmup, int repeats) {
  if (!has_forward_run_) run_forward();
  const BackwardArgs args = backward_args();
  const ExecutionContext c = context();
  return time_ms([&] { backward(args, c); }, warmup, repeats);
}

void Workload::download_outputs() {
  if (!on_gpu()) return;
  device_synchronize();
  out_gpu_.download(out.data(), byte_size(out));
  lse_gpu_.download(lse.data(), byte_size(lse));
  if (with_backward_) {
    dq_gpu_.download(dq.data(), byte_size(dq));
    dk_gpu_.download(dk.data(), byte_size(dk));
    dv_gpu_.download(dv.data(), byte_size(dv));
  }
}

}  // namespace flashattn::tools
