// src/cuda/decode/grid_dependency.cuh — Programmatic Dependent Launch (PDL) for the
// decode launch chain append -> split-KV kernel -> combine (and the kernels around it).
//
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start
// before the previous kernel in the stream has finished: its CTAs are scheduled as
// soon as every CTA of the previous grid has run launch_dependents (or exited). This
// hides the ~1-2 us launch gap between dependent kernels, which at batch 8 / KV 1k is
// a tenth of the whole step (33.5 MB read in ~11 us at 3 TB/s).
//
// The contract, per kernel launched that way: wait_for_prior_grids() before the first
// read of anything an earlier kernel may have written (or the first write to anything
// it may read). The wait returns when the prior grids have completed and their memory
// is visible — with or without their trigger. PTX ISA, "Parallel Synchronization and
// Communication Instructions" > "griddepcontrol"; sm_90 and newer. On older targets
// both are no-ops, so the host sets the attribute only for kernels compiled for sm_90+
// (kernel_supports_pdl: a compute_80 PTX kernel JIT-compiled on an H100 must not get it).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <utility>

namespace flashattn::cuda::decode {

// griddepcontrol.wait: blocks until the prerequisite grids have completed and their
// writes are visible to this grid.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// griddepcontrol.launch_dependents: this CTA no longer needs to hold back the next
// grid's launch (the next grid still waits for this one's completion before reading).
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether `kernel`, as loaded for the current device, was compiled from sm_90+ code
// (so its griddepcontrol instructions exist). Cached per kernel and device.
template <class Kernel>
bool kernel_supports_pdl(Kernel* kernel) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};  // 0 unknown, 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (device < kMaxDevices && cached[device].load(std::memory_order_relaxed) != 0) return cached[device].load() == 2;
  cudaFuncAttributes attributes{};
  const bool is_supported = cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess && attributes.ptxVersion >= 90;
  if (device < kMaxDevices) cached[device].store(is_supported ? 2 : 1, std::memory_order_relaxed);
  return is_supported;
}

// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...), with the PDL
// attribute when the kernel supports it (kernel_supports_pdl), plainly otherwise.
template <class... KernelArgs, class... Args>
cudaError_t launch_with_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, std::size_t shared_bytes,
                            cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = kernel_supports_pdl(kernel) ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace flashattn::cuda::decode
