// src/cuda/hopper_bwd/pipeline.cuh — what both Hopper backward kernels (kernel.cuh,
// kernel_wide.cuh) share of their hardware mapping: the producer's TMA loads (LSE/D
// rows; the K/V block and a step's Q/dO tiles through common/tma_panels.cuh), the walk of
// a key block's query tiles under a device mask (src/core/mask_tables.hpp), the deterministic
// mode's ordered dQ addition, and the launch (one CTA per key block x kv head x
// sequence, with the shared-memory opt-in).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cuda/ptx>
#include <string>

#include "flashattn/error.hpp"
#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/core/mask_tables.hpp"
#include "src/core/params.hpp"
#include "src/cuda/bwd/workspace.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/common/mask_fragment.cuh"
#include "src/cuda/common/tma_panels.cuh"
#include "src/cuda/hopper_bwd/dq_order.hpp"
#include "src/cuda/hopper_bwd/launch.hpp"
#include "src/cuda/hopper_bwd/tile_config.hpp"
#include "src/cuda/ptx/bulk_reduce.cuh"
#include "src/cuda/ptx/semaphore.cuh"
#include "src/cuda/ptx/arch.cuh"  // FLASHATTN_HOPPER_DEVICE_CODE
#include "src/cuda/ptx/mbarrier.cuh"

namespace flashattn::cuda::hopper_bwd {

#if FLASHATTN_HOPPER_DEVICE_CODE
// The K/V block and a step's Q/dO tiles: load_panels (common/tma_panels.cuh).

// Whole padded rows of LSE and D (bwd/workspace.hpp: 16-byte aligned, +inf / 0 past the
// sequence) from statistics row `stats_row`, `bytes` each, completing on `barrier`.
__device__ __forceinline__ void load_statistics(float* lse, float* dsum, const bwd::Workspace& workspace,
                                                std::int64_t stats_row, int bytes, std::uint64_t* barrier) {
  ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, lse, workspace.lse_log2 + stats_row,
                             bytes, barrier);
  ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, dsum, workspace.dsum + stats_row,
                             bytes, barrier);
}

// ---- the CTA's key block ------------------------------------------------------------
struct KeyBlockCoordinates {
  std::int64_t n_block, head_kv, batch;
};

// The (key block, kv head, sequence) of tile `tile` in params.key_block_order
// (dq_order.hpp: key_block_of_cta): blockIdx.x in a per-tile grid; kernel.cuh's persistent
// grid walks blockIdx.x, + gridDim.x, ...
template <bool kDeterministic>
__device__ __forceinline__ KeyBlockCoordinates cta_key_block(const HopperBackwardParams& params, std::int32_t tile) {
  const KeyBlockOfCta cta = key_block_of_cta(params.key_block_order, tile, kDeterministic);
  // 32-bit division (heads_kv x batch is an int32 tile count): a 64-bit one is a call, which
  // in a loop over tiles made its callers spill (kernel.cuh's loads: 24 registers).
  const auto heads_kv = static_cast<std::int32_t>(params.backward.heads_kv);
  return {cta.n_block, cta.head_batch % heads_kv, cta.head_batch / heads_kv};
}

// ---- a device mask: the steps come from the key tile's lists -----------------------
// With params.device_mask.by_key_tile present a CTA's steps are, for each query head of
// its group (ascending), the query tiles its key tile's list names (in list order:
// descending), instead of an interval of query blocks. The producer walks the lists
// (ListedSteps) and writes each step into its stage's slot before the stage's loads; the
// consumers read the slot after waiting on the stage's "full" mbarrier (whose arrival
// releases the write), so both sides see the same steps without the consumers holding a
// cursor in registers. A slot is rewritten only after the stage is released again
// (kernel.cuh: "empty"; kernel_wide.cuh: "dq_staged", after the producer's reduction of
// the step, which reads the slot too).
struct ListedStep {
  std::int32_t head_q;
  std::int32_t m_block;
  std::int32_t is_partial;  // the tile's scores need the element pass (the interval path: a boundary tile, the element mask)
  std::int32_t code;        // a partial tile's tile code (mask_tables.hpp): the fast pass unless kGeneralTile
};
// The slots live in the 256 bytes reserved for the mbarriers, from this offset.
inline constexpr int kListedStepSlotsOffset = 128;

