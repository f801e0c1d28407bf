// src/cuda/ptx/ldmatrix.cuh — warp-collective loads of 8x8 16-bit matrices from
// shared memory into mma fragments.
//
// PTX ISA, "Warp Level Matrix Multiply-Accumulate Instructions" > "ldmatrix"
// (ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16), sm_75 and newer.
//
// Addresses: for .xN, lanes 8*i .. 8*i+7 give the shared-memory addresses of the
// 8 rows (16 bytes each, 16-byte aligned) of matrix i; for .x1 lanes 0-7 and for
// .x2 lanes 0-15 are read (the other lanes' addresses are ignored but must be
// valid-looking; pass any row address).
// Result: register i of every lane holds two consecutive 16-bit elements of
// matrix i: row lane / 4, columns 2*(lane % 4) + {0,1}. With .trans the matrix is
// transposed on the way: register i holds column lane / 4, rows 2*(lane % 4) + {0,1}.
// Without .trans the result is the mma A fragment (row-major rows) or the B
// fragment of a matrix stored N-major (e.g. K for S = Q K^T); with .trans it is the
// B fragment of a matrix stored K-major (e.g. V for O = P V).
// Bank conflicts: the 8 row addresses of one matrix are served together, so they
// must fall into 8 distinct 16-byte bank groups — see common/swizzle.cuh.
#pragma once

#include <cstdint>

namespace flashattn::cuda::ptx {

// Shared-memory address of a generic pointer into shared memory (state space .shared::cta).
__device__ __forceinline__ std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void ldmatrix_x1(std::uint32_t& r0, std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r0) : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x2(std::uint32_t& r0, std::uint32_t& r1, std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t& r0, std::uint32_t& r1, std::uint32_t& r2,
                                            std::uint32_t& r3, std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x1_trans(std::uint32_t& r0, std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r0) : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x2_trans(std::uint32_t& r0, std::uint32_t& r1, std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t& r0, std::uint32_t& r1, std::uint32_t& r2,
                                                  std::uint32_t& r3, std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(address));
}

}  // namespace flashattn::cuda::ptx
