// src/cuda/decode/launch_decode_fp8.cuh — the host side of run_decode_fp8<T, kHeadDim>
// (an FP8 cache, kernel_mma_fp8.cuh), included by its instantiation files only.
#pragma once

#include "src/cuda/decode/kernel_mma_fp8.cuh"
#include "src/cuda/decode/launch.hpp"
#include "src/cuda/decode/launch_decode.cuh"

namespace flashattn::cuda::decode {

template <class T, int kHeadDim>
bool run_decode_fp8(const KVCacheParams& params, cudaStream_t stream) {
  using Config = MmaFp8DecodeConfig<kHeadDim>;
  static_assert(Config::kRows == kFp8RowsPerCta && Config::kTileN == kFp8TileKeys && Config::kMinBlocksPerSm == fp8_ctas_per_sm(kHeadDim),
                "the split heuristic's view of the kernel (launch.hpp)");
  return launch_decode_config<T, Config>(&mma_fp8_decode_kernel<T, Config>, params, stream, true);
}

}  // namespace flashattn::cuda::decode
