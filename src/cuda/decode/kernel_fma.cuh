// src/cuda/decode/kernel_fma.cuh — the split-KV ("flash-decoding") attention kernel
// on CUDA cores (fp32 FMA). Built instead of the tensor-core kernel (kernel_mma.cuh)
// with -DFLASHATTN_CUDA_DECODE_FMA=ON. It was the first decode kernel: verified on the
// H100 (tests + compute-sanitizer clean, 2026-11-22) but issue-bound at ~1 TB/s
// (batch 8, KV 64k, bf16: 1.06 TB/s); kept as the cross-check of kernel_mma.cuh.
//
// Decoding reads the whole KV cache for a handful of query rows, so it is bound by
// HBM bandwidth, not by math: the design goal is that every K/V byte is read once,
// with many 16-byte loads in flight, and that the arithmetic (fp32 FMA, no tensor
// cores: kRows <= 8 rows would waste most of an mma tile) hides under the loads.
//
// Work decomposition. One CTA = (query block, split, kv head, sequence):
//   * query rows: the GQA group's query heads x seqlen_q positions, packed as
//     row = i * group_size + g (position i, head h_kv * group_size + g); a CTA takes
//     kRows of them, so one K/V read serves the whole group (GQA packing);
//   * keys: the sequence's key range cut into num_splits chunks of whole tiles.
// Inside the CTA, a "key group" of kLanesPerKey = kHeadDim / 8 lanes owns one key
// row at a time, each lane 8 features (one 16-byte chunk); kKeyGroups groups work
// on different keys of a tile. Each lane cp.async-copies exactly the chunks it will
// read itself, so the multi-stage pipeline needs no barrier: a thread's own
// cp.async.wait_group makes its own copies visible to it.
// Every key group keeps its own online-softmax state per row ({m, l} and the
// unnormalised o over its 8 features) — no cross-group traffic in the main loop.
// At the end the groups' states are merged through shared memory with
// online_softmax::merge, and the CTA writes either the output (one split) or a
// normalised partial (O, LSE) row for the combine kernel (append_combine.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "flashattn/score.hpp"
#include "src/core/kvcache_params.hpp"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/decode/launch_kernel.cuh"
#include "src/cuda/decode/rotary.cuh"
#include "src/cuda/ptx/cp_async.cuh"

