// src/cuda/hopper/epilogue.cuh — the epilogue role of the Hopper forward kernel
// (hopper/kernel.cuh): normalise O once, write the LSE, store O. Three ways out:
//   one tile per CTA     through the warpgroup's own Q rows in shared memory, then
//                        coalesced 16-byte stores (store_through_shared_memory);
//   persistent           straight from the accumulator, leaving shared memory to the next
//                        tile's loads (store_from_registers);
//   tile overlap         staged (stmatrix) in the tile's Q buffer for a TMA store that a
//                        producer lane issues while the consumers run the next tile
//                        (Epilogue::stage on the consumers, OutputStorer::store on the lane).
#pragma once

#include <cstdint>
#include <cuda/ptx>

#include "flashattn/online_softmax.hpp"
#include "src/core/params.hpp"
#include "src/cuda/common/named_barriers.hpp"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/common/swizzle.cuh"
#include "src/cuda/common/tma_panels.cuh"
#include "src/cuda/hopper/cta_state.cuh"
#include "src/cuda/hopper/launch.hpp"
#include "src/cuda/hopper/tile_config.hpp"
#include "src/cuda/ptx/bulk_reduce.cuh"
#include "src/cuda/ptx/mbarrier.cuh"
#include "src/cuda/ptx/named_barrier.cuh"
#include "src/cuda/ptx/stmatrix.cuh"
#include "src/cuda/ptx/warpgroup.cuh"

namespace flashattn::cuda::hopper {

// What the epilogue needs of its tile: the tile-overlap schedule decodes the next tile
// before this one's epilogue.
template <int kBlockM>
struct OutputTile {
  std::int64_t batch, head, m0, seqlen_q;

  template <class Tile>
  __device__ __forceinline__ static OutputTile of(const Tile& tile) {
    return OutputTile{tile.batch, tile.head, tile.m0, tile.seqlen_q};
  }
  __device__ std::int64_t rows() const { return seqlen_q - m0 < kBlockM ? seqlen_q - m0 : kBlockM; }
};

// Two Q buffers: where the O staged in buffer b goes (the loader writes it with the
// tile's Q load, the storer reads it once the O is staged; with the named marks the
// storer makes it from the tile's TileRecord).
struct StoreHeader {
  std::int32_t row, head, batch_coordinate, rows;  // out's first row of the tile, its rows
};

// The consumers' side: one consumer thread's O (its accumulator fragment, unnormalised)
// and row states to out and the LSE.
template <class T, HopperTileConfig kConfig>
struct Epilogue {
  static constexpr int kHeadDim = kConfig.kernel_head_dim;
  static constexpr int kBlockM = kConfig.block_m;
  using Tile = OutputTile<kBlockM>;
  using RowStates = online_softmax::State<float>[2];
  using Accumulator = float[kHeadDim / 2];  // (64, kHeadDim) per warpgroup

  const HopperForwardParams& params;
  ConsumerThread thread;
  float inverse_keep;        // dropout's 1 / (1 - p) of kept entries; 1 without dropout
  float* maybe_lse;
  T* shared_q;               // Q buffer 0: the one-tile store's staging
  std::uint32_t q_address;   // its shared-memory address
  std::uint64_t* o_full;     // [2]: every consumer warp has staged its O in the buffer
  bool is_varlen;

  // Completes each row's sum across its quad; calls store_row(half, tile_row,
  // output_scale) with output_scale = 1 / (l (1 - p)) (dropout's scale of kept entries
  // folded in) and writes the row's LSE (of the undropped P).
  template <class StoreRow>
  __device__ __forceinline__ void finish_rows(const Tile& tile, const RowStates& row_state,
                                              StoreRow&& store_row) const {
    const AttentionParams& attention = params.attention;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      online_softmax::State<float> state = row_state[half];
      state.l += __shfl_xor_sync(0xffffffffu, state.l, 1);
      state.l += __shfl_xor_sync(0xffffffffu, state.l, 2);
      const int tile_row = thread.thread_row0 + 8 * half;
      store_row(half, tile_row, state.inverse_sum() * inverse_keep);
      if (maybe_lse != nullptr && thread.quad_lane == 0 && tile.m0 + tile_row < tile.seqlen_q)
        maybe_lse[attention.lse_offset(tile.batch, tile.head) + (tile.m0 + tile_row) * attention.lse_row_stride] =
            state.lse();
    }
  }