class ListedSteps {
 public:
  // The steps of key tile n_block for query heads [first_head, first_head + heads) of `batch`.
  __device__ ListedSteps(const TileLists& lists, std::int64_t batch, std::int64_t first_head, std::int64_t heads,
                         std::int64_t n_block)
      : lists_(lists), batch_(batch), first_head_(first_head), heads_(lists.present() ? heads : 0), n_block_(n_block) {
    if (heads_ == 0) return;  // no lists (the interval path): inert, never read
    list_ = lists_.list(batch_, first_head_, n_block_);
    count_ = lists_.count(list_);
    skip_finished_lists();
  }
  // How many steps the walk has (the producer and every consumer compute it alike).
  __device__ static int total(const TileLists& lists, std::int64_t batch, std::int64_t first_head, std::int64_t heads,
                              std::int64_t n_block) {
    int steps = 0;
    for (std::int64_t head = 0; head < heads; ++head) steps += lists.count(lists.list(batch, first_head + head, n_block));
    return steps;
  }
  // The current step, then moves to the next; call at most total() times.
  __device__ ListedStep next() {
    const TileEntry entry = lists_.entry(list_, index_);
    const ListedStep step{static_cast<std::int32_t>(first_head_ + head_), entry.tile, entry.partial ? 1 : 0,
                          entry.partial ? lists_.code(list_, index_) : kGeneralTile};
    ++index_;
    skip_finished_lists();
    return step;
  }

 private:
  __device__ void skip_finished_lists() {
    while (index_ >= count_ && head_ + 1 < heads_) {
      ++head_;
      list_ = lists_.list(batch_, first_head_ + head_, n_block_);
      count_ = lists_.count(list_);
      index_ = 0;
    }
  }
  const TileLists& lists_;
  std::int64_t batch_, first_head_, heads_, n_block_;
  std::int64_t head_ = 0;  // of the group
  std::int64_t list_ = 0;
  std::int32_t count_ = 0, index_ = 0;
};

// One element of a listed partial tile of kGeneralTile, in the kernels' score loop
// (softcap/ALiBi; partial tiles take it whatever the rule; the others are masked after
// the loop by fragment::FragmentMask): the log2 P before the exponential with the element
// pass of fragment::mask_offset applied (-inf when masked; a float attn_mask's bias added
// in log2 units). Not fragment::apply_mask on the positive-scale path beside dP^T in
// flight: there its index arithmetic spilled loop state in every step (72 bytes at d128).
__device__ __forceinline__ float masked_log2_probability(float log2_p, const AttentionParams& params,
                                                         const MaskRule& mask, std::int64_t batch, std::int64_t head_q,
                                                         std::int64_t query, std::int64_t key) {
  const float offset = fragment::mask_offset(params, mask, batch, head_q, query, key);
  return offset == -INFINITY ? -INFINITY : log2_p + offset * static_cast<float>(online_softmax::kLog2e);
}

// dBias += ds for one element (ds in natural-log units; as fragment::accumulate_dbias).
__device__ __forceinline__ void add_dbias(const AttentionParams& params, const MaskRule& mask, std::int64_t batch,
                                          std::int64_t head_q, std::int64_t query, std::int64_t key, float ds) {
  const DeviceMask& device_mask = params.device_mask;
  if (query < mask.seqlen_q && key < mask.seqlen_k && ds != 0.0f)
    atomicAdd(device_mask.maybe_dbias_sum + device_mask.dbias_offset(batch, head_q, query, key), ds);
}

// ---- the key-interval pass (FLASHATTN_CUDA_MASKS_BWD_ROW_INTERVALS; kernel.cuh) -------

// The CTA's kBlockN key intervals: kOffset bytes from the 1024-aligned base of the dynamic
// shared memory (HopperBwdTileConfig::key_interval_offset; the kernel aligns the same way).
template <int kOffset>
__device__ __forceinline__ fragment::RowKeyInterval* shared_key_intervals() {
  extern __shared__ unsigned char shared_storage[];
  const std::uint32_t raw_address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_storage));
  unsigned char* base = shared_storage + ((kSwizzleAtomBytes - raw_address % kSwizzleAtomBytes) % kSwizzleAtomBytes);
  return reinterpret_cast<fragment::RowKeyInterval*>(base + kOffset);
}

// Once per tile, by every consumer thread: the intervals of its two key rows row0 = n0 +
// key_row (key_row < kBlockN - 8) and row0 + 8 (fragment::key_row_query_interval), written
// by lane quad 0 of each row; the warp's rows are its own (it alone reads them; the first
// __syncwarp keeps a persistent CTA's previous tile's reads before these writes).
template <int kBlockN, int kOffset>
__device__ __forceinline__ void store_key_intervals(const HopperBackwardParams& params, const MaskRule mask,
                                                 std::int64_t batch, std::int64_t row0) {
  fragment::RowKeyInterval* intervals = shared_key_intervals<kOffset>();
  const int key_row = static_cast<int>(row0 & (kBlockN - 1));  // n0 is a multiple of kBlockN
  __syncwarp();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const fragment::RowKeyInterval interval =
        fragment::key_row_query_interval(params.backward, mask, batch, row0 + 8 * half);
    if (threadIdx.x % 4 == 0) intervals[key_row + 8 * half] = interval;
  }
  __syncwarp();
}

