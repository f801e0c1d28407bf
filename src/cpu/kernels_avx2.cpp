// src/cpu/kernels_avx2.cpp — the TileKernels table for avx2 (compile flags: -mavx2 -mfma -mf16c;
// see src/cpu/CMakeLists.txt).
#if defined(__x86_64__) || defined(_M_X64)
#define FLASHATTN_CPU_VECTOR_BYTES 32
#include "src/cpu/tile_kernels.hpp"

namespace flashattn::cpu {

const TileKernels& tile_kernels_avx2() {
  static constexpr TileKernels kTable = make_table("avx2");
  return kTable;
}

}  // namespace flashattn::cpu
#endif
