// src/cuda/hopper_bwd/kernel_wide.cuh — the Hopper (sm_90a) backward kernel for wide
// head dims (256): FA3's d256 mapping, the consumers splitting the head dim.
//
// Same algorithm, preprocess, workspace, MaskRule and GQA order as kernel.cuh; same
// producer/consumer structure (one producer warpgroup, two wgmma consumer warpgroups,
// TMA tensor copies into an mbarrier ring). What changes is who owns what: kernel.cuh
// gives each consumer 64 keys and all d columns of their dK and dV, 2 d fp32 registers
// per thread, which at d = 256 is twice the register file. Here, for one (key block of
// 64, kv head, sequence) and per step (query head of the group x block of 64 queries):
//   consumer w:  S_w  = Q K_w^T       wgmma m64n32, keys [32 w, 32 w + 32), depth d
//                dP_w = dO V_w^T      wgmma m64n32
//                P_w = exp2(S_w scale_log2 - LSE), dS_w = P_w ∘ (dP_w - D)
//                P_w, dS_w -> shared memory (16-bit); both halves meet at a named barrier
//                dV[:, cols_w] += P^T dO[:, cols_w]    wgmma m64n{d/2}, P^T read MN-major
//                dK[:, cols_w] += dS^T Q[:, cols_w]    wgmma m64n{d/2}, dS^T read MN-major
//                dQ[:, cols_w]  = dS K[:, cols_w]      wgmma m64n{d/2}, K read MN-major
//   cols_w = [d/2 w, d/2 (w + 1)): dK, dV and dQ are d/2 fp32 registers each per thread.
// A stage holds [Q | dO] of a step. When both consumers' products of the step are done,
// they write the step's fp32 dQ tile over the stage (64 x d x 4 bytes = the stage's
// size) and release it to the producer, which adds it to dq_accum with one bulk TMA
// reduction, waits until the reduction has read it, and loads a later step into it.
// So the staging costs no extra shared memory and the consumers never wait for a
// reduction; two stages (209.5 KB in all) keep the next step's loads in flight.
// Rows past a sequence: as kernel.cuh (LSE = +inf there, so P = dS = 0).
// Deterministic mode (kDeterministic): kernel.cuh's ordering (see there: turns by
// descending key block, key blocks mapped onto blockIdx.x in reverse, a workspace
// semaphore per (sequence, query head, query block)), done by the producer thread,
// which issues the reductions here: it waits for the tile's turn, adds, waits for the
// addition to complete and publishes the next turn, then refills the stage.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cuda/ptx>
#include <string>

#include "flashattn/error.hpp"
#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/core/params.hpp"
#include "src/cuda/bwd/workspace.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/hopper_bwd/dq_order.hpp"
#include "src/cuda/hopper_bwd/launch.hpp"
#include "src/cuda/hopper_bwd/pipeline.cuh"
#include "src/cuda/hopper_bwd/tile_config.hpp"
#include "src/cuda/ptx/bulk_reduce.cuh"
#include "src/cuda/ptx/math.cuh"
#include "src/cuda/ptx/semaphore.cuh"
#include "src/cuda/ptx/warpgroup.cuh"
#include "src/cuda/ptx/wgmma.cuh"

