// src/cuda/ptx/mbarrier.cuh — the mbarrier (shared-memory transaction barrier) of
// sm_90: the one definition of init, arrive and wait for every kernel that pipelines
// TMA copies (hopper/, hopper_bwd/, decode/kernel_tma.cuh).
//
// PTX ISA 9.7.13.15 "Parallel Synchronization and Communication Instructions: mbarrier":
//   mbarrier.init                 count = arrivals a phase waits for;
//   mbarrier.arrive[.expect_tx]   one arrival (and `bytes` more transaction bytes that
//                                 the phase waits for: the TMA completes them);
//   mbarrier.try_wait.parity      whether the phase of the given parity has completed
//                                 (acquire, CTA scope: .acquire and .cta are the
//                                 defaults when not spelled out); a bounded wait, so it
//                                 is polled;
//   mbarrier.test_wait.parity     the same test without waiting;
//   fence.mbarrier_init           the initialised barriers visible to the async proxy.
//
// Two address forms, one per TMA interface in the tree (both compile to the same
// instructions): the Hopper forward and backward kernels drive TMA through libcu++
// (::cuda::ptx) on generic pointers; the decode kernel through raw PTX on 32-bit
// shared-memory addresses (mbarrier slots by byte offset in its window).
//
// Why the poll loop is C++, not a branch inside the asm: each thread polls on its
// own, so the threads of a warp may see the phase complete at different polls; a loop
// the compiler sees lets it know the warp can diverge there (an asm-internal loop
// hides that divergence from it).
#pragma once

#include <cstdint>
#include <cuda/ptx>

#include "src/cuda/ptx/arch.cuh"

namespace flashattn::cuda::ptx {

// ---- generic pointers (libcu++ ::cuda::ptx; init/arrive are called from there) ----

// Blocks until the phase of the given parity has completed. The caller's next
// instruction decides whether the warp must reconverge (wgmma's .sync.aligned forms
// are issued by every thread of the warpgroup after this wait returns in all of them).
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* barrier, std::uint32_t parity) {
#if FLASHATTN_SM90_DEVICE_CODE
  while (!::cuda::ptx::mbarrier_try_wait_parity(barrier, parity)) {
  }
#endif
}

// Whether the phase of the given parity has completed, without waiting (mbarrier.test_wait:
// never suspends the thread, so a thread with other work can poll between its tasks).
// volatile: each call must probe again (libcu++'s form is not volatile).
__device__ __forceinline__ bool mbarrier_test_wait(std::uint64_t* barrier, std::uint32_t parity) {
  std::uint32_t done = 1;
#if FLASHATTN_SM90_DEVICE_CODE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(static_cast<std::uint32_t>(__cvta_generic_to_shared(barrier))), "r"(parity)
      : "memory");
#endif
  return done != 0;
}

// Whether the phase of the given parity has completed, waiting at most about
// `suspend_nanoseconds` for it (mbarrier.try_wait's suspendTimeHint: the thread sleeps
// until the phase completes or the hint expires): a poll that costs no issue slots
// while it waits, for a thread with other work to check between polls.
__device__ __forceinline__ bool mbarrier_try_wait_for(std::uint64_t* barrier, std::uint32_t parity,
                                                      std::uint32_t suspend_nanoseconds) {
  std::uint32_t done = 1;
#if FLASHATTN_SM90_DEVICE_CODE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2, %3;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(static_cast<std::uint32_t>(__cvta_generic_to_shared(barrier))), "r"(parity), "r"(suspend_nanoseconds)
      : "memory");
#endif
  return done != 0;
}

// ---- 32-bit shared-memory addresses (raw PTX; below sm_90 they compile to nothing) ----

inline constexpr std::uint32_t kMbarrierBytes = 8;  // one mbarrier: a .b64 in shared memory, 8-byte aligned

// The address of barrier `index` of an array of them starting at `first`.
__device__ __forceinline__ std::uint32_t mbarrier_at(std::uint32_t first, int index) {
  return first + kMbarrierBytes * index;
}

__device__ __forceinline__ void mbarrier_init(std::uint32_t barrier, std::uint32_t count) {
#if FLASHATTN_SM90_DEVICE_CODE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(count) : "memory");
#endif
}

// Makes the initialised barriers visible to the async proxy (and the cluster).
__device__ __forceinline__ void fence_mbarrier_init() {
#if FLASHATTN_SM90_DEVICE_CODE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival, and `bytes` more transaction bytes the current phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint32_t barrier, std::uint32_t bytes) {
#if FLASHATTN_SM90_DEVICE_CODE
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void mbarrier_arrive(std::uint32_t barrier) {
#if FLASHATTN_SM90_DEVICE_CODE
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
#endif
}

// Whether the phase of the given parity has completed (acquire: the bytes the phase
// counted, and what the arriving threads wrote before arriving, are visible).
__device__ __forceinline__ bool mbarrier_try_wait(std::uint32_t barrier, std::uint32_t parity) {
  std::uint32_t done = 1;
#if FLASHATTN_SM90_DEVICE_CODE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(barrier), "r"(parity)
      : "memory");
#endif
  return done != 0;
}

// Blocks until the phase of the given parity has completed and returns with the
// calling warp's threads converged: what follows in the decode kernel (mma.sync,
// ldmatrix, bar.sync) needs the whole warp together.
__device__ __forceinline__ void mbarrier_wait_converged(std::uint32_t barrier, std::uint32_t parity) {
  while (!mbarrier_try_wait(barrier, parity)) {
  }
  __syncwarp();
}

}  // namespace flashattn::cuda::ptx
