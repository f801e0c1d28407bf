// src/cuda/decode/kernel_tma.cuh — the sm_90 split-KV decode kernel: K/V tiles move by
// TMA tensor copies into an mbarrier ring, fed by one producer warp.
//
// Same algorithm and work decomposition as kernel_mma.cuh (one CTA = query block x split
// x kv head x sequence; 16 packed GQA rows; 64-key tiles, warp w takes keys 16w..16w+15;
// mma.sync S = Q K^T and O += P V; per-warp online softmax merged at the end; one split,
// workspace partials or the in-cluster merge of two splits). What changes is the
// hardware mapping, for the costs gpu_decode.md measured:
//   * streaming: the cp.async kernel's 128 threads issue 16 copies of 16 bytes per tile
//     and meet at a __syncthreads per tile; here one producer warp issues a few tensor
//     copies per tile (a (64 columns, box_rows keys) box per request, 128-byte swizzle)
//     into a kStages ring whose stages the consumer warps release one by one
//     (full/empty mbarriers): no consumer thread holds copy addresses or waits for the
//     others between tiles;
//   * the fixed cost of a step (cache_seqlens -> key range -> page -> first tile): the
//     barriers are set up before griddepcontrol.wait; optionally (prefetch_tiles > 0, a
//     tuning knob) the producer reads the lengths and page table speculatively and
//     prefetches its first tiles into L2 before the wait. Measured (H100, 2026-11-25):
//     the prefetch costs more than it hides at KV 1k, so the library runs without it.
//   * the issue rate: with one CTA per SM each scheduler has one consumer warp, so every
//     instruction of the tile loop shows (ncu, 2026-11-25: 458 per tile and warp before,
//     197 after): whole tiles skip the element mask, the accumulator is rescaled only
//     when a row max moved, ldmatrix addresses are per-lane constants, exp2 is the SFU's.
// Where it runs: the library's choice wherever it can (kernel_choice.hpp: sm_90 code, no
// cache_batch_idx, strides a tensor map encodes); FLASHATTN_DECODE_KERNEL forces either
// kernel (bench/results/gpu_decode.md has the measurements).
// Tensor maps (host, make_decode_tensor_maps): 4-D (head_dim, rows, kv heads, groups)
// over each cache — contiguous: rows = capacity, groups = sequences, box 64 keys;
// paged: rows = page_size, groups = pages, box gcd(page_size, 64) keys, so a box never
// crosses a page when the tiles start at a multiple of the box: the CTA's tile grid
// starts at its first key rounded down to that (keys before the range are masked).
// Columns past head_dim and rows past the cache are zero-filled by the TMA; V rows of a
// tile outside the key range (they hold other keys' values, or anything) are zeroed by
// the warp that reads them, since P = 0 there and 0 * NaN is NaN; K's are masked.
#pragma once

#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "flashattn/score.hpp"
#include "src/core/kvcache_params.hpp"
#include "src/cuda/common/named_barriers.hpp"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/common/sfu_math.cuh"
#include "src/cuda/decode/kernel_mma.cuh"
#include "src/cuda/decode/launch_kernel.cuh"
#include "src/cuda/decode/rotary.cuh"
#include "src/cuda/decode/tma.cuh"
#include "src/cuda/decode/tma_config.hpp"
#include "src/cuda/ptx/arch.cuh"
#include "src/cuda/ptx/cp_async.cuh"
#include "src/cuda/ptx/ldmatrix.cuh"
#include "src/cuda/ptx/mbarrier.cuh"
#include "src/cuda/ptx/mma_sync.cuh"
#include "src/cuda/ptx/named_barrier.cuh"