namespace flashattn::cuda::decode {

// Tile geometry of the decode kernel, shared by the kernel, its launcher and the
// split heuristic (performance-only: results do not depend on it).
template <int kHeadDim_, int kRows_>
struct DecodeConfig {
  static constexpr int kHeadDim = kHeadDim_;   // padded head dim (64, 128, 256)
  static constexpr int kRows = kRows_;         // packed query rows per CTA (4 or 8)
  static constexpr int kThreads = 128;
  static constexpr int kChunk = 8;             // features per lane: one 16-byte load
  static constexpr int kLanesPerKey = kHeadDim / kChunk;
  static constexpr int kKeyGroups = kThreads / kLanesPerKey;
  static constexpr int kKeysPerStep = 4;       // keys per group per tile: amortises one rescale
  static constexpr int kTileN = kKeyGroups * kKeysPerStep;  // keys per tile
  static constexpr int kStages = 4;            // tiles in flight per thread: 3 loading while 1 is used
  // Pipeline: [stage][key step][K|V][thread] 16-byte chunks; a warp touches 512
  // contiguous bytes per access, so shared loads/stores are conflict-free.
  static constexpr int kPipelineBytes = kStages * kKeysPerStep * 2 * kThreads * 16;
  // Merge area (reuses the pipeline): per key group, per row, m and l, then o.
  static constexpr int kMergeBytes = kKeyGroups * kRows * (2 + kHeadDim) * 4;
  static constexpr int kSharedBytes = kPipelineBytes > kMergeBytes ? kPipelineBytes : kMergeBytes;
  static_assert(kLanesPerKey <= 32 && 32 % kLanesPerKey == 0, "a key group must sit inside one warp");
};

template <class T, class Config>
__global__ void __launch_bounds__(Config::kThreads, 2) decode_kernel(const __grid_constant__ KVCacheParams params) {
  using Numeric = Numeric<T>;
  constexpr int kRows = Config::kRows, kChunk = Config::kChunk, kLanesPerKey = Config::kLanesPerKey;
  constexpr int kKeysPerStep = Config::kKeysPerStep, kTileN = Config::kTileN, kStages = Config::kStages;
  constexpr int kThreads = Config::kThreads;
  extern __shared__ __align__(16) unsigned char shared[];
  wait_for_prior_grids();  // launched with PDL (launch_kernel.cuh): read nothing before this
  allow_dependent_launch();

  const AttentionParams& a = params.attention;
  const int num_splits = params.num_splits;
  const int split = static_cast<int>(blockIdx.x) % num_splits;
  const std::int64_t query_block = blockIdx.x / num_splits;
  const std::int64_t h_kv = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int tid = threadIdx.x;
  const int key_group = tid / kLanesPerKey;
  const int lane_in_key = tid % kLanesPerKey;
  const int feature = lane_in_key * kChunk;  // first of this lane's 8 features
  const bool has_features = feature < a.head_dim;

  const std::int64_t group = a.group_size;
  const std::int64_t packed_rows = a.seqlen_q * group;
  const std::int64_t row_begin = query_block * kRows;
  const std::int64_t row_end = row_begin + kRows < packed_rows ? row_begin + kRows : packed_rows;
  const MaskRule mask = params.mask_of(b);
  const std::int64_t first_position = params.leftpad(b);

  // Keys this CTA visits: the rows' mask columns, intersected with the split's tiles.
  const MaskRule::ColumnRange seen = mask.columns_of_rows(row_begin / group, (row_end - 1) / group + 1);
  const std::int64_t key_blocks = (mask.seqlen_k + kTileN - 1) / kTileN;
  const std::int64_t blocks_per_split = (key_blocks + num_splits - 1) / num_splits;
  std::int64_t key_begin = split * blocks_per_split * kTileN, key_end = key_begin + blocks_per_split * kTileN;
  if (key_begin < seen.begin) key_begin = seen.begin;
  if (key_end > seen.end) key_end = seen.end;
  const int num_tiles = key_end > key_begin ? static_cast<int>((key_end - key_begin + kTileN - 1) / kTileN) : 0;

  // q rows of this CTA, rotated like flash_attn and rounded to T: (kRows, this lane's 8 features).
  float q[kRows][kChunk];
  std::int64_t row_position[kRows];  // query position i of each packed row (mask row)
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t packed = row_begin + r;
    const bool is_row = packed < row_end;
    const std::int64_t i = is_row ? packed / group : 0;
    row_position[r] = i;
    const std::int64_t h = h_kv * group + (is_row ? packed % group : 0);
    const T* q_row = static_cast<const T*>(a.q) + a.q_offset(b, h) + i * a.q_row_stride;
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      const int d = feature + e;
      float x = 0.0f;
      if (is_row && d < a.head_dim) {
        x = Numeric::to_float(q_row[d]);
        if (params.has_rotary() && d < params.rotary_dim)
          x = Numeric::to_float(Numeric::from_float(rotate_feature<T>(params, q_row, d, params.q_rotary_position(b, i))));
      }
      q[r][e] = x;
    }
  }

  // This thread's 16-byte slot for (stage, key step, K|V).
  const auto slot = [&](int stage, int step, int kv) {
    return reinterpret_cast<uint4*>(shared) + ((stage * kKeysPerStep + step) * 2 + kv) * kThreads + tid;
  };
  const T* k_cache = static_cast<const T*>(a.k);
  const T* v_cache = static_cast<const T*>(a.v);
  // Issues the copies of tile `tile` into `stage` (zero-fill past the range / head_dim).
  const auto load_tile = [&](int tile, int stage) {
#pragma unroll
    for (int step = 0; step < kKeysPerStep; ++step) {
      const std::int64_t key = key_begin + static_cast<std::int64_t>(tile) * kTileN + key_group * kKeysPerStep + step;
      const bool is_valid = key < key_end && has_features;
      std::int64_t k_offset = 0, v_offset = 0;
      if (is_valid) {
        const std::int64_t position = first_position + key;
        k_offset = params.k_cache_offset(b, position, h_kv) + feature;
        v_offset = params.v_cache_offset(b, position, h_kv) + feature;
      }
      ptx::cp_async_16(static_cast<std::uint32_t>(__cvta_generic_to_shared(slot(stage, step, 0))), k_cache + k_offset, is_valid);
      ptx::cp_async_16(static_cast<std::uint32_t>(__cvta_generic_to_shared(slot(stage, step, 1))), v_cache + v_offset, is_valid);
    }
  };

  online_softmax::State<float> state[kRows];
  float o[kRows][kChunk];  // unnormalised, this key group's keys only
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int e = 0; e < kChunk; ++e) o[r][e] = 0.0f;

