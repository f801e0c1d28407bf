// src/cuda/hopper/mainloop.cuh — the mainloop role of the Hopper forward kernel
// (hopper/kernel.cuh), its producer side: the loader lane's TMA loads of a tile's K and V
// blocks into the kernel's shared-memory rings (kStages stages each, a "full" mbarrier per
// stage that the TMA completes, an "empty" one that every consumer warp arrives on).
//
// The consumers' side (S = Q K^T, the variant hooks, the online softmax, O += P V) is
// still the kernel's lambdas: as a struct of the same methods (branch
// s19-fwd-roles-mainloop-wip) the bf16 d128 kernels kept their PTX byte for byte but the
// d256 ones moved (hopper/TUNING.md, "Role files").
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cuda/ptx>

#include "src/cuda/common/numeric.cuh"
#include "src/cuda/common/swizzle.cuh"
#include "src/cuda/common/tma_panels.cuh"
#include "src/cuda/hopper/cta_state.cuh"
#include "src/cuda/hopper/tile_scheduler.cuh"
#include "src/cuda/ptx/mbarrier.cuh"
#include "src/cuda/ptx/named_barrier.cuh"
#include "src/cuda/ptx/warpgroup.cuh"
#include "src/cuda/ptx/wgmma.cuh"
#include "src/cuda/hopper/tile_config.hpp"

namespace flashattn::cuda::hopper {

// One tile's K/V loads, issued by the loader lane in the consumers' order (K_0, then K_j
// before V_(j-1), then the last V). KeyBlockOf: the kernel's key_block(tile, index). The
// members are references to the kernel's own values, as the lambda this replaced captured
// them (the kernel's code is pinned: scripts/sass_fingerprint.py).
template <class Kernel, class KeyBlockOf>
struct MainloopLoader {
  using T = typename Kernel::Element;
  static constexpr int kHeadDim = Kernel::kHeadDim;
  static constexpr int kBlockN = Kernel::kBlockN;
  static constexpr int kStages = Kernel::kConfig.stages;
  static constexpr int kPanels = Kernel::kConfig.panels();
  static constexpr int kKVBytes = Kernel::kConfig.kv_tile_bytes();

  int& block_base;                     // K/V blocks loaded for earlier tiles: the rings' position
  const std::int64_t& k_start;         // the tile's sequence's first key row
  const KeyBlockOf& key_block;
  const Tile& tile;
  const std::int32_t& head_kv;
  const std::int32_t& batch_coordinate;  // 0 for varlen (one batch entry of packed rows)

  // Block `index` of the tile's visit order into its stage of a ring; waits until the
  // consumers have released that stage's previous block.
  __device__ void load_block(const CUtensorMap* tensor_map, T* ring, std::uint64_t* full, std::uint64_t* empty,
                             int index) const {
    const int position = block_base + index;
    const int stage = position % kStages;
    if (position >= kStages) ptx::mbarrier_wait(&empty[stage], ((position / kStages) - 1) & 1);
    ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                           ::cuda::ptx::space_shared, &full[stage], kKVBytes);
    const std::int32_t row = static_cast<std::int32_t>(k_start + key_block(tile, index).n0);
    load_panels<kPanels, kBlockN>(ring + stage * kBlockN * kHeadDim, tensor_map, row, head_kv, batch_coordinate,
                                  &full[stage]);
  }
};

// The consumers' GEMMs of one key block, issued and committed (wgmma), not waited for:
// S = Q K^T with both operands in shared memory (K-major), O += P V with P from registers
// and V read MN-major (the transpose-B bit). The members are references to the kernel's
// values, as the lambdas this replaced captured them.
template <class Kernel>
struct WarpgroupGemms {
  using T = typename Kernel::Element;
  static constexpr HopperTileConfig kConfig = Kernel::kConfig;
  static constexpr int kHeadDim = Kernel::kHeadDim;
  static constexpr int kBlockM = Kernel::kBlockM;
  static constexpr int kBlockN = Kernel::kBlockN;
  static constexpr int kStages = kConfig.stages;
  static constexpr int kKVBytes = kConfig.kv_tile_bytes();
  static constexpr ptx::MmaInput kInput = Numeric<T>::kMmaInput;

