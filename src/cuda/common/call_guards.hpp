// src/cuda/common/call_guards.hpp — host-side guards every CUDA entry point takes
// before launching: the caller's device made current for the call, and the 16-byte
// row alignment that cp.async and vector stores need. Host code only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "flashattn/error.hpp"
#include "src/cuda/common/check.cuh"

namespace flashattn::cuda {

// Makes `device` current for the duration of a call, restoring the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    FLASHATTN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) FLASHATTN_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int current = previous_;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// The kernels move 16-byte chunks of each row (cp.async, vector stores): the data
// pointer and every batch/row/head stride must keep that alignment. Thrown before
// any launch, so no output is touched.
inline void require_16_byte_rows(const char* name, const void* data, std::int64_t batch_stride,
                                 std::int64_t row_stride, std::int64_t head_stride) {
  const bool aligned = reinterpret_cast<std::uintptr_t>(data) % 16 == 0 && batch_stride % 8 == 0 &&
                       row_stride % 8 == 0 && head_stride % 8 == 0;
  if (!aligned)
    throw NotSupported(std::string("flashattn: ") + name +
                       ": the CUDA kernels need 16-byte aligned rows (data pointer aligned to 16 bytes and "
                       "batch/row/head strides multiples of 8 elements), got strides " +
                       std::to_string(batch_stride) + "/" + std::to_string(row_stride) + "/" +
                       std::to_string(head_stride));
}

}  // namespace flashattn::cuda
