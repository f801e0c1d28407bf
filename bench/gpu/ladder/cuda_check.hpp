// bench/gpu/ladder/cuda_check.hpp — every CUDA and cuBLAS return code is checked;
// a kernel launch is followed by a check of the last error (exit code 0 proves nothing).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace ladder {

inline void check_cuda(cudaError_t status, const char* what, const char* file, int line) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what + ": " +
                             cudaGetErrorString(status));
}

inline void check_cublas(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what + ": " +
                             cublasGetStatusString(status));
}

}  // namespace ladder

#define LADDER_CUDA_CHECK(expr) ::ladder::check_cuda((expr), #expr, __FILE__, __LINE__)
#define LADDER_CUBLAS_CHECK(expr) ::ladder::check_cublas((expr), #expr, __FILE__, __LINE__)
#define LADDER_CHECK_LAUNCH(name) ::ladder::check_cuda(cudaGetLastError(), "launch of " name, __FILE__, __LINE__)
