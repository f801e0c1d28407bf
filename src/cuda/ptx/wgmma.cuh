// src/cuda/ptx/wgmma.cuh — warpgroup-level asynchronous tensor-core matrix multiply (sm_90a).
//
// PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions":
//   9.7.15.5.2 "wgmma.mma_async"       D (64 x N) = A (64 x 16) * B (16 x N) + D, issued by
//                                       the 4 warps of a warpgroup together; the
//                                       m64nNk16 forms live in wgmma_shapes.cuh (generated).
//   9.7.15.6   "wgmma.fence"           orders register accesses to A/D before a wgmma reads them.
//   9.7.15.7   "wgmma.commit_group"    closes the group of wgmma issued so far.
//   9.7.15.8   "wgmma.wait_group N"    waits until at most N groups are pending; only then
//                                       may D be read and the shared-memory operands be reused.
//   9.7.15.5.1 "Matrix Descriptor Format" the 64-bit shared-memory operand descriptor.
//
// Accumulator layout (9.7.15.5.1 "Register Fragments", m64nNk16, fp32 D): warp w of the
// warpgroup owns rows [16w, 16w + 16); within the warp it is the mma.sync m16n8 C
// layout repeated over the N/8 column tiles, with group = lane / 4, quad_lane = lane % 4:
//   d[4j + 0], d[4j + 1] = D[16w + group    ][8j + 2 quad_lane + {0, 1}]
//   d[4j + 2], d[4j + 3] = D[16w + group + 8][8j + 2 quad_lane + {0, 1}]
// A from registers (the "RS" form): warp w's rows [16w, 16w + 16) in the m16n8k16 A
// fragment layout (see mma_sync.cuh), so two adjacent n8 column tiles of an
// accumulator, converted to 16 bits, are the A fragment of one k16 step.
// e4m3 inputs (m64nNk32, PTX ISA 9.7.15.5.1 "Register Fragments", .e4m3/.e5m2 A; CuTe's
// GMMA::ALayout_64x32): four 32-bit registers of four e4m3 each, the lowest k in byte 0:
//   a[0] = A[16w + group    ][4 quad_lane + {0..3}]
//   a[1] = A[16w + group + 8][4 quad_lane + {0..3}]
//   a[2] = A[16w + group    ][16 + 4 quad_lane + {0..3}]
//   a[3] = A[16w + group + 8][16 + 4 quad_lane + {0..3}]
// Both FP8 operands must be K-major in shared memory (no transpose bits for 8-bit types).
//
// Only compiled into sm_90a code: callers guard with FLASHATTN_HOPPER_DEVICE_CODE (arch.cuh).
#pragma once

#include <cstdint>

#include "src/cuda/ptx/arch.cuh"
#include "src/cuda/ptx/wgmma_shapes.cuh"

namespace flashattn::cuda::ptx {

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int kPendingGroups>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPendingGroups) : "memory");
}

// Keeps the compiler from moving reads/writes of an accumulator register across an
// asynchronous wgmma that owns it (the register is "in use" until wait_group).
__device__ __forceinline__ void fence_operand(float& value) { asm volatile("" : "+f"(value)::"memory"); }
__device__ __forceinline__ void fence_operand(std::uint32_t& value) { asm volatile("" : "+r"(value)::"memory"); }
template <int kCount>
__device__ __forceinline__ void fence_operands(float (&values)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) fence_operand(values[i]);
}

// Swizzle modes of the descriptor (bits 62-63).
enum class SwizzleMode : std::uint64_t { none = 0, bytes128 = 1, bytes64 = 2, bytes32 = 3 };

// 9.7.15.5.1 "Matrix Descriptor Format":
//   bits  0-13  start address >> 4 (shared-window byte address)
//   bits 16-29  leading-dimension byte offset >> 4
//   bits 32-45  stride-dimension byte offset >> 4
//   bits 49-51  base offset (0: every swizzle pattern starts 1024-byte aligned here)
//   bits 62-63  swizzle mode
// With the 128-byte swizzle, for 16-bit elements:
//   K-major operand (rows of 64 K-elements = 128 bytes, 8-row atoms of 1024 bytes):
//     stride offset = 1024 (next 8 rows); leading offset unused (1). A k16 step inside
//     the 128-byte row advances the start address by 32 bytes; the hardware applies
//     the XOR of the swizzle to the final address, so this stays valid.
//   MN-major operand (rows of 64 MN-elements = 128 bytes, one row per K index):
//     stride offset = 1024 (next 8 K rows); leading offset = the byte distance to the
//     next 64-element panel along MN.
__device__ __forceinline__ std::uint64_t make_smem_descriptor(std::uint32_t shared_byte_address,
                                                              std::uint32_t leading_byte_offset,
                                                              std::uint32_t stride_byte_offset, SwizzleMode swizzle) {
  std::uint64_t descriptor = 0;
  descriptor |= static_cast<std::uint64_t>((shared_byte_address & 0x3FFFF) >> 4);
  descriptor |= static_cast<std::uint64_t>((leading_byte_offset & 0x3FFFF) >> 4) << 16;
  descriptor |= static_cast<std::uint64_t>((stride_byte_offset & 0x3FFFF) >> 4) << 32;
  descriptor |= static_cast<std::uint64_t>(swizzle) << 62;
  return descriptor;
}

}  // namespace flashattn::cuda::ptx