namespace flashattn::cuda::hopper_bwd {

template <class T, int kHeadDimArg, int kBlockMArg, int kBlockNArg, int kStagesArg, bool kDeterministic>
__global__ void __launch_bounds__(128 * (1 + kConsumerWarpgroups), 1)
    backward_kernel_sm90_wide(const __grid_constant__ HopperBackwardParams params) {
#if FLASHATTN_HOPPER_DEVICE_CODE
  constexpr HopperBwdWideConfig kConfig{kHeadDimArg, kBlockMArg, kBlockNArg, kStagesArg};
  constexpr int kHeadDim = kHeadDimArg, kBlockM = kBlockMArg, kBlockN = kBlockNArg, kStages = kStagesArg;
  constexpr int kPanels = kConfig.panels();
  constexpr int kColumns = kConfig.columns_per_consumer();  // of dV, dK, dQ per consumer
  constexpr int kKeys = kConfig.keys_per_consumer();        // of S, dP per consumer
  constexpr int kKVBytes = kConfig.kv_tile_bytes();
  constexpr int kQBytes = kConfig.q_tile_bytes();
  constexpr int kStatsBytes = kConfig.stats_bytes();
  constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
  constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  constexpr bool kIsBf16 = Numeric<T>::kIsBf16;
  static_assert(kBlockM == 64 && kBlockN == 64, "one m64 wgmma per product: 64 queries, 64 keys");
  static_assert(kKeys == 32, "S and dP: m64n32 per consumer");
  static_assert(kColumns % kPanelColumns == 0, "each consumer's columns are whole 64-column panels");
  static_assert(kConfig.dq_staging_bytes() == kConfig.stage_bytes(), "the dQ tile is staged over its stage");
  static_assert(kBlockM <= bwd::kMaxBlockM, "LSE/D rows and dq_accum rows are padded for kMaxBlockM-row tiles");
  static_assert(kConfig.shared_bytes() <= kMaxSharedBytes, "tiles exceed 227 KB of shared memory");
  static_assert(128 * kConfig.producer_registers() + kConsumerThreads * kConfig.consumer_registers() <= 65536,
                "register file: 64K 32-bit registers per SM");
  static_assert((1 + 2 * kStages) * 8 <= 256, "mbarriers exceed their 256 bytes");

  const BackwardParams& attention = params.backward;
  const bwd::Workspace& workspace = params.workspace;
  const std::int64_t num_n_blocks = (attention.seqlen_k + kBlockN - 1) / kBlockN;
  // Key block fastest (as kernel.cuh): under a causal mask the long CTAs start first;
  // deterministic: highest key block first (kernel.cuh says why).
  const std::int64_t n_block =
      kDeterministic ? num_n_blocks - 1 - blockIdx.x % num_n_blocks : blockIdx.x % num_n_blocks;
  const std::int64_t head_kv = (blockIdx.x / num_n_blocks) % attention.heads_kv;
  const std::int64_t batch = blockIdx.x / num_n_blocks / attention.heads_kv;
  const std::int64_t seqlen_q = attention.seqlen_q_of(batch), seqlen_k = attention.seqlen_k_of(batch);
  const std::int64_t n0 = n_block * kBlockN;
  if (n0 >= seqlen_k) return;
  const std::int64_t kv_rows = seqlen_k - n0 < kBlockN ? seqlen_k - n0 : kBlockN;
  const MaskRule mask = attention.mask_of(batch);
  // (dq_order.hpp: the deterministic mode's turns are derived from the same ranges.)
  const QueryBlockRange query_blocks = query_blocks_of_key_block(mask, n0, kv_rows, kBlockM);
  const int m_block_begin = query_blocks.begin;
  const int m_blocks = query_blocks.count;
  const int steps = m_blocks * static_cast<int>(attention.group_size);
  auto step_head = [&](int step) { return head_kv * attention.group_size + step / m_blocks; };
  auto step_m0 = [&](int step) { return static_cast<std::int64_t>(m_block_begin + step % m_blocks) * kBlockM; };

  extern __shared__ unsigned char shared_storage[];
  const std::uint32_t raw_address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_storage));
  unsigned char* shared_base = shared_storage + ((1024 - raw_address % 1024) % 1024);
  T* shared_k = reinterpret_cast<T*>(shared_base + kConfig.k_offset());  // (kBlockN, kHeadDim), 64-column panels
  T* shared_v = reinterpret_cast<T*>(shared_base + kConfig.v_offset());
  auto shared_q = [&](int stage) { return reinterpret_cast<T*>(shared_base + kConfig.stage_offset(stage)); };
  auto shared_do = [&](int stage) { return reinterpret_cast<T*>(shared_base + kConfig.stage_offset(stage) + kQBytes); };
  auto shared_dq = [&](int stage) { return reinterpret_cast<float*>(shared_base + kConfig.stage_offset(stage)); };
  unsigned char* shared_p = shared_base + kConfig.p_offset();    // (kBlockM, kBlockN) 16-bit, one swizzled panel
  unsigned char* shared_ds = shared_base + kConfig.ds_offset();  // (kBlockM, kBlockN) 16-bit, one swizzled panel
  float* shared_lse = reinterpret_cast<float*>(shared_base + kConfig.lse_offset());    // kStages x kBlockM
  float* shared_dsum = reinterpret_cast<float*>(shared_base + kConfig.dsum_offset());  // kStages x kBlockM
  auto* barriers = reinterpret_cast<std::uint64_t*>(shared_base + kConfig.barrier_offset());
  std::uint64_t* kv_full = barriers;                 // K and V landed
  std::uint64_t* full = barriers + 1;                // [kStages]: Q, dO, LSE, D of a step landed
  std::uint64_t* dq_staged = barriers + 1 + kStages;  // [kStages]: every consumer warp wrote its dQ rows there

  if (threadIdx.x == 0) {
    ::cuda::ptx::mbarrier_init(kv_full, 1);
    for (int stage = 0; stage < kStages; ++stage) {
      ::cuda::ptx::mbarrier_init(&full[stage], 1);
      ::cuda::ptx::mbarrier_init(&dq_staged[stage], kConsumerWarps);
    }
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  const std::int32_t batch_coordinate = attention.is_varlen() ? 0 : static_cast<std::int32_t>(batch);
  const std::int64_t stats_start = bwd::Workspace::stats_start(attention, batch);

  if (warpgroup == 0) {
    // ---- producer: loads, and the dQ reduction of each stage before it is refilled ----
    ptx::setmaxnreg_decrease<kConfig.producer_registers()>();
    if (threadIdx.x != 0 || steps == 0) return;
    const std::int32_t k_row = static_cast<std::int32_t>(attention.k_start(batch) + n0);
    ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                           ::cuda::ptx::space_shared, kv_full, 2 * kKVBytes);
    load_panels<kPanels, kBlockN>(shared_k, &params.k_map, k_row, static_cast<std::int32_t>(head_kv), batch_coordinate, kv_full);
    load_panels<kPanels, kBlockN>(shared_v, &params.v_map, k_row, static_cast<std::int32_t>(head_kv), batch_coordinate, kv_full);
    // The dQ tile of `step`, staged over its stage: added to dq_accum in one reduction.
    auto reduce_dq = [&](int step) {
      const int stage = step % kStages;
      wait_barrier(&dq_staged[stage], (step / kStages) & 1);
      const std::int64_t m0 = step_m0(step), head_q = step_head(step);
      const auto source = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_dq(stage)));
      if constexpr (!kDeterministic) {
        ptx::bulk_reduce_add_f32(workspace.dq_accum + workspace.dq_offset(attention, batch, m0, head_q), source,
                                 kConfig.dq_staging_bytes());
        ptx::bulk_commit_group();
      } else {
        ordered_reduce_add<kBlockM, kBlockN>(attention, workspace, mask, batch, head_q, m0, n_block, source,
                                             kConfig.dq_staging_bytes());
      }
    };
    for (int step = 0; step < steps; ++step) {
      const int stage = step % kStages;
      if (step >= kStages) {
        reduce_dq(step - kStages);
        ptx::bulk_wait_group_read<0>();  // the stage's bytes are read: it may be refilled
      }
      const std::int64_t head_q = step_head(step), m0 = step_m0(step);
      ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                             ::cuda::ptx::space_shared, &full[stage],
                                             2 * kQBytes + 2 * kStatsBytes);
      const std::int32_t q_row = static_cast<std::int32_t>(attention.q_start(batch) + m0);
      load_panels<kPanels, kBlockM>(shared_q(stage), &params.q_map, q_row, static_cast<std::int32_t>(head_q),
                                    batch_coordinate, &full[stage]);
      load_panels<kPanels, kBlockM>(shared_do(stage), &params.dout_map, q_row, static_cast<std::int32_t>(head_q),
                                    batch_coordinate, &full[stage]);
      load_statistics(shared_lse + stage * kBlockM, shared_dsum + stage * kBlockM, workspace,
                      head_q * workspace.stats_head_stride + stats_start + m0, kStatsBytes, &full[stage]);
    }
    for (int step = steps > kStages ? steps - kStages : 0; step < steps; ++step) reduce_dq(step);
    // The shared memory must outlive the reductions' reads (the CTA ends after this).
    ptx::bulk_wait_group<0>();
    return;
  }

  // ---- consumers -------------------------------------------------------------------
  ptx::setmaxnreg_increase<kConfig.consumer_registers()>();
  const int consumer = warpgroup - 1;
  const int thread_in_warpgroup = threadIdx.x % 128;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;      // accumulator row within an 8-row half
  const int quad_lane = lane % 4;  // accumulator column pair
  const int warp_row0 = (thread_in_warpgroup / 32) * 16 + group;  // + 8 * half: row of a 64-row accumulator
  const int key_column0 = consumer * kKeys;                        // this consumer's keys in S, dP
  const int column0 = consumer * kColumns;                         // this consumer's columns of dV, dK, dQ

  using ptx::make_smem_descriptor;
  using ptx::SwizzleMode;
  const auto address_of = [](const void* pointer) {
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
  };
  const std::uint32_t k_address = address_of(shared_k), v_address = address_of(shared_v);
  // S, dP: Q and dO (queries as M) K-major A; this consumer's 32 key rows of K and V
  // K-major B (32 rows = 4 swizzle atoms, 1024-byte aligned).
  const std::uint64_t k_as_b = make_smem_descriptor(k_address + key_column0 * 128, 16, 1024, SwizzleMode::bytes128);
  const std::uint64_t v_as_b = make_smem_descriptor(v_address + key_column0 * 128, 16, 1024, SwizzleMode::bytes128);
  // dV, dK: P^T and dS^T as A, read MN-major from the (queries, keys) tiles (M = keys);
  // dO and Q columns [column0, column0 + kColumns) as MN-major B (rows = queries).
  const std::uint64_t p_as_a_mn = make_smem_descriptor(address_of(shared_p), kBlockN * 128, 1024, SwizzleMode::bytes128);
  const std::uint64_t ds_as_a_mn = make_smem_descriptor(address_of(shared_ds), kBlockN * 128, 1024, SwizzleMode::bytes128);
  // dQ: dS as K-major A (M = queries, K = keys); K columns as MN-major B (rows = keys).
  const std::uint64_t ds_as_a = make_smem_descriptor(address_of(shared_ds), 16, 1024, SwizzleMode::bytes128);
  const std::uint64_t k_as_b_mn = make_smem_descriptor(k_address + (column0 / kPanelColumns) * kBlockN * 128,
                                                       kBlockN * 128, 1024, SwizzleMode::bytes128);
  const std::uint32_t column_panels_offset = (column0 / kPanelColumns) * kBlockM * 128;  // in a Q/dO tile
  // Descriptor increments are byte offsets >> 4 in the start-address field.
  // K-major k16 step kk of a (rows, kHeadDim) panelled tile: panel kk / 4, 32 bytes per step inside it.
  auto k_step_offset = [](int kk, int tile_rows) { return ((kk / 4) * tile_rows * 128 + (kk % 4) * 32) >> 4; };
  // MN-major k16 step: 16 rows of 128 bytes.
  auto mn_step_offset = [](int kk) { return (kk * 16 * 128) >> 4; };

  const bool has_softcap = attention.has_softcap();
  const float softcap_input_scale = has_softcap ? attention.softmax_scale / attention.softcap : 0.0f;
  const float softcap_scale_log2 = attention.softcap * static_cast<float>(online_softmax::kLog2e);
  const float scale_log2 = attention.softmax_scale_log2;

  float dv[kColumns / 2];  // (kBlockN keys, kColumns) per consumer, fp32
  float dk[kColumns / 2];  // unscaled
