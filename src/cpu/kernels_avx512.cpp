// src/cpu/kernels_avx512.cpp — the TileKernels table for avx512 (compile flags: -mavx512f -mavx512vl -mavx2 -mfma -mf16c;
// see src/cpu/CMakeLists.txt).
#if defined(__x86_64__) || defined(_M_X64)
#define FLASHATTN_CPU_VECTOR_BYTES 64
#include "src/cpu/tile_kernels.hpp"

namespace flashattn::cpu {

const TileKernels& tile_kernels_avx512() {
  static constexpr TileKernels kTable = make_table("avx512");
  return kTable;
}

}  // namespace flashattn::cpu
#endif