// A listed partial step's allowed bits (the consumers' step loop, kernel.cuh), as one
// real call whichever pass makes them: the key-interval pass (kOffset >= 0, asked for, a
// partial block id: the two key rows' intervals from shared memory) or the fast pass. The
// choice inside the call keeps the step loop's branch as it was without the pass (a second
// branch there spilled loop state of the overlapped d128 kernel: ptxas -v 16/20 -> 36/32
// bytes under the persistent tile loop).
template <int kNTiles, int kBlockN, int kOffset>
__device__ __noinline__ fragment::AllowedBits<kNTiles> listed_allowed_bits_call(const HopperBackwardParams& params,
                                                                              const MaskRule mask,
                                                                              std::int32_t tile_code, std::int64_t batch,
                                                                              std::int64_t row0, std::int64_t col0) {
  fragment::AllowedBits<kNTiles> allowed;
  if constexpr (kOffset >= 0) {
    if (params.is_mask_key_intervals && tile_code >= 0) {
      const fragment::RowKeyInterval* intervals = shared_key_intervals<kOffset>();
      const int key_row = static_cast<int>(row0 & (kBlockN - 1));  // n0 is a multiple of kBlockN
      const fragment::RowKeyInterval rows[2] = {intervals[key_row], intervals[key_row + 8]};
      fragment::allowed_bits_of_key_intervals<kNTiles>(allowed.words, rows, static_cast<std::int32_t>(col0));
      return allowed;
    }
  }
  fragment::fragment_allowed_bits<kNTiles, true>(allowed.words, params.backward, mask, tile_code, batch, row0, col0);
  return allowed;
}

// Deterministic mode under a device mask: the turn of key tile n_block in query tile
// m_block of head_q = how many key tiles its by_query_tile list names above n_block (the
// lists are sorted by descending tile, the order of the interval turns). The two lists
// are built from one classification of the tile pairs, so n_block is there; if it were
// not, the semaphore protocol would hang: trap instead.
__device__ __forceinline__ std::int32_t listed_turn(const TileLists& by_query_tile, std::int64_t batch,
                                                    std::int64_t head_q, std::int64_t m_block, std::int64_t n_block) {
  const std::int64_t list = by_query_tile.list(batch, head_q, m_block);
  std::int32_t low = 0, high = by_query_tile.count(list);  // the first index whose tile <= n_block
  const std::int32_t count = high;
  while (low < high) {
    const std::int32_t middle = (low + high) / 2;
    if (by_query_tile.entry(list, middle).tile > n_block) low = middle + 1;
    else high = middle;
  }
  if (low == count || by_query_tile.entry(list, low).tile != n_block) __trap();
  return low;
}
// Out of line: kernel.cuh's issuer is a consumer thread, and inlined beside the
// accumulators the search spilled loop state (d64: 40 bytes, d128: 16). kernel_wide.cuh's
// issuer is the producer thread, whose 24 registers do not hold a call's ABI: inline there.
__device__ __noinline__ std::int32_t listed_turn_out_of_line(const TileLists& by_query_tile, std::int64_t batch,
                                                            std::int64_t head_q, std::int64_t m_block,
                                                            std::int64_t n_block) {
  return listed_turn(by_query_tile, batch, head_q, m_block, n_block);
}

// A key block's turn in one dQ tile: the tile's semaphore and the value it waits for.
struct DqTurn {
  std::int32_t* semaphore;
  std::int32_t turn;
};

template <int kBlockM, int kBlockN, bool kTurnOutOfLine>
__device__ __forceinline__ DqTurn dq_turn_of(const BackwardParams& attention, const bwd::Workspace& workspace,
                                             const MaskRule& mask, std::int64_t batch, std::int64_t head_q,
                                             std::int64_t m0, std::int64_t n_block) {
  const std::int64_t m_block = m0 / kBlockM;
  const TileLists& by_query_tile = attention.device_mask.by_query_tile;
  std::int32_t turn;
  if (by_query_tile.present()) {
    turn = kTurnOutOfLine ? listed_turn_out_of_line(by_query_tile, batch, head_q, m_block, n_block)
                          : listed_turn(by_query_tile, batch, head_q, m_block, n_block);
  } else {
    const KeyBlockRange visitors = key_blocks_of_query_block(mask, m_block, kBlockM, kBlockN);
    turn = static_cast<std::int32_t>(visitors.first + visitors.count - 1 - n_block);
  }
  return {workspace.dq_semaphore + workspace.semaphore_index(attention, batch, m_block, kBlockM, head_q), turn};
}