#pragma unroll
  for (int i = 0; i < kColumns / 2; ++i) dv[i] = dk[i] = 0.0f;

  if (steps > 0) wait_barrier(kv_full, 0);
  for (int step = 0; step < steps; ++step) {
    const int stage = step % kStages;
    const std::int64_t m0 = step_m0(step);
    const std::uint32_t q_address = address_of(shared_q(stage)), do_address = address_of(shared_do(stage));
    wait_barrier(&full[stage], (step / kStages) & 1);

    // S_w = Q K_w^T and dP_w = dO V_w^T: (64 queries, 32 keys) each, depth kHeadDim.
    const std::uint64_t q_as_a = make_smem_descriptor(q_address, 16, 1024, SwizzleMode::bytes128);
    const std::uint64_t do_as_a = make_smem_descriptor(do_address, 16, 1024, SwizzleMode::bytes128);
    float s[kKeys / 2];
    float dp[kKeys / 2];
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk)
      ptx::wgmma_ss<kKeys, kIsBf16, 0>(s, q_as_a + k_step_offset(kk, kBlockM), k_as_b + k_step_offset(kk, kBlockN),
                                       kk > 0 ? 1 : 0);
    ptx::wgmma_commit_group();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk)
      ptx::wgmma_ss<kKeys, kIsBf16, 0>(dp, do_as_a + k_step_offset(kk, kBlockM), v_as_b + k_step_offset(kk, kBlockN),
                                       kk > 0 ? 1 : 0);
    ptx::wgmma_commit_group();

    // Per-row statistics: this thread's rows are warp_row0 and warp_row0 + 8.
    const float* lse = shared_lse + stage * kBlockM;
    const float* dsum = shared_dsum + stage * kBlockM;
    const float row_lse[2] = {lse[warp_row0], lse[warp_row0 + 8]};
    const float row_dsum[2] = {dsum[warp_row0], dsum[warp_row0 + 8]};
    const std::int64_t q_rows_end = m0 + kBlockM < seqlen_q ? m0 + kBlockM : seqlen_q;
    const bool needs_mask = n0 + kBlockN > seqlen_k || !mask.tile_fully_allowed(m0, q_rows_end, n0, n0 + kBlockN);
    // Element mask: query rows warp_row0 (+8) against this consumer's key columns.
    auto apply_mask = [&](float (&p)[kKeys / 2]) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const std::int64_t query = m0 + warp_row0 + 8 * half;
        const std::int64_t begin = mask.col_begin(query), end = mask.col_end(query);
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const std::int64_t key = n0 + key_column0 + 8 * j + 2 * quad_lane + e;
            if (key < begin || key >= end) p[4 * j + 2 * half + e] = 0.0f;
          }
      }
    };
    if (!has_softcap) {
      // P = exp2(S scale_log2 - LSE) while dP is still being computed.
      ptx::wgmma_wait_group<1>();
      ptx::fence_operands(s);
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& value = s[4 * j + 2 * half + e];
            value = ptx::exp2_approx_ftz(fmaf(value, scale_log2, -row_lse[half]));
          }
      if (needs_mask) apply_mask(s);
      ptx::wgmma_wait_group<0>();
      ptx::fence_operands(dp);
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int index = 4 * j + 2 * half + e;
            dp[index] = s[index] * (dp[index] - row_dsum[half]);
          }
    } else {
      // Softcap: P = exp2(c tanh(scale S / c) log2(e) - LSE), dS also needs 1 - tanh².
      ptx::wgmma_wait_group<0>();
      ptx::fence_operands(s);
      ptx::fence_operands(dp);
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int index = 4 * j + 2 * half + e;
            const float capped = tanhf(s[index] * softcap_input_scale);
            s[index] = ptx::exp2_approx_ftz(capped * softcap_scale_log2 - row_lse[half]);
            dp[index] = (dp[index] - row_dsum[half]) * (1.0f - capped * capped);
          }
      if (needs_mask) apply_mask(s);
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) dp[i] *= s[i];
    }

    // P and dS (16-bit) into their (queries, keys) panels: row r, 16-byte chunk c of the
    // row at r * 128 + ((c ^ (r % 8)) * 16); this thread's pair of keys 8 j + 2 quad_lane
    // of its consumer is chunk 4 consumer + j (kKeys = 32), bytes 4 quad_lane inside it.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_row0 + 8 * half;
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) {
        const int chunk = key_column0 / 8 + j;
        const int offset = row * 128 + ((chunk ^ (row % 8)) * 16) + quad_lane * 4;
        *reinterpret_cast<std::uint32_t*>(shared_p + offset) = pack_pair<T>(s[4 * j + 2 * half], s[4 * j + 2 * half + 1]);
        *reinterpret_cast<std::uint32_t*>(shared_ds + offset) = pack_pair<T>(dp[4 * j + 2 * half], dp[4 * j + 2 * half + 1]);
      }
    }
    // Both consumers' halves of P and dS written and visible to the async proxy.
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(1, kConsumerThreads);

    // dV[:, cols] += P^T dO[:, cols], dK[:, cols] += dS^T Q[:, cols] (depth kBlockM queries);
    // dQ[:, cols] = dS K[:, cols] (depth kBlockN keys).
    const std::uint64_t do_as_b_mn =
        make_smem_descriptor(do_address + column_panels_offset, kBlockM * 128, 1024, SwizzleMode::bytes128);
    const std::uint64_t q_as_b_mn =
        make_smem_descriptor(q_address + column_panels_offset, kBlockM * 128, 1024, SwizzleMode::bytes128);
    float dq[kColumns / 2];
    ptx::fence_operands(dv);
    ptx::fence_operands(dk);
    ptx::wgmma_fence();
