// src/cuda/ptx/mma_type.cuh — the input type of a tensor-core instruction, the type
// parameter of every MMA wrapper (mma_sync.cuh, wgmma_shapes.cuh): the PTX type of the
// A and B operands (".f16" / ".bf16" in mma.sync.m16n8k16 and wgmma.mma_async m64nNk16;
// both accumulate in fp32). An enum rather than a bool so that a new input type (FP8
// e4m3/e5m2: wgmma m64nNk32 only, PTX ISA 9.7.15.5) is one more enumerator and one more
// generated wrapper, not a second flag. Numeric<T>::kMmaInput (common/numeric.cuh)
// gives the value for an element type.
#pragma once

namespace flashattn::cuda::ptx {

enum class MmaInput { f16, bf16, e4m3 };  // e4m3: wgmma m64nNk32 only (wgmma_ss_e4m3 / wgmma_rs_e4m3)

}  // namespace flashattn::cuda::ptx
