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

#define FLASHATTN_VERSION_MAJOR 0
#define FLASHATTN_VERSION_MINOR 1
#define FLASHATTN_VERSION_PATCH 0