  // Through this warpgroup's own Q rows in shared memory, then coalesced 16-byte stores.
  // Only this warpgroup reads its 64 Q rows, so after its own barrier it may overwrite
  // them; the other consumer warpgroups are not waited for. (One tile per CTA: the next
  // Q never arrives in this buffer.)
  __device__ __forceinline__ void store_through_shared_memory(const Tile& tile, const Accumulator& o,
                                                              const RowStates& row_state) const {
    const AttentionParams& attention = params.attention;
    const int quad_lane = thread.quad_lane;
    const int epilogue_barrier = static_cast<int>(NamedBarrier::kConsumerEpilogueFirst) + thread.consumer;
    ptx::named_barrier_sync(epilogue_barrier, ptx::kWarpgroupThreads);
    unsigned char* shared_q_bytes = reinterpret_cast<unsigned char*>(shared_q);
    finish_rows(tile, row_state, [&](int half, int tile_row, float output_scale) {
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        // Column 8j + 2 quad_lane: panel j / 8, 16-byte chunk j % 8 of the row.
        const int byte_offset = panels_chunk_offset<kBlockM>(tile_row, j) + quad_lane * 4;
        *reinterpret_cast<std::uint32_t*>(shared_q_bytes + byte_offset) =
            pack_pair<T>(o[4 * j + 2 * half] * output_scale, o[4 * j + 2 * half + 1] * output_scale);
      }
    });
    ptx::named_barrier_sync(epilogue_barrier, ptx::kWarpgroupThreads);
    T* out = static_cast<T*>(attention.out) + attention.out_offset(tile.batch, tile.head) +
             tile.m0 * attention.out_row_stride;
    constexpr int kRowChunks = kHeadDim / 8;
#pragma unroll
    for (int index = thread.thread_in_warpgroup; index < ptx::kWarpgroupRows * kRowChunks;
         index += ptx::kWarpgroupThreads) {
      const int tile_row = thread.warpgroup_row0 + index / kRowChunks;
      const int chunk = index % kRowChunks;
      if (tile_row < tile.rows() && chunk * 8 < attention.head_dim) {
        const int byte_offset = panels_chunk_offset<kBlockM>(tile_row, chunk);
        *reinterpret_cast<uint4*>(out + tile_row * attention.out_row_stride + chunk * 8) =
            *reinterpret_cast<const uint4*>(shared_q_bytes + byte_offset);
      }
    }
  }

  // Straight from the accumulator: each quad writes 16 contiguous bytes of a row per
  // 8-column tile. Leaves shared memory to the next tile's loads (persistent launches).
  __device__ __forceinline__ void store_from_registers(const Tile& tile, const Accumulator& o,
                                                       const RowStates& row_state) const {
    const AttentionParams& attention = params.attention;
    const int quad_lane = thread.quad_lane;
    T* out = static_cast<T*>(attention.out) + attention.out_offset(tile.batch, tile.head) +
             tile.m0 * attention.out_row_stride;
    finish_rows(tile, row_state, [&](int half, int tile_row, float output_scale) {
      if (tile_row >= tile.rows()) return;
      T* out_row = out + tile_row * attention.out_row_stride;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        const int column = 8 * j + 2 * quad_lane;
        if (column < attention.head_dim)
          *reinterpret_cast<std::uint32_t*>(out_row + column) =
              pack_pair<T>(o[4 * j + 2 * half] * output_scale, o[4 * j + 2 * half + 1] * output_scale);
      }
    });
  }

  // Two Q buffers: O through this warpgroup's rows of the tile's Q buffer `q_buffer`
  // (only this warpgroup reads them, and after the barrier all its S = Q K^T are done);
  // the storer stores them with the TMA once every consumer warp has arrived on o_full,
  // while the consumers run the next tile. A varlen warpgroup whose 64 rows pass its
  // sequence's end stores from registers, row by row (the storer skips it: OutputStorer).
  __device__ __forceinline__ void stage(const Tile& tile, int q_buffer, const Accumulator& o,
                                        const RowStates& row_state) const {
    // The warpgroup's first row through a shuffle from lane 0: the same value, but one
    // the compiler knows is warp-uniform. A branch on warpgroup_row0 itself (derived from
    // threadIdx.x) made the whole tile loop divergent to ptxas, which then kept the K/V/Q
    // descriptors and the ring positions in vector registers (R2UR before every wgmma)
    // in every schedule of these kernels (bf16 d64 block_m 128 persistent: UIADD3
    // 182 -> 34, IADD3 311 -> 639; forward -5..-17% on the H200, registers epilogue too).
    const int uniform_row0 = __shfl_sync(0xffffffffu, thread.warpgroup_row0, 0);
    if (params.has_o_map && (!is_varlen || tile.m0 + uniform_row0 + ptx::kWarpgroupRows <= tile.seqlen_q)) {
      ptx::named_barrier_sync(static_cast<int>(NamedBarrier::kConsumerEpilogueFirst) + thread.consumer,
                              ptx::kWarpgroupThreads);
      float output_scale[2];
      finish_rows(tile, row_state, [&](int half, int, float scale) { output_scale[half] = scale; });
      // stmatrix x4 per two n8 column tiles: matrices (tile j, rows 0-7 | 8-15 of the
      // warp's 16), (tile j + 1, ...) are the accumulator's fragments as they are (ptx/
      // stmatrix.cuh); lane 8 i + r gives row r of matrix i. A 32-bit shared address: a
      // generic pointer kept across the loop costs the consumers registers.
      const std::uint32_t staging =
          q_address + (q_buffer == 0 ? 0u : static_cast<std::uint32_t>(kConfig.second_q_offset()));
      const int matrix = thread.lane / 8;
      const int staging_row =
          thread.warpgroup_row0 + (thread.thread_in_warpgroup / 32) * 16 + 8 * (matrix % 2) + thread.lane % 8;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; j += 2) {
        ptx::stmatrix_x4(staging + panels_chunk_offset<kBlockM>(staging_row, j + matrix / 2),
                         pack_pair<T>(o[4 * j] * output_scale[0], o[4 * j + 1] * output_scale[0]),
                         pack_pair<T>(o[4 * j + 2] * output_scale[1], o[4 * j + 3] * output_scale[1]),
                         pack_pair<T>(o[4 * j + 4] * output_scale[0], o[4 * j + 5] * output_scale[0]),
                         pack_pair<T>(o[4 * j + 6] * output_scale[1], o[4 * j + 7] * output_scale[1]));
      }
      ptx::fence_proxy_async_shared();  // the staged O visible to the TMA (async proxy)
    } else {
      store_from_registers(tile, o, row_state);
    }
    __syncwarp();
    if (thread.lane == 0) ::cuda::ptx::mbarrier_arrive(&o_full[q_buffer]);
  }
};