#pragma unroll
    for (int kq = 0; kq < kBlockM / 16; ++kq)
      ptx::wgmma_ss<kColumns, kIsBf16, 1, 1>(dv, p_as_a_mn + mn_step_offset(kq), do_as_b_mn + mn_step_offset(kq), 1);
#pragma unroll
    for (int kq = 0; kq < kBlockM / 16; ++kq)
      ptx::wgmma_ss<kColumns, kIsBf16, 1, 1>(dk, ds_as_a_mn + mn_step_offset(kq), q_as_b_mn + mn_step_offset(kq), 1);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      ptx::wgmma_ss<kColumns, kIsBf16, 1, 0>(dq, ds_as_a + k_step_offset(kk, kBlockM), k_as_b_mn + mn_step_offset(kk),
                                             kk > 0 ? 1 : 0);
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
    ptx::fence_operands(dq);
    ptx::fence_operands(dv);
    ptx::fence_operands(dk);
    // Both consumers are done reading this stage's Q and dO and the P and dS tiles.
    ptx::named_barrier_sync(2, kConsumerThreads);

    // The step's dQ tile (kBlockM, kHeadDim) fp32 over the stage, rows of kHeadDim floats.
    float* staging = shared_dq(stage);
#pragma unroll
    for (int j = 0; j < kColumns / 8; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp_row0 + 8 * half;
        const int column = column0 + 8 * j + 2 * quad_lane;
        *reinterpret_cast<float2*>(staging + row * kHeadDim + column) =
            make_float2(dq[4 * j + 2 * half], dq[4 * j + 2 * half + 1]);
      }
    ptx::fence_proxy_async_shared();
    __syncwarp();
    if (lane == 0) ::cuda::ptx::mbarrier_arrive(&dq_staged[stage]);
  }

  // dK = scale * dS^T Q and dV, straight from the accumulators: key rows < kv_rows.
  T* dk_out = static_cast<T*>(attention.dk) + attention.dk_offset(batch, head_kv) + n0 * attention.dk_row_stride;
  T* dv_out = static_cast<T*>(attention.dv) + attention.dv_offset(batch, head_kv) + n0 * attention.dv_row_stride;
  const float scale = attention.softmax_scale;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = warp_row0 + 8 * half;
    if (row >= kv_rows) continue;
