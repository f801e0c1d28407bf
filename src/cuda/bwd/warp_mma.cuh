// src/cuda/bwd/warp_mma.cuh — warp-level matrix products for the backward pass,
// built on the PTX wrappers in src/cuda/ptx/.
//
// The backward pass multiplies operands stored in shared memory in all four
// orientations (S = Q K^T, dV = P^T dO, dQ = dS K, ...), so the A and B fragment
// loads come in a plain and a transposed form. With lane = 4*g + t, ldmatrix
// lane l receives row l/4, columns 2(l%4)..+1 of each 8x8 matrix (.trans: the
// transpose), which is the mma A/B fragment layout documented in ptx/mma_sync.cuh.
// Every warp of the backward kernels owns one 16-row tile of each product.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "src/cuda/ptx/ldmatrix.cuh"
#include "src/cuda/ptx/mma_sync.cuh"

namespace flashattn::cuda::bwd {

// Operand fragments from shared memory; `ld` is the row stride (elements) of the
// stored matrix. Each 8x8 matrix is 8 rows of 16 bytes.
//
// A (16x16 at [m0, k0]) stored as rows m, k contiguous (Q in S = Q K^T).
// Matrices: 0 = rows 0-7/k 0-7, 1 = rows 8-15/k 0-7, 2 = rows 0-7/k 8-15, 3 = rows 8-15/k 8-15.
template <class Element>
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const Element* base, int ld, int m0, int k0, int lane) {
  const int i = lane / 8, r = lane % 8;
  ptx::ldmatrix_x4(a[0], a[1], a[2], a[3], ptx::shared_address(base + (m0 + r + (i % 2) * 8) * ld + k0 + (i / 2) * 8));
}
// A (16x16 at [m0, k0]) of A = X^T where X is stored as rows k, m contiguous (P in dV = P^T dO).
template <class Element>
__device__ __forceinline__ void load_a_transposed(std::uint32_t (&a)[4], const Element* base, int ld, int m0, int k0,
                                                  int lane) {
  const int i = lane / 8, r = lane % 8;
  ptx::ldmatrix_x4_trans(a[0], a[1], a[2], a[3],
                         ptx::shared_address(base + (k0 + r + (i / 2) * 8) * ld + m0 + (i % 2) * 8));
}
// B (16x8 at [k0, n0]) of B = X^T where X is stored as rows n, k contiguous (K in S = Q K^T).
template <class Element>
__device__ __forceinline__ void load_b(std::uint32_t (&b)[2], const Element* base, int ld, int n0, int k0, int lane) {
  const int i = (lane % 16) / 8, r = lane % 8;
  ptx::ldmatrix_x2(b[0], b[1], ptx::shared_address(base + (n0 + r) * ld + k0 + i * 8));
}
// B (16x8 at [k0, n0]) stored as rows k, n contiguous (dO in dV = P^T dO).
template <class Element>
__device__ __forceinline__ void load_b_transposed(std::uint32_t (&b)[2], const Element* base, int ld, int n0, int k0,
                                                  int lane) {
  const int i = (lane % 16) / 8, r = lane % 8;
  ptx::ldmatrix_x2_trans(b[0], b[1], ptx::shared_address(base + (k0 + r + i * 8) * ld + n0));
}

template <class Element>
__device__ __forceinline__ void mma(float (&c)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<Element, __half>) {
    ptx::mma_m16n8k16_f16(c, a, b, c);
  } else {
    ptx::mma_m16n8k16_bf16(c, a, b, c);
  }
}

// One warp: acc (16 x 8*kNTiles at [m0, n0]) += A (16 x kDepth) B (kDepth x 8*kNTiles).
// kIsATransposed / kIsBTransposed pick each operand's storage (see above).
template <int kNTiles, int kDepth, bool kIsATransposed, bool kIsBTransposed, class Element>
__device__ __forceinline__ void warp_gemm(float (&acc)[kNTiles][4], const Element* a_base, int lda, int m0,
                                          const Element* b_base, int ldb, int n0, int lane) {
#pragma unroll
  for (int k0 = 0; k0 < kDepth; k0 += 16) {
    std::uint32_t a[4];
    if constexpr (kIsATransposed) {
      load_a_transposed(a, a_base, lda, m0, k0, lane);
    } else {
      load_a(a, a_base, lda, m0, k0, lane);
    }
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      std::uint32_t b[2];
      if constexpr (kIsBTransposed) {
        load_b_transposed(b, b_base, ldb, n0 + 8 * j, k0, lane);
      } else {
        load_b(b, b_base, ldb, n0 + 8 * j, k0, lane);
      }
      mma<Element>(acc[j], a, b);
    }
  }
}

template <int kNTiles>
__device__ __forceinline__ void zero(float (&acc)[kNTiles][4]) {
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
}

}  // namespace flashattn::cuda::bwd