namespace flashattn::cuda::decode {

// The K and V tensor maps of one call, the keys per box (64 / box_rows requests per
// 64-column panel of a tile), and the tiles prefetched into L2 before the PDL wait (-1:
// as many as the ring has stages).
struct DecodeTensorMaps {
  CUtensorMap k;
  CUtensorMap v;
  int box_rows;
  int prefetch_tiles;
};

template <class T, class Config>
__global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocksPerSm)
    tma_decode_kernel(const __grid_constant__ KVCacheParams params, const __grid_constant__ DecodeTensorMaps maps,
                      bool is_alibi_affine) {
#if FLASHATTN_SM90_DEVICE_CODE
  using Numeric = Numeric<T>;
  constexpr int kRows = Config::kRows, kTileN = Config::kTileN, kStages = Config::kStages, kConsumerThreads = Config::kConsumerThreads;
  constexpr int kChunks = Config::kChunks, kHeadDim = Config::kHeadDim, kConsumerWarps = Config::kConsumerWarps;
  constexpr int kPanels = Config::kPanels, kPanelColumns = Config::kPanelColumns;
  extern __shared__ __align__(128) unsigned char shared_storage[];
  // TMA destinations with the 128-byte swizzle: 1024-byte aligned (kSharedBytes has the slack).
  const std::uint32_t raw_address = ptx::shared_address(shared_storage);
  unsigned char* shared = shared_storage + (Config::kAlignment - raw_address % Config::kAlignment) % Config::kAlignment;
  T* kv_ring = reinterpret_cast<T*>(shared);                         // [stage][K|V][panel] (kTileN, 64), swizzled
  T* q_tile = reinterpret_cast<T*>(shared + Config::kRingBytes);     // (kRows, kHeadDim), padded rows
  const std::uint32_t ring_address = ptx::shared_address(kv_ring);
  const std::uint32_t full_barriers = ptx::shared_address(shared + Config::kBarrierOffset);  // [kStages]: stage landed
  const std::uint32_t empty_barriers = ptx::mbarrier_at(full_barriers, kStages);            // [kStages]: stage read

  const AttentionParams& a = params.attention;
  const int num_splits = params.num_splits;
  const int split = static_cast<int>(blockIdx.x) % num_splits;
  const bool is_cluster_merge = num_splits > 1 && cooperative_groups::this_cluster().num_blocks() == static_cast<unsigned>(num_splits);
  const std::int64_t query_block = blockIdx.x / num_splits;
  const std::int64_t h_kv = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int group_row = lane / 4, quad_lane = lane % 4;
  const bool is_producer = warp == kConsumerWarps;

  const std::int64_t group = a.group_size;
  const int group32 = static_cast<int>(group);  // 32-bit divisions: packed rows < 2^31 (validate_kvcache)
  const std::int64_t packed_rows = a.seqlen_q * group;
  const std::int64_t row_begin = query_block * kRows;
  const std::int64_t row_end = row_begin + kRows < packed_rows ? row_begin + kRows : packed_rows;
  const std::int64_t position_begin = row_begin / group, position_end = (row_end - 1) / group + 1;
  const bool is_paged = params.is_paged();
  const std::int32_t* page_table = params.maybe_block_table + b * params.block_table_stride;
  const std::int64_t page_size = params.page_size;
  const int box_rows = maps.box_rows;            // divides 64, and page_size when paged
  const int boxes = kTileN / box_rows;           // requests per panel of a tile: producer lanes 0..boxes-1
  const int group_of_sequence = static_cast<int>(b);  // contiguous: the cache's sequence coordinate

  // The keys this CTA visits, [begin, end): the rows' mask columns within the split's
  // whole tiles. Its tiles start at tile_begin <= begin, the cache position
  // leftpad + tile_begin rounded down to a multiple of box_rows (paged; a box stays in
  // its page), and cover [tile_begin, end).
  struct KeyRange {
    std::int64_t begin, end, tile_begin, first_position;  // first_position: cache position of key tile_begin
    int num_tiles;
  };
  const auto key_range = [&](const MaskRule& mask, std::int64_t leftpad) {
    const MaskRule::ColumnRange seen = mask.columns_of_rows(position_begin, position_end);
    const std::int64_t key_blocks = (mask.seqlen_k + kTileN - 1) / kTileN;
    const std::int64_t blocks_per_split = (key_blocks + num_splits - 1) / num_splits;
    KeyRange range;
    range.begin = split * blocks_per_split * kTileN, range.end = range.begin + blocks_per_split * kTileN;
    if (range.begin < seen.begin) range.begin = seen.begin;
    if (range.end > seen.end) range.end = seen.end;
    range.tile_begin = range.begin - (is_paged ? (leftpad + range.begin) % box_rows : 0);
    range.first_position = leftpad + range.tile_begin;
    range.num_tiles = range.end > range.begin ? static_cast<int>((range.end - range.tile_begin + kTileN - 1) / kTileN) : 0;
    return range;
  };
  // Coordinates (row, group) of box `box` of tile `tile`: past the range, an
  // out-of-bounds group (the TMA writes zeros and reads nothing).
  const auto box_coordinates = [&](const KeyRange& range, int tile, int box, std::int32_t block, std::int32_t& row, std::int32_t& group_coordinate) {
    const std::int64_t position = range.first_position + static_cast<std::int64_t>(tile) * kTileN + box * box_rows;
    if (!is_paged) {
      row = static_cast<std::int32_t>(position), group_coordinate = group_of_sequence;
    } else {
      row = static_cast<std::int32_t>(position % page_size), group_coordinate = block;
    }
  };
  // Paged: the page of box `box` of `tile` (read with `load`), or num_blocks past the range.
  const auto page_of_box = [&](const KeyRange& range, int tile, int box, auto load) -> std::int32_t {
    const std::int64_t rows_before = static_cast<std::int64_t>(tile) * kTileN + box * box_rows;
    if (rows_before >= range.end - range.tile_begin) return static_cast<std::int32_t>(params.num_blocks);
    const std::int64_t page = (range.first_position + rows_before) / page_size;
    if (page >= params.block_table_stride) return static_cast<std::int32_t>(params.num_blocks);
    return load(page_table + page);
  };

  // ---- before the wait: nothing here reads a value an earlier kernel may still write,
  // except the speculative reads of the prefetch, whose values only pick L2 lines.
  if (tid == 0) {
    for (int stage = 0; stage < kStages; ++stage) {
      ptx::mbarrier_init(ptx::mbarrier_at(full_barriers, stage), 1);                // the producer's expect_tx
      ptx::mbarrier_init(ptx::mbarrier_at(empty_barriers, stage), kConsumerWarps);  // every consumer warp releases
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  // Speculative L2 prefetch of the first tiles, with plain per-lane prefetch.global.L2
  // (two 128-byte lines per 256-byte row), not the TMA unit: nothing is handed to the TMA
  // before griddepcontrol.wait. (The first version prefetched TMA boxes here and
  // decode_bench, back-to-back steps under PDL, did not finish — one suspect: a dependent
  // grid's TMA requests held behind its wait while the previous step's copies need the
  // same unit. Unconfirmed; see gpu_decode.md.)
  if (is_producer && params.maybe_cache_batch_idx == nullptr) {
    // The lengths and pages as they are now, clamped so every address is in the cache.
    std::int64_t leftpad = params.maybe_cache_leftpad ? tma::load_relaxed(params.maybe_cache_leftpad + b) : 0;
    const std::int64_t cached = params.maybe_cache_seqlens ? tma::load_relaxed(params.maybe_cache_seqlens + b) : params.uniform_cache_seqlen;
    leftpad = leftpad < 0 ? 0 : (leftpad > params.capacity ? params.capacity : leftpad);
    std::int64_t seqlen_k = cached + params.seqlen_new - leftpad;
    seqlen_k = seqlen_k < 0 ? 0 : (seqlen_k > params.capacity - leftpad ? params.capacity - leftpad : seqlen_k);
    const KeyRange guess = key_range(MaskRule{a.seqlen_q, seqlen_k, a.window_left, a.window_right}, leftpad);
    const int prefetch_tiles = maps.prefetch_tiles < 0 ? kStages : maps.prefetch_tiles;
    const std::int64_t rows = static_cast<std::int64_t>(guess.num_tiles < prefetch_tiles ? guess.num_tiles : prefetch_tiles) * kTileN;
    const T* k_head = static_cast<const T*>(a.k) + h_kv * a.k_head_stride;
    const T* v_head = static_cast<const T*>(a.v) + h_kv * a.v_head_stride;
    for (std::int64_t row = lane; row < rows; row += 32) {
      const std::int64_t position = guess.first_position + row;
      if (guess.tile_begin + row >= guess.end || position >= params.capacity) break;
      std::int64_t k_offset = b * a.k_batch_stride + position * a.k_row_stride;
      std::int64_t v_offset = b * a.v_batch_stride + position * a.v_row_stride;
      if (is_paged) {
        const std::int64_t page = position / page_size;
        if (page >= params.block_table_stride) break;
        const std::int64_t block = tma::load_relaxed(page_table + page);
        if (block < 0 || block >= params.num_blocks) continue;
        k_offset = block * a.k_batch_stride + (position - page * page_size) * a.k_row_stride;
        v_offset = block * a.v_batch_stride + (position - page * page_size) * a.v_row_stride;
      }
      for (std::int64_t byte = 0; byte < a.head_dim * 2; byte += 128) {
        tma::prefetch_line_l2(reinterpret_cast<const char*>(k_head + k_offset) + byte);
        tma::prefetch_line_l2(reinterpret_cast<const char*>(v_head + v_offset) + byte);
      }
    }
  }

  // Everything below reads what earlier kernels wrote (cache, q, lengths, page table).
  wait_for_prior_grids();
  allow_dependent_launch();
  if (is_producer && lane == 0) {
    tma::prefetch_tensor_map(&maps.k);
    tma::prefetch_tensor_map(&maps.v);
  }

  const MaskRule mask = params.mask_of(b);
  const KeyRange range = key_range(mask, params.leftpad(b));
  const std::int64_t key_begin = range.begin, key_end = range.end;
  const int num_tiles = range.num_tiles;

  DecodeState state[2];         // consumer rows group_row, group_row + 8 (l: this lane's columns only)
  float o[Config::kDTiles][4];  // (16 rows, kHeadDim) accumulator fragments, unnormalised
#pragma unroll
  for (int n = 0; n < Config::kDTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;

  if (is_producer) {
    // ---- producer: lane 0 arms each stage's barrier, lane g < boxes copies box g of K
    // and V (every panel); paged, lane g looks up its box's page one tile ahead.
    const auto load_page = [](const std::int32_t* p) { return *p; };
    const auto issue_tile = [&](int tile, std::int32_t block) {
      const int stage = tile % kStages;
      if (tile >= kStages)
        ptx::mbarrier_wait_converged(ptx::mbarrier_at(empty_barriers, stage), ((tile / kStages) - 1) & 1);
      const std::uint32_t full = ptx::mbarrier_at(full_barriers, stage);
      if (lane == 0) ptx::mbarrier_arrive_expect_tx(full, Config::kStageBytes);
      if (lane >= boxes) return;
      std::int32_t row, group_coordinate;
      box_coordinates(range, tile, lane, block, row, group_coordinate);
      const std::uint32_t k_stage = ring_address + stage * Config::kStageBytes + lane * box_rows * kPanelColumns * 2;
#pragma unroll
      for (int panel = 0; panel < kPanels; ++panel) {
        const std::uint32_t panel_offset = panel * Config::kPanelBytes;
        tma::copy_box(k_stage + panel_offset, &maps.k, panel * kPanelColumns, row, static_cast<std::int32_t>(h_kv), group_coordinate, full);
        tma::copy_box(k_stage + Config::kTileBytes + panel_offset, &maps.v, panel * kPanelColumns, row, static_cast<std::int32_t>(h_kv),
                      group_coordinate, full);
      }
    };
    if (is_paged) {
      std::int32_t first_blocks[kStages];
#pragma unroll
      for (int stage = 0; stage < kStages; ++stage)
        first_blocks[stage] = stage < num_tiles && lane < boxes ? page_of_box(range, stage, lane, load_page) : 0;
#pragma unroll
      for (int stage = 0; stage < kStages; ++stage)
        if (stage < num_tiles) issue_tile(stage, first_blocks[stage]);
      std::int32_t next_block = kStages < num_tiles && lane < boxes ? page_of_box(range, kStages, lane, load_page) : 0;
      for (int tile = kStages; tile < num_tiles; ++tile) {
        const std::int32_t block = next_block;
        if (tile + 1 < num_tiles && lane < boxes) next_block = page_of_box(range, tile + 1, lane, load_page);
        issue_tile(tile, block);
      }
    } else {
      for (int tile = 0; tile < num_tiles; ++tile) issue_tile(tile, 0);
    }
    __syncwarp();  // lanes left issue_tile at different points: converged for bar.sync
  } else {
    // ---- consumers ------------------------------------------------------------------
    // q rows of this CTA (row r = packed query row row_begin + r), zero past the rows and
    // head_dim: by cp.async when plain and aligned, else rotated feature by feature.
    const bool is_q_copied = !params.has_rotary() && reinterpret_cast<std::uintptr_t>(a.q) % 16 == 0 && a.q_batch_stride % 8 == 0 &&
                             a.q_row_stride % 8 == 0 && a.q_head_stride % 8 == 0;
    const auto q_row_of = [&](int r) {
      const int packed = static_cast<int>(row_begin) + r;  // packed rows < 2^31 (validate_kvcache)
      const bool is_row = packed < row_end;
      const int i = is_row ? packed / group32 : 0, h = static_cast<int>(h_kv) * group32 + (is_row ? packed % group32 : 0);
      return static_cast<const T*>(a.q) + a.q_offset(b, h) + i * a.q_row_stride;
    };
    if (is_q_copied) {
#pragma unroll
      for (int c = tid; c < kRows * kChunks; c += kConsumerThreads) {
        const int r = c / kChunks, chunk = c % kChunks;
        const bool is_valid = row_begin + r < row_end && chunk * 8 < a.head_dim;
        ptx::cp_async_16(ptx::shared_address(q_tile + Config::q_offset(r, chunk)), q_row_of(r) + chunk * 8, is_valid);
      }
      ptx::cp_async_commit_group();
      ptx::cp_async_wait_group<0>();
    } else {
      for (int r = 0; r < kRows; ++r) {
        const bool is_row = row_begin + r < row_end;
        const T* q_row = q_row_of(r);
        const std::int64_t rotary_position = params.has_rotary() && is_row ? params.q_rotary_position(b, (row_begin + r) / group) : 0;
        for (int d = tid; d < kHeadDim; d += kConsumerThreads) {
          float x = 0.0f;
          if (is_row && d < a.head_dim)
            x = (params.has_rotary() && d < params.rotary_dim) ? rotate_feature<T>(params, q_row, d, rotary_position)
                                                                : Numeric::to_float(q_row[d]);
          q_tile[Config::q_offset(r, d / 8) + d % 8] = Numeric::from_float(x);
        }
      }
    }
    ptx::named_barrier_sync(NamedBarrier::kQueryStaged, kConsumerThreads);  // q is in shared memory

    // This lane's rows group_row and group_row + 8 (key offsets from the tile grid's first key).
    LaneRows rows;
    {
      std::int64_t head[2], position[2];
      bool is_row[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int packed = static_cast<int>(row_begin) + group_row + 8 * half;
        is_row[half] = packed < row_end;
        position[half] = is_row[half] ? packed / group32 : 0;
        head[half] = static_cast<int>(h_kv) * group32 + packed % group32;
      }
      rows = lane_rows(a, mask, b, head, position, is_row, key_begin, key_end, range.tile_begin);
    }

    const int matrix = lane / 8, matrix_row = lane % 8;  // ldmatrix lane roles
    // The q fragments of every k step, loaded once (d <= 128: 32 registers) instead of
    // once per tile: the loop below is issue-bound with one warp per scheduler.
    constexpr int kQSteps = Config::kQInRegisters ? Config::kKSteps : 1;
    std::uint32_t q_fragments[kQSteps][4];
    const auto load_q_fragment = [&](int k_step, std::uint32_t (&fragment)[4]) {
      ptx::ldmatrix_x4(fragment[0], fragment[1], fragment[2], fragment[3],
                       ptx::shared_address(q_tile + Config::q_offset((matrix % 2) * 8 + matrix_row, 2 * k_step + matrix / 2)));
    };
    if constexpr (Config::kQInRegisters) {
#pragma unroll
      for (int k_step = 0; k_step < Config::kKSteps; ++k_step) load_q_fragment(k_step, q_fragments[k_step]);
    }
    const int warp_key = warp * Config::kKeysPerWarp;    // first key row of this warp in a tile
    // This lane's ldmatrix addresses, as byte offsets from a stage's K (or V) tile. A
    // tile row r holds 16-byte chunk c at position (c % 8) ^ (r % 8) of its 128-byte
    // panel row (Config::tile_offset); a lane's row is fixed and its chunk is 2j + bit
    // (j from the unrolled step, bit from the lane), so (2j + bit) ^ (r % 8) =
    // 2j ^ (bit ^ r % 8): four offsets per lane cover every step, the panel is a
    // compile-time constant, and the loop computes no address.
    std::uint32_t k_offsets[4], v_offsets[4];
    {
      const int k_row = warp_key + (matrix / 2) * 8 + matrix_row, v_row = warp_key + (matrix % 2) * 8 + matrix_row;
      const int k_xor = (matrix % 2) ^ (k_row % 8), v_xor = (matrix / 2) ^ (v_row % 8);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        k_offsets[j] = static_cast<std::uint32_t>((k_row * kPanelColumns + ((2 * j) ^ k_xor) * 8) * 2);
        v_offsets[j] = static_cast<std::uint32_t>((v_row * kPanelColumns + ((2 * j) ^ v_xor) * 8) * 2);
      }
    }
    // Keys as offsets from the first tile's first key (32-bit: one CTA's range), and the
    // tiles every row of this CTA sees whole (no element mask, no V rows to clear).
    const int range_begin = static_cast<int>(key_begin - range.tile_begin), range_end = static_cast<int>(key_end - range.tile_begin);
    const WholeTiles whole = whole_tiles<kTileN>(mask, position_begin, position_end, key_begin, key_end, range.tile_begin);
    const bool is_scale = a.score_is_positive_scale();  // no softcap, no ALiBi: score_tile's fast path
    const bool has_affine_alibi = is_alibi_affine && a.has_alibi() && !a.has_softcap();  // score_tile's affine form
    for (int tile = 0; tile < num_tiles; ++tile) {
      const int stage = tile % kStages;
      ptx::mbarrier_wait_converged(ptx::mbarrier_at(full_barriers, stage), (tile / kStages) & 1);
      const std::uint32_t k_tile_address = ring_address + stage * Config::kStageBytes;
      const std::uint32_t v_tile_address = k_tile_address + Config::kTileBytes;
      const bool is_full_tile = whole.contains(tile);
      const int warp_first = tile * kTileN + warp_key;  // relative key of this warp's first row
      if (!is_full_tile && (warp_first < range_begin || warp_first + Config::kKeysPerWarp > range_end)) {
        // Some of this warp's keys are outside the range: their V rows to zero (P is 0
        // there, and 0 * NaN is NaN). Generic writes into a stage the TMA may refill:
        // fenced before release.
        T* v_tile = kv_ring + (stage * 2 + 1) * (Config::kTileBytes / 2);
        for (int i = lane; i < Config::kKeysPerWarp * kChunks; i += 32) {
          const int r = i / kChunks, chunk = i % kChunks;
          if (warp_first + r < range_begin || warp_first + r >= range_end)
            *reinterpret_cast<uint4*>(v_tile + Config::tile_offset(warp_key + r, chunk)) = make_uint4(0, 0, 0, 0);
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncwarp();
      }

      float s[2][4] = {};
#pragma unroll
      for (int k_step = 0; k_step < Config::kKSteps; ++k_step) {
        std::uint32_t k_fragment[4];
        ptx::ldmatrix_x4(k_fragment[0], k_fragment[1], k_fragment[2], k_fragment[3],
                         k_tile_address + k_offsets[k_step % 4] + (k_step / 4) * Config::kPanelBytes);
        const std::uint32_t b0[2] = {k_fragment[0], k_fragment[1]}, b1[2] = {k_fragment[2], k_fragment[3]};
        if constexpr (Config::kQInRegisters) {
          ptx::mma_m16n8k16<Numeric::kMmaInput>(s[0], q_fragments[k_step], b0);
          ptx::mma_m16n8k16<Numeric::kMmaInput>(s[1], q_fragments[k_step], b1);
        } else {
          std::uint32_t q_fragment[4];
          load_q_fragment(k_step, q_fragment);
          ptx::mma_m16n8k16<Numeric::kMmaInput>(s[0], q_fragment, b0);
          ptx::mma_m16n8k16<Numeric::kMmaInput>(s[1], q_fragment, b1);
        }
      }

      // Scores in log2 units. Whole tiles (all but the range's ends) skip the element mask;
      // elsewhere it also masks the keys before key_begin (the tile grid starts below the
      // range) and past key_end.
      score_tile(s, rows, is_full_tile && is_scale, is_full_tile, is_full_tile && has_affine_alibi && whole.is_left(tile),
                 warp_first + 2 * quad_lane);  // kernel_mma.cuh

      std::uint32_t p_fragment[4];
      softmax_tile<T>(s, state, o, p_fragment);  // kernel_mma.cuh

#pragma unroll
      for (int n = 0; n < Config::kDTiles; n += 2) {
        std::uint32_t v_fragment[4];
        ptx::ldmatrix_x4_trans(v_fragment[0], v_fragment[1], v_fragment[2], v_fragment[3],
                               v_tile_address + v_offsets[(n % 8) / 2] + (n / 8) * Config::kPanelBytes);
        const std::uint32_t b0[2] = {v_fragment[0], v_fragment[1]}, b1[2] = {v_fragment[2], v_fragment[3]};
        ptx::mma_m16n8k16<Numeric::kMmaInput>(o[n], p_fragment, b0);
        ptx::mma_m16n8k16<Numeric::kMmaInput>(o[n + 1], p_fragment, b1);
      }
      __syncwarp();  // every lane's ldmatrix of this stage is done
      if (lane == 0) ptx::mbarrier_arrive(ptx::mbarrier_at(empty_barriers, stage));
    }
  }
  // Every tile landed and was read (the consumers waited for each): shared memory below
  // the barriers is free for the merge.
  __syncthreads();

  // ---- epilogue: the consumer warps' states and rows merged per row ---------------------
  // Only consumer threads touch the merge area; the producer warp takes part in the
  // barriers alone. (Its threads used to share the output loop; racecheck then flagged
  // their reads against the consumers' writes, whose barrier count is one ahead of the
  // producer's by the consumer-only named barrier — a tool false positive, 2026-11-25.)
  // From the window's own start, not the 1024-aligned base: the cluster merge reads the
  // partner CTA's rows at the same offset in its window, and two CTAs' windows need not
  // have the same alignment padding (e.g. the second CTA on an SM). The barriers lie
  // past kMergeBytes either way.
  float* merge_m = reinterpret_cast<float*>(shared_storage);
  float* merge_l = merge_m + kConsumerWarps * kRows;
  float* merge_o = merge_l + kConsumerWarps * kRows;
  float* merge_lse = merge_o + kConsumerWarps * kRows * kHeadDim;  // (kRows): for the cluster merge
  float* cluster_o = merge_lse + kRows;                              // (kRows, kHeadDim): this split's normalised rows
  if (!is_producer) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      state[half].l += __shfl_xor_sync(0xffffffffu, state[half].l, 1);
      state[half].l += __shfl_xor_sync(0xffffffffu, state[half].l, 2);
      const int r = group_row + 8 * half;
      if (quad_lane == 0) {
        merge_m[warp * kRows + r] = state[half].m;
        merge_l[warp * kRows + r] = state[half].l;
      }
#pragma unroll
      for (int n = 0; n < Config::kDTiles; ++n) {
        float2* dst = reinterpret_cast<float2*>(merge_o + (warp * kRows + r) * kHeadDim + 8 * n + 2 * quad_lane);
        *dst = make_float2(o[n][2 * half], o[n][2 * half + 1]);
      }
    }
  }
  __syncthreads();

  const bool is_single_split = num_splits == 1;
  constexpr int kQuads = kHeadDim / 4;
  const int rows_here = static_cast<int>(row_end - row_begin);
  if (!is_producer) {
    for (int element = tid; element < rows_here * kQuads; element += kConsumerThreads) {
      const int r = element / kQuads, d = 4 * (element % kQuads);
      if (d >= a.head_dim) continue;
      // The row's state over the warps (each thread of the row folds the same values in
      // the same order: the same bits), and each warp's scale factor[w] / l. With the
      // SFU as in the tile loop: the accurate exp2/exp/log/division routines would cost
      // ~100 instructions per output quad in the serial tail of a step.
      DecodeState total;
      float scale[kConsumerWarps];
#pragma unroll
      for (int w = 0; w < kConsumerWarps; ++w) {
        DecodeState part;
        part.m = merge_m[w * kRows + r];
        part.l = merge_l[w * kRows + r];
        float factor_total, factor_part;
        total = online_softmax::merge(total, part, &factor_total, &factor_part);
#pragma unroll
        for (int v = 0; v < w; ++v) scale[v] *= factor_total;
        scale[w] = factor_part;
      }
      const float inverse_sum = total.inverse_sum();
      const float lse = total.lse();
      float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int w = 0; w < kConsumerWarps; ++w) {
        const float weight = scale[w] * inverse_sum;
        const float4 x = *reinterpret_cast<const float4*>(merge_o + (w * kRows + r) * kHeadDim + d);
        value.x += weight * x.x, value.y += weight * x.y, value.z += weight * x.z, value.w += weight * x.w;
      }
      const int packed = static_cast<int>(row_begin) + r;
      const int i = packed / group32, h = static_cast<int>(h_kv) * group32 + packed % group32;
      if (is_single_split) {
        store_output_quad<T>(a, b, h, i, d, value, lse);
      } else if (is_cluster_merge) {
        *reinterpret_cast<float4*>(cluster_o + r * kHeadDim + d) = value;
        if (d == 0) merge_lse[r] = lse;
      } else {
        float* partial_o = static_cast<float*>(params.maybe_workspace);
        const std::int64_t row = params.partial_row(split, b, h, i);
        *reinterpret_cast<float4*>(partial_o + row * a.head_dim + d) = value;
        if (d == 0) partial_o[params.num_splits * params.partial_rows() * a.head_dim + row] = lse;
      }
    }
  }

  if (is_cluster_merge) {
    // The two splits of this query block are one cluster: merge through distributed
    // shared memory (see kernel_mma.cuh).
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();
    const int quads = rows_here * kQuads;
    const int per_split = (quads + num_splits - 1) / num_splits;
    const int last = (split + 1) * per_split < quads ? (split + 1) * per_split : quads;
    for (int element = split * per_split + tid; !is_producer && element < last; element += kConsumerThreads) {
      const int r = element / kQuads, d = 4 * (element % kQuads);
      if (d >= a.head_dim) continue;
      float split_lse[kMaxClusterSplits];
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s)
        split_lse[s] = s < num_splits ? *cluster.map_shared_rank(merge_lse + r, s) : online_softmax::negative_infinity<float>();
      const float lse = online_softmax::lse_of<SfuMath>(split_lse);
      const float lse_log2 = lse * static_cast<float>(online_softmax::kLog2e);
      float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (s >= num_splits) break;
        const float weight = online_softmax::rescale_factor<SfuMath>(split_lse[s] * static_cast<float>(online_softmax::kLog2e), lse_log2);
        const float4 x = *reinterpret_cast<const float4*>(cluster.map_shared_rank(cluster_o + r * kHeadDim + d, s));
        value.x += weight * x.x, value.y += weight * x.y, value.z += weight * x.z, value.w += weight * x.w;
      }
      const int packed = static_cast<int>(row_begin) + r;
      store_output_quad<T>(a, b, static_cast<int>(h_kv) * group32 + packed % group32, packed / group32, d, value, lse);
    }
    // No CTA exits while its partner still reads its shared memory: an execution barrier
    // only (the reads above have returned their values), so a relaxed arrive — without
    // the release fence cluster.sync() adds (MEMBAR.GPU in SASS).
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n"
                 "barrier.cluster.wait.aligned;\n" ::: "memory");
  }
#endif
}

}  // namespace flashattn::cuda::decode
