// tests/cuda/device_problem.hpp — runs an AttentionProblem (tests/cpu/attention_problem.hpp:
// host buffers, the float64 reference, the STYLE.md tolerance rule) on the GPU:
// mirrors the host buffers into device memory, builds the same arguments with device
// views (same strides, same offsets), and copies out/LSE back into the host problem
// so the host-side checks apply unchanged.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "tests/cpu/attention_problem.hpp"

namespace flashattn::testing {

inline void cuda_or_throw(cudaError_t code, const char* what) {
  if (code != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(code));
}

// One device allocation mirroring one host buffer byte for byte.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    cuda_or_throw(cudaMalloc(&data_, bytes_ < 16 ? 16 : bytes_), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) { other.data_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  void upload(const void* host) { cuda_or_throw(cudaMemcpy(data_, host, bytes_, cudaMemcpyHostToDevice), "upload"); }
  void download(void* host) const {
    cuda_or_throw(cudaMemcpy(host, data_, bytes_, cudaMemcpyDeviceToHost), "download");
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

inline std::size_t host_bytes(const HostTensor& t) {
  return static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()) + 64;  // HostTensor's own padding
}

// Mirrors the problem's buffers (and any extra host tensors its strided views point
// into) on device 0.
class DeviceProblem {
 public:
  explicit DeviceProblem(AttentionProblem& problem, std::vector<HostTensor*> extra_buffers = {})
      : problem_(problem) {
    for (HostTensor* t : {&problem.q, &problem.k, &problem.v, &problem.out, &problem.lse, &problem.cu_seqlens_q,
                          &problem.cu_seqlens_k})
      add(t);
    for (HostTensor* t : extra_buffers) add(t);
  }

  // Re-uploads every mirrored buffer (inputs and the canary-filled outputs).
  void upload_all() {
    for (auto& m : mirrors_) m.device.upload(m.host->data());
  }
  // Refills the device out/LSE with the host canary (a NaN for every float dtype).
  void poison_outputs() {
    problem_.out.fill_canary();
    problem_.lse.fill_canary();
    mirror_of(&problem_.out).device.upload(problem_.out.data());
    mirror_of(&problem_.lse).device.upload(problem_.lse.data());
  }
  void download_outputs() {
    mirror_of(&problem_.out).device.download(problem_.out.data());
    mirror_of(&problem_.lse).device.download(problem_.lse.data());
  }

  ForwardArgs forward_args() {
    ForwardArgs args = problem_.forward_args();
    for (TensorView* view : {&args.q, &args.k, &args.v, &args.out, &args.maybe_lse}) to_device(*view);
    if (args.maybe_varlen) {
      to_device(args.maybe_varlen->cu_seqlens_q);
      to_device(args.maybe_varlen->cu_seqlens_k);
    }
    return args;
  }

  // The device counterpart of a view into a mirrored host buffer (problem or extra).
  TensorView device_view(TensorView host_view) {
    to_device(host_view);
    return host_view;
  }

  // Poison, run the forward on `stream`, synchronise, download.
  void run_forward(cudaStream_t stream = nullptr) {
    poison_outputs();
    ExecutionContext context;
    context.stream = stream;
    forward(forward_args(), context);
    cuda_or_throw(cudaStreamSynchronize(stream), "forward on the device");
    cuda_or_throw(cudaGetLastError(), "forward on the device");
    download_outputs();
  }

 private:
  struct Mirror {
    HostTensor* host;
    DeviceBuffer device;
  };
  void add(HostTensor* t) {
    if (t->numel() == 0 && t->shape().empty()) return;  // never constructed (e.g. no varlen)
    Mirror m{t, DeviceBuffer(host_bytes(*t))};
    m.device.upload(t->data());
    mirrors_.push_back(std::move(m));
  }
  Mirror& mirror_of(const HostTensor* t) {
    for (auto& m : mirrors_)
      if (m.host == t) return m;
    throw std::runtime_error("tensor not mirrored");
  }
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

  AttentionProblem& problem_;
  std::vector<Mirror> mirrors_;
};

}  // namespace flashattn::testing
