// src/cuda/bwd/tile_config.hpp — tile sizes of the backward kernels, per head dim.
//
// Performance only: results never depend on these (every product accumulates in
// fp32 in a fixed order for a given config). Host and kernels read the same table.
#pragma once

namespace flashattn::cuda::bwd {

struct TileConfig {
  int block_m;  // query rows per step of the dK/dV kernel (and per CTA of the dQ kernel)
  int block_n;  // key rows per CTA of the dK/dV kernel (and per step of the dQ kernel)
  int warps;
  int stages;   // cp.async pipeline depth of the streamed tiles (1 or 2)
  int dq_atomic_width = 1;  // fp32 dQ elements per atomic add: 1, 2 or 4 (vector atomics: sm_90)
};

// Head dims instantiated (a head dim in between runs padded to the next one).
inline constexpr int kHeadDims[] = {32, 64, 96, 128, 192, 256};

// dK and dV of a key block stay in registers for the whole CTA: 2 * block_n *
// head_dim fp32 over warps*32 threads, 64 per thread at d128 with 8 warps.
// Head dims above 128 halve block_n to keep that (and the shared memory of the
// double-buffered Q/dO tiles, ~180 KB at d256) within the H100's limits.
constexpr TileConfig tile_config(int head_dim) {
  if (head_dim <= 128) return {64, 64, 8, 2};
  return {64, 32, 8, 2};
}

}  // namespace flashattn::cuda::bwd
