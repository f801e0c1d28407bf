// src/cuda/ptx/mma_sync.cuh — warp-level tensor-core matrix multiply-accumulate.
//
// PTX ISA, "Warp Level Matrix Multiply-Accumulate Instructions" > "mma"
// (mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32), sm_80 and newer.
// D (16x8, f32) = A (16x16, row-major) * B (16x8, column-major) + C (16x8, f32).
//
// Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating
// point type"), with group = lane / 4 and quad_lane = lane % 4:
//   A: 4 x .b32, each a pair of 16-bit elements (low half = lower column)
//      a[0] = A[group    ][2*quad_lane + {0,1}]
//      a[1] = A[group + 8][2*quad_lane + {0,1}]
//      a[2] = A[group    ][2*quad_lane + 8 + {0,1}]
//      a[3] = A[group + 8][2*quad_lane + 8 + {0,1}]
//   B: 2 x .b32
//      b[0] = B[2*quad_lane + {0,1}    ][group]
//      b[1] = B[2*quad_lane + 8 + {0,1}][group]
//   C, D: 4 x f32
//      c[0], c[1] = C[group    ][2*quad_lane + {0,1}]
//      c[2], c[3] = C[group + 8][2*quad_lane + {0,1}]
// Consequence used by attention kernels: the C fragments of two n8 tiles covering
// columns [0,8) and [8,16) hold exactly the A fragment of a 16x16 tile once each
// pair is converted to 16 bits: a[0]=c0[0,1], a[1]=c0[2,3], a[2]=c1[0,1], a[3]=c1[2,3].
#pragma once

#include <cstdint>

#include "src/cuda/ptx/mma_type.cuh"

namespace flashattn::cuda::ptx {

// d = a * b + c, inputs float16.
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const std::uint32_t (&a)[4],
                                                 const std::uint32_t (&b)[2], const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}

// d = a * b + c, inputs bfloat16.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                                  const std::uint32_t (&b)[2], const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}

// acc += a * b, the instruction chosen at compile time by the input type.
template <MmaInput kInput>
__device__ __forceinline__ void mma_m16n8k16(float (&acc)[4], const std::uint32_t (&a)[4],
                                             const std::uint32_t (&b)[2]) {
  static_assert(kInput == MmaInput::f16 || kInput == MmaInput::bf16, "mma.sync m16n8k16: f16 or bf16 inputs");
  if constexpr (kInput == MmaInput::bf16) {
    mma_m16n8k16_bf16(acc, a, b, acc);
  } else {
    mma_m16n8k16_f16(acc, a, b, acc);
  }
}

}  // namespace flashattn::cuda::ptx