#pragma unroll
    for (int j = 0; j < kColumns / 8; ++j) {
      const int column = column0 + 8 * j + 2 * quad_lane;
      *reinterpret_cast<std::uint32_t*>(dk_out + row * attention.dk_row_stride + column) =
          pack_pair<T>(dk[4 * j + 2 * half] * scale, dk[4 * j + 2 * half + 1] * scale);
      *reinterpret_cast<std::uint32_t*>(dv_out + row * attention.dv_row_stride + column) =
          pack_pair<T>(dv[4 * j + 2 * half], dv[4 * j + 2 * half + 1]);
    }
  }
#endif
}

// Launches backward_kernel_sm90_wide with kConfig's tiles for already checked params
// (why_unsupported empty). No allocation, no synchronisation.
template <class T, HopperBwdWideConfig kConfig, bool kDeterministic>
void launch_backward_sm90_wide(const HopperBackwardParams& params, cudaStream_t stream) {
  if (params.backward.deterministic != kDeterministic || (kDeterministic && params.workspace.dq_semaphore == nullptr))
    throw Error("flashattn: cuda backward: wide Hopper kernel instantiated for the other deterministic mode");
  static std::atomic<std::uint64_t> opted_in_devices{0};
  launch_per_key_block(
      backward_kernel_sm90_wide<T, kConfig.kernel_head_dim, kConfig.block_m, kConfig.block_n, kConfig.stages, kDeterministic>,
      opted_in_devices, params, kConfig.block_n, kConfig.threads(), kConfig.shared_bytes(), stream);
}

// What a generated translation unit instantiates for a wide head dim.
template <class T, int kHeadDim, bool kDeterministic>
void run_backward_sm90_wide(const HopperBackwardParams& params, cudaStream_t stream) {
  constexpr HopperBwdWideConfig kConfig = hopper_bwd_wide_tile_config(kHeadDim);
  static_assert(kConfig.kernel_head_dim == kHeadDim, "no wide Hopper backward tile config for this head dim");
  launch_backward_sm90_wide<T, kConfig, kDeterministic>(params, stream);
}

}  // namespace flashattn::cuda::hopper_bwd