// The producer's side of the tile overlap: the storer lane stores the O the consumers
// staged in a Q buffer, one TMA store per consumer warpgroup's 64 rows and panel (a
// varlen warpgroup whose rows cross the sequence's end stored its rows from registers:
// the box would write into the next sequence; rows past a dense tensor's end and
// columns past head_dim the map clips).
template <class T, HopperTileConfig kConfig>
struct OutputStorer {
  static constexpr int kBlockM = kConfig.block_m;

  const HopperForwardParams& params;
  unsigned char* shared_base;           // the tiles' 1024-byte aligned start
  std::uint64_t* o_full;                // [2]
  const StoreHeader* store_headers;     // [2]: written by the loader
  bool has_named_marks;
  bool is_varlen;

  // The O of the CTA's tile number `count`, once staged, to out. With the named marks
  // the storer takes out's coordinates from its own decode of the tile (as the loader
  // its Q coordinates) and leaves the loader's header unread: racecheck sees the header
  // ordered only through mbarriers (q_full, then o_full).
  template <class Tile>
  __device__ __forceinline__ void store(int count, const Tile& tile) const {
    const AttentionParams& attention = params.attention;
    const int buffer = count & 1;
    ptx::mbarrier_wait(&o_full[buffer], (count >> 1) & 1);
    if (!params.has_o_map) return;
    const StoreHeader header =
        has_named_marks ? StoreHeader{static_cast<std::int32_t>(attention.q_start(tile.batch) + tile.m0),
                                      static_cast<std::int32_t>(tile.head),
                                      is_varlen ? 0 : static_cast<std::int32_t>(tile.batch),
                                      static_cast<std::int32_t>(tile.row_end - tile.m0)}
                        : store_headers[buffer];
    T* staged = reinterpret_cast<T*>(shared_base + (buffer == 0 ? 0 : kConfig.second_q_offset()));
    for (int band = 0; band < kConfig.consumer_warpgroups(); ++band) {
      const int band_rows = header.rows - band * ptx::kWarpgroupRows;
      if (band_rows <= 0 || (is_varlen && band_rows < ptx::kWarpgroupRows)) break;
      store_panels<kConfig.panels(), kBlockM>(staged + band * ptx::kWarpgroupRows * kPanelColumns, &params.o_map,
                                              header.row + band * ptx::kWarpgroupRows, header.head,
                                              header.batch_coordinate, static_cast<int>(attention.head_dim));
    }
    ptx::bulk_commit_group();
  }
};

}  // namespace flashattn::cuda::hopper
