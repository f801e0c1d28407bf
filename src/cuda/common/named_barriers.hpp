// src/cuda/common/named_barriers.hpp — the named-barrier ids of every kernel family, in
// one place (as FA3's named_barrier.hpp), so no two roles of a kernel share an id by
// accident and no kernel writes a raw id. bar.sync ids are 0..15 per CTA; 0 is
// __syncthreads. The wrappers: ptx/named_barrier.cuh. A family whose barriers come one
// per warpgroup names the first and passes the warpgroup as the index.
#pragma once

namespace flashattn::cuda {

namespace hopper {
// The Hopper forward (hopper/kernel.cuh): per consumer warpgroup c (at most
// kMaxConsumerWarpgroups = 3, hopper/tile_config.hpp; the kernel asserts the ids
// below do not overlap), its epilogue (ids 1..3) and its GEMM turn of the ping-pong
// schedule (ids 4..5: the ping-pong alternates two warpgroups). The persistent kernels'
// tile queue marks with FLASHATTN_CUDA_HOPPER_TILE_QUEUE=late_claim (NamedTileMarks,
// hopper/tile_queue.cuh), one pair per reader (the loader, the storer, then consumer
// warpgroup c) with the scheduler's warp: slot written
// (ids 6..10: the scheduler arrives, the reader waits) and slot read (ids 11..15: the
// reader arrives, the scheduler waits). A pair per reader, so that no reader waits for
// another and every count is a constant.
enum class NamedBarrier : int {
  kConsumerEpilogueFirst = 1,
  kTurnFirst = 4,
  kTileSlotWrittenFirst = 6,
  kTileSlotReadFirst = 11,
};
}  // namespace hopper

namespace hopper_bwd {
// The Hopper backward (hopper_bwd/kernel.cuh), over the consumer warpgroups: dS^T
// written to shared memory for the dQ GEMM; the step's dQ staged (and every consumer's
// dQ GEMM done, so dS^T may be rewritten; lockstep schedule only). The overlapped
// schedule's per-consumer handshake with the dQ-writer warp (one barrier each per
// consumer warpgroup c, 128 + 32 threads): consumer c's dQ staging panels free (the
// writer's reduction has read them: ids 3..4), and staged (ids 5..6).
// kDrawPairFirst + 2·consumer + warp pair: the dropout draw exchange's two warps (4 ids).
// The TMA epilogue of dK/dV (FLASHATTN_CUDA_HOPPER_BWD_EPILOGUE=tma): both consumers done
// reading the tile's last stage and the dS^T buffers (id 11); consumer c's dK/dV staged for
// its storing thread (ids 12..13); consumer c's staged dV read by its TMA store, so its dS^T
// rows may be rewritten (ids 14..15: the storing warp arrives, the other three wait).
enum class NamedBarrier : int {
  kDsWritten = 1,
  kDqStaged = 2,
  kDqEmptyFirst = 3,
  kDqFullFirst = 5,
  kDrawPairFirst = 7,
  kEpilogueStageFree = 11,
  kEpilogueStagedFirst = 12,
  kEpilogueReadFirst = 14,
};
// The wide (d256) Hopper backward (hopper_bwd/kernel_wide.cuh), over both consumers:
// both halves of P and dS written (and fenced for the async proxy); both consumers
// done reading the stage's Q, dO and the P, dS tiles.
enum class WideNamedBarrier : int { kPAndDsWritten = 1, kStageRead = 2 };
}  // namespace hopper_bwd

namespace hopper_fp8 {
// The FP8 Hopper forward (hopper_fp8/kernel.cuh): over the producer warpgroup, at d64
// the in-place V transpose reads the whole V tile into registers before any warp writes
// Vt over it (no smaller set of its blocks is closed under the transposition); per
// consumer warpgroup c (two), its GEMM turn of the ping-pong schedule (ids 2..3).
enum class NamedBarrier : int { kVTileRead = 1, kTurnFirst = 2 };
}  // namespace hopper_fp8
namespace decode {
// The sm_90 decode kernel (decode/kernel_tma.cuh), over the consumer warps: the query
// tile is in shared memory.
enum class NamedBarrier : int { kQueryStaged = 1 };
}  // namespace decode

}  // namespace flashattn::cuda
