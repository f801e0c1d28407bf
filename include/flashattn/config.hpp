// flashattn/config.hpp — portability macros shared by host and device code.
#pragma once

// Functions of the hardware-free algorithm layer (online softmax, mask rules) are
// compiled for the CPU and, under nvcc, for the GPU as well.
#if defined(__CUDACC__)
#define FLASHATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHATTN_HOST_DEVICE inline
#endif
// Loop unrolling in host/device code: the device pass unrolls; the host compiler
// would warn about the CUDA pragma.
#if defined(__CUDA_ARCH__)
#define FLASHATTN_UNROLL _Pragma("unroll")
#else
#define FLASHATTN_UNROLL
#endif

#include <cstdint>

namespace flashattn {
// a / b and a % b for an index a >= 0 and a block size b > 0 (mask blocks). Device code
// divides in 32 bits and so needs a, b < 2^31 (the CUDA kernels' rows and columns; the
// Hopper kernels' TMA coordinates are 32-bit anyway): a 64-bit division is a subroutine
// call there, and its clobbered registers spilled ~40 registers of the Hopper forward's
// mainloop wherever the call was compiled in, taken or not.
FLASHATTN_HOST_DEVICE std::int64_t index_quotient(std::int64_t a, std::int64_t b) {
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint32_t>(a) / static_cast<std::uint32_t>(b);
#else
  return a / b;
#endif
}
FLASHATTN_HOST_DEVICE std::int64_t index_remainder(std::int64_t a, std::int64_t b) {
  return a - index_quotient(a, b) * b;
}
}  // namespace flashattn

#define FLASHATTN_VERSION_MAJOR 0
#define FLASHATTN_VERSION_MINOR 1
#define FLASHATTN_VERSION_PATCH 0
