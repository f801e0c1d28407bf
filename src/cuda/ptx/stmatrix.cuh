// src/cuda/ptx/stmatrix.cuh — warp-collective stores of 8x8 16-bit matrices to shared
// memory (the inverse of ldmatrix.cuh's loads without .trans).
//
// PTX ISA, "Warp Level Matrix Multiply-Accumulate Instructions" > "stmatrix"
// (stmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16), sm_90 and newer.
//
// Addresses: for .x4, lanes 8*i .. 8*i+7 give the shared-memory addresses of the 8 rows
// (16 bytes each, 16-byte aligned) of matrix i. Data: register i of every lane holds two
// consecutive 16-bit elements of matrix i, row lane / 4, columns 2*(lane % 4) + {0,1}:
// bytes 4*(lane % 4) .. 4*(lane % 4) + 3 of that row. The 8 rows of one matrix are
// written together: for no bank conflict they must fall into 8 distinct 16-byte bank
// groups. Callers compile it into sm_90 code only.
#pragma once

#include <cstdint>

namespace flashattn::cuda::ptx {

// .x2: lanes 0-15 give the row addresses of matrices 0 and 1 (the others are ignored).
__device__ __forceinline__ void stmatrix_x2(std::uint32_t address, std::uint32_t r0, std::uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};\n" ::"r"(address), "r"(r0), "r"(r1)
               : "memory");
}

__device__ __forceinline__ void stmatrix_x4(std::uint32_t address, std::uint32_t r0, std::uint32_t r1,
                                            std::uint32_t r2, std::uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

}  // namespace flashattn::cuda::ptx