#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < num_tiles) load_tile(stage, stage);
    ptx::cp_async_commit_group();  // empty groups keep the count uniform
  }
  for (int tile = 0; tile < num_tiles; ++tile) {
    if (tile + kStages - 1 < num_tiles) load_tile(tile + kStages - 1, (tile + kStages - 1) % kStages);
    ptx::cp_async_commit_group();
    ptx::cp_async_wait_group<kStages - 1>();  // this thread's copies of `tile` have landed
    const int stage = tile % kStages;
    const std::int64_t tile_key = key_begin + static_cast<std::int64_t>(tile) * kTileN + key_group * kKeysPerStep;

    // The score rule of each packed row's query head (its own ALiBi slope), per tile: at
    // kRows = 8 the kernel has no registers to keep them across the loop.
    ScoreRule rule[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int packed = static_cast<int>(row_begin) + r, group32 = static_cast<int>(group);  // packed rows < 2^31 (validate_kvcache)
      rule[r] = a.score_of(b, static_cast<int>(h_kv) * group32 + packed % group32, mask);
    }
    // S = q K^T for this group's kKeysPerStep keys (log2 units, masked -inf): (kRows, kKeysPerStep).
    float s[kRows][kKeysPerStep];
#pragma unroll
    for (int step = 0; step < kKeysPerStep; ++step) {
      const uint4 chunk = *slot(stage, step, 0);
      const std::uint32_t* packed = reinterpret_cast<const std::uint32_t*>(&chunk);
      float k[kChunk];
#pragma unroll
      for (int e = 0; e < kChunk / 2; ++e) unpack_pair<T>(packed[e], k[2 * e], k[2 * e + 1]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kChunk; ++e) dot = fmaf(q[r][e], k[e], dot);
        // Sum the partial dots of the key's kLanesPerKey lanes (all of them get the sum).
#pragma unroll
        for (int offset = kLanesPerKey / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        const std::int64_t key = tile_key + step;
        const bool is_allowed = key < key_end && mask.allowed(row_position[r], key);
        s[r][step] = is_allowed ? rule[r].log2_score(dot, row_position[r], key) : online_softmax::negative_infinity<float>();
      }
    }
    // Online softmax over the step's keys, then O += P V.
    float p_sum[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float block_max = s[r][0];
#pragma unroll
      for (int step = 1; step < kKeysPerStep; ++step) block_max = fmaxf(block_max, s[r][step]);
      const float factor = state[r].raise_max(block_max);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) o[r][e] *= factor;
#pragma unroll
      for (int step = 0; step < kKeysPerStep; ++step) s[r][step] = state[r].term(s[r][step]);  // P
      p_sum[r] = 0.0f;
    }
#pragma unroll
    for (int step = 0; step < kKeysPerStep; ++step) {
      const uint4 chunk = *slot(stage, step, 1);
      const std::uint32_t* packed = reinterpret_cast<const std::uint32_t*>(&chunk);
      float v[kChunk];
#pragma unroll
      for (int e = 0; e < kChunk / 2; ++e) unpack_pair<T>(packed[e], v[2 * e], v[2 * e + 1]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        p_sum[r] += s[r][step];
#pragma unroll
        for (int e = 0; e < kChunk; ++e) o[r][e] = fmaf(s[r][step], v[e], o[r][e]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) state[r].add(p_sum[r]);
  }
  ptx::cp_async_wait_group<0>();
  __syncthreads();  // everyone is done with the pipeline: reuse it for the merge

  // Merge the key groups: shared (kKeyGroups, kRows) {m, l}, then (kKeyGroups, kRows, kHeadDim) o.
  float* merge_m = reinterpret_cast<float*>(shared);
  float* merge_l = merge_m + Config::kKeyGroups * kRows;
  float* merge_o = merge_l + Config::kKeyGroups * kRows;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (lane_in_key == 0) {
      merge_m[key_group * kRows + r] = state[r].m;
      merge_l[key_group * kRows + r] = state[r].l;
    }
    float4* dst = reinterpret_cast<float4*>(merge_o + (key_group * kRows + r) * Config::kHeadDim + feature);
    dst[0] = make_float4(o[r][0], o[r][1], o[r][2], o[r][3]);
    dst[1] = make_float4(o[r][4], o[r][5], o[r][6], o[r][7]);
  }
  __syncthreads();

  const bool is_single_split = num_splits == 1;
  for (int element = tid; element < kRows * Config::kHeadDim; element += kThreads) {
    const int r = element / Config::kHeadDim, d = element % Config::kHeadDim;
    const std::int64_t packed = row_begin + r;
    if (packed >= row_end || d >= a.head_dim) continue;
    online_softmax::State<float> total;
    float acc = 0.0f;
    for (int g = 0; g < Config::kKeyGroups; ++g) {
      online_softmax::State<float> part;
      part.m = merge_m[g * kRows + r];
      part.l = merge_l[g * kRows + r];
      float factor_total, factor_part;
      total = online_softmax::merge(total, part, &factor_total, &factor_part);
      acc = acc * factor_total + merge_o[(g * kRows + r) * Config::kHeadDim + d] * factor_part;
    }
    const float value = acc * total.inverse_sum();
    const std::int64_t i = packed / group, h = h_kv * group + packed % group;
    if (is_single_split) {
      static_cast<T*>(a.out)[a.out_offset(b, h) + i * a.out_row_stride + d] = Numeric::from_float(value);
      if (d == 0 && a.maybe_lse) a.maybe_lse[a.lse_offset(b, h) + i * a.lse_row_stride] = total.lse();
    } else {
      float* partial_o = static_cast<float*>(params.maybe_workspace);
      const std::int64_t row = params.partial_row(split, b, h, i);
      partial_o[row * a.head_dim + d] = value;
      if (d == 0) partial_o[params.num_splits * params.partial_rows() * a.head_dim + row] = total.lse();
    }
  }
}

}  // namespace flashattn::cuda::decode