  const bool& has_two_q_buffers;
  // Descriptors (wgmma.cuh): this warpgroup's rows of Q buffer 0, K and V stage 0.
  const std::uint64_t& q_descriptor;
  const std::uint64_t& k_descriptor;
  const std::uint64_t& v_descriptor;
  int& block_base;  // the rings' position
  int& tile_count;  // the CTA's tiles so far: Q's buffer
  float (&s)[kBlockN / 2];              // (64, kBlockN) per warpgroup
  float (&o)[kHeadDim / 2];             // (64, kHeadDim) per warpgroup
  std::uint32_t (&p)[kBlockN / 16][4];  // (64, kBlockN) per warpgroup as wgmma A fragments

  __device__ int q_buffer_of(int count) const { return has_two_q_buffers ? count & 1 : 0; }
  // This warpgroup's rows of Q buffer `buffer` (the second one kConfig.second_q_offset()
  // bytes further: under 2^18, the start-address field's reach).
  __device__ std::uint64_t q_descriptor_of(int buffer) const {
    return q_descriptor + (buffer == 0 ? 0 : static_cast<std::uint64_t>(kConfig.second_q_offset() >> 4));
  }
  // Descriptor increments are byte offsets >> 4 in the start-address field.
  __device__ static int k_step_offset(int kk, int rows) { return ((kk / 4) * rows * kSwizzleRowBytes + (kk % 4) * 32) >> 4; }
  // S = Q K^T for block `index` (issued and committed, not waited for).
  __device__ void issue_qk(int index) const {
    const std::uint64_t stage_k_descriptor = k_descriptor + ((((block_base + index) % kStages) * kKVBytes) >> 4);
    const std::uint64_t tile_q_descriptor = q_descriptor_of(q_buffer_of(tile_count));
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      ptx::wgmma_ss<kBlockN, kInput, 0>(s, tile_q_descriptor + k_step_offset(kk, kBlockM),
                                         stage_k_descriptor + k_step_offset(kk, kBlockN), kk > 0 ? 1 : 0);
    }
    ptx::wgmma_commit_group();
  }
  // O += P V for block `index`: P's k16 steps are keys [16 kp, 16 kp + 16) = rows 16 kp..
  // of V, two 8-row atoms of 1024 bytes each.
  __device__ void issue_pv(int index) const {
    const std::uint64_t stage_v_descriptor = v_descriptor + ((((block_base + index) % kStages) * kKVBytes) >> 4);
    ptx::fence_operands(o);
    ptx::wgmma_fence();
#pragma unroll
    for (int kp = 0; kp < kBlockN / 16; ++kp) {
      ptx::wgmma_rs<kHeadDim, kInput, 1>(o, p[kp], stage_v_descriptor + ((kp * 16 * kSwizzleRowBytes) >> 4), 1);
    }
    ptx::wgmma_commit_group();
  }
};

// Ping-pong (FA3 section 3.1): the two consumer warpgroups take turns issuing their
// GEMMs, so one's softmax runs while the other's GEMMs occupy the tensor cores. Turn
// barrier of warpgroup c: its 128 threads sync, the other's 128 arrive. Consumer 1
// opens consumer 0's first turn and skips its own last hand-over, so every barrier
// completes exactly as often as it is waited on.
template <class Kernel, bool kIsPingPong = Kernel::kConfig.is_ping_pong>
struct PingPongTurns {
  const int& my_turn;
  int& round;  // GEMM rounds of this tile so far
  const int& consumer;
  const int& gemm_rounds;  // per tile: block 0's QK, then (QK, PV) pairs, then the last PV
  const int& other_turn;

  __device__ void begin_turn() const { ptx::named_barrier_sync(my_turn, 2 * ptx::kWarpgroupThreads); }
  __device__ void end_turn() const {
    ++round;
    if (consumer == 0 || round < gemm_rounds) ptx::named_barrier_arrive(other_turn, 2 * ptx::kWarpgroupThreads);
  }
};
// Without ping-pong: no turns, and no references to the turn state (the lambdas this
// replaced captured none there; holding them moved the d256 kernels' code, PTX compared).
template <class Kernel>
struct PingPongTurns<Kernel, false> {
  __device__ void begin_turn() const {}
  __device__ void end_turn() const {}
};

template <class Kernel>
__device__ __forceinline__ PingPongTurns<Kernel> ping_pong_turns(const int& my_turn, int& round, const int& consumer,
                                                                 const int& gemm_rounds, const int& other_turn) {
  if constexpr (Kernel::kConfig.is_ping_pong) {
    return {my_turn, round, consumer, gemm_rounds, other_turn};
  } else {
    return {};
  }
}

}  // namespace flashattn::cuda::hopper
