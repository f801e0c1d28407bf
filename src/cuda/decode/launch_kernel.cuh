// src/cuda/decode/launch_kernel.cuh — how the decode kernels are launched: with
// Programmatic Dependent Launch (PDL) along the chain append -> split-KV kernel ->
// combine (and the kernels around it), and the split-KV kernel in thread-block
// clusters when the splits of a query block merge inside the kernel (kernel_mma.cuh).
//
// PDL: a kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may
// start before the previous kernel in the stream has finished: its CTAs are scheduled
// as soon as every CTA of the previous grid has run launch_dependents (or exited).
// This hides the ~1-2 us launch gap between dependent kernels, which at batch 8 /
// KV 1k is a tenth of the whole step (33.5 MB read in ~11 us at 3 TB/s).
//
// The contract, per kernel launched that way: wait_for_prior_grids() before the first
// read of anything an earlier kernel may have written (or the first write to anything
// it may read). The wait returns when the prior grids have completed and their memory
// is visible — with or without their trigger. PTX ISA, "Parallel Synchronization and
// Communication Instructions" > "griddepcontrol"; sm_90 and newer. On older targets
// both are no-ops, so the host sets the attribute only for kernels compiled for sm_90+
// (kernel_is_sm90: a compute_80 PTX kernel JIT-compiled on an H100 must not get it).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "src/cuda/ptx/arch.cuh"

namespace flashattn::cuda::decode {

// Splits merged inside the split-KV kernel at most (one cluster of CTAs). Measured on
// the H100 (2026-11-22, batch 8, 8 kv heads, d128): clusters of 2 beat the combine
// kernel by ~1 us (KV 1k: 21.6 vs 22.7 us), clusters of 3 tie, clusters of 4 or more
// lose badly (KV 64k, 4 splits: 946 us vs 708 us) — fewer of them are resident at once.
inline constexpr int kMaxClusterSplits = 2;

// griddepcontrol.wait: blocks until the prerequisite grids have completed and their
// writes are visible to this grid.
__device__ __forceinline__ void wait_for_prior_grids() {
#if FLASHATTN_SM90_DEVICE_CODE
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// griddepcontrol.launch_dependents: this CTA no longer needs to hold back the next
// grid's launch (the next grid still waits for this one's completion before reading).
__device__ __forceinline__ void allow_dependent_launch() {
#if FLASHATTN_SM90_DEVICE_CODE
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether `kernel`, as loaded for the current device, was compiled from sm_90+ code,
// so its griddepcontrol instructions and cluster code exist (a compute_80 PTX kernel
// JIT-compiled on an H100 has neither). Cached per kernel and device.
template <class Kernel>
bool kernel_is_sm90(Kernel* kernel) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};  // 0 unknown, 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (device < kMaxDevices && cached[device].load(std::memory_order_relaxed) != 0) return cached[device].load() == 2;
  cudaFuncAttributes attributes{};
  const bool is_sm90 = cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess && attributes.ptxVersion >= 90;
  if (device < kMaxDevices) cached[device].store(is_sm90 ? 2 : 1, std::memory_order_relaxed);
  return is_sm90;
}

// Ablation knob of the launch chain, read at every call (decode_bench's "+nopdl"
// compares it in one process; the tests run the default): FLASHATTN_DECODE_PDL=0
// launches without PDL, each kernel starting after the previous one ends. Measured on
// the H100 (2026-11-25): PDL saves 0.2-0.8 us per step at batch 8 / KV 64-4096.
// (Giving append and combine the split-KV kernel's L1/shared carveout was measured too:
// no difference at any shape, so they keep the driver's choice.)
inline bool is_pdl_enabled() {
  const char* value = std::getenv("FLASHATTN_DECODE_PDL");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...), with the PDL
// attribute when the kernel is sm_90 code (kernel_is_sm90) and PDL is enabled
// (is_pdl_enabled), plainly otherwise; with
// cluster_x > 1 (sm_90 kernels only, grid.x a multiple of it) as clusters of cluster_x
// consecutive CTAs along x.
template <class... KernelArgs, class... Args>
cudaError_t launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
                          unsigned cluster_x, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (kernel_is_sm90(kernel) && is_pdl_enabled()) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = cluster_x;
    attributes[count].val.clusterDim.y = 1;
    attributes[count++].val.clusterDim.z = 1;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace flashattn::cuda::decode
