// src/cpu/kernels_baseline.cpp — the TileKernels table for baseline (compile flags: none: the compiler's default target;
// see src/cpu/CMakeLists.txt).
#define FLASHATTN_CPU_VECTOR_BYTES 16
#include "src/cpu/tile_kernels.hpp"

namespace flashattn::cpu {

const TileKernels& tile_kernels_baseline() {
  static constexpr TileKernels kTable = make_table("baseline");
  return kTable;
}

}  // namespace flashattn::cpu