// Waits (acquire) for the turn; then the earlier turns' additions are ordered before ours.
__device__ __forceinline__ void acquire_dq_turn(const DqTurn& turn) {
  ptx::wait_until_equal_acquire_gpu(turn.semaphore, turn.turn);
  ptx::fence_proxy_async_global();
}

// After this thread's reductions of the turn: waits until they are performed in global
// memory and publishes the next turn (release). kNewerGroups: bulk groups this thread has
// committed since (a later turn's reductions), which may stay in flight.
template <int kNewerGroups = 0>
__device__ __forceinline__ void release_dq_turn(const DqTurn& turn) {
  ptx::bulk_wait_group<kNewerGroups>();
  ptx::fence_proxy_async_global();
  __threadfence();
  ptx::store_release_gpu(turn.semaphore, turn.turn + 1);
}

// Deterministic mode (the order and why it cannot deadlock: the top of kernel.cuh): one
// thread adds the staged dQ tile of query rows [m0, m0 + kBlockM) of head_q to dq_accum
// in its key block's turn: it waits (acquire) until the tile's semaphore equals the turn
// (the last visiting key block - n_block, dq_order.hpp; under a device mask the number of
// listed key tiles above n_block, listed_turn), adds, waits until the addition is
// performed in global memory (not only read from shared memory) and publishes the next
// turn (release). kTurnOutOfLine: see listed_turn_out_of_line.
template <int kBlockM, int kBlockN, bool kTurnOutOfLine>
__device__ __forceinline__ void ordered_reduce_add(const BackwardParams& attention, const bwd::Workspace& workspace,
                                                   const MaskRule& mask, std::int64_t batch, std::int64_t head_q,
                                                   std::int64_t m0, std::int64_t n_block, std::uint32_t source,
                                                   int bytes) {
  const DqTurn turn = dq_turn_of<kBlockM, kBlockN, kTurnOutOfLine>(attention, workspace, mask, batch, head_q, m0, n_block);
  acquire_dq_turn(turn);
  ptx::bulk_reduce_add_f32(workspace.dq_accum + workspace.dq_offset(attention, batch, m0, head_q), source, bytes);
  ptx::bulk_commit_group();
  release_dq_turn(turn);
}
#endif

// Launches `kernel` (one tile per key block of block_n keys x kv head x sequence) with
// `shared_bytes` of dynamic shared memory for already checked params: one CTA per tile,
// or with max_ctas > 0 at most max_ctas CTAs, each looping over tiles (kernel.cuh's
// persistent grid; the kernel must loop). Above 48 KB a kernel must opt in, once per
// device: `opted_in_devices` is the kernel's own record. No allocation, no synchronisation.
template <class Kernel>
void launch_per_key_block(Kernel* kernel, std::atomic<std::uint64_t>& opted_in_devices, const HopperBackwardParams& params,
                          int block_n, int threads, int shared_bytes, cudaStream_t stream, int max_ctas = 0) {
  const BackwardParams& attention = params.backward;
  const std::int64_t num_n_blocks = (attention.seqlen_k + block_n - 1) / block_n;
  const std::int64_t num_tiles = num_n_blocks * attention.heads_kv * attention.batch;
  if (num_tiles == 0) return;
  if (num_tiles > INT_MAX)
    throw NotSupported("flashattn: cuda backward: too many key blocks x heads x batch for one launch (" +
                       std::to_string(num_tiles) + ")");
  // The kernel's loop bound is the order's tile count: it must be this grid's.
  if (static_cast<std::int64_t>(params.key_block_order.num_m_blocks) * params.key_block_order.num_heads_batches !=
      num_tiles)
    throw Error("flashattn: cuda backward: the Hopper CTA order was made for other tiles");
  const std::int64_t num_ctas = max_ctas > 0 && max_ctas < num_tiles ? max_ctas : num_tiles;
  int device = 0;
  FLASHATTN_CUDA_CHECK(cudaGetDevice(&device));
  const std::uint64_t device_bit = device < 64 ? (std::uint64_t{1} << device) : 0;
  if (device_bit == 0 || (opted_in_devices.load(std::memory_order_acquire) & device_bit) == 0) {
    FLASHATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
    opted_in_devices.fetch_or(device_bit, std::memory_order_release);
  }
  kernel<<<static_cast<unsigned>(num_ctas), threads, shared_bytes, stream>>>(params);
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda::hopper_bwd
