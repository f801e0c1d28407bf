// src/cuda/common/check.cuh — turn CUDA return codes into exceptions.
//
// Every runtime call and every kernel launch in the library goes through
// FLASHATTN_CUDA_CHECK; a failure becomes flashattn::CudaError carrying the CUDA
// message and the call site. Host code only.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace flashattn::cuda {

// A CUDA runtime error (launch failure, out of resources, sticky device error).
class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, const char* expression, const char* file, int line)
      : std::runtime_error(std::string("flashattn: CUDA error ") + cudaGetErrorName(code) + " (" +
                           cudaGetErrorString(code) + ") in " + expression + " at " + file + ":" +
                           std::to_string(line)),
        code_(code) {}
  cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

inline void check_cuda(cudaError_t code, const char* expression, const char* file, int line) {
  if (code != cudaSuccess) throw CudaError(code, expression, file, line);
}

}  // namespace flashattn::cuda

#define FLASHATTN_CUDA_CHECK(expression) ::flashattn::cuda::check_cuda((expression), #expression, __FILE__, __LINE__)
// After a <<<...>>> launch: reports configuration errors (bad grid, too much shared
// memory) without synchronising; asynchronous faults surface at the next sync.
#define FLASHATTN_CUDA_CHECK_LAUNCH() FLASHATTN_CUDA_CHECK(cudaGetLastError())
