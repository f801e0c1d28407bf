// src/cuda/hopper_bwd/launch.hpp — the Hopper (sm_90a) backward kernel's entry points.
//
// It replaces only the dK/dV(+dQ) kernel of the backward pass (src/cuda/bwd/): the
// preprocess (LSE in log2 units, D = rowsum(dO ∘ O), dq_accum and, deterministic, the
// dQ semaphores zeroed) and the dQ conversion stay, and so does the workspace
// (src/cuda/bwd/workspace.hpp). In both modes.
// Including this header compiles no kernel; one explicit instantiation per (dtype,
// kernel head dim) lives in src/cuda/hopper_bwd/instantiations/ (generated).
#pragma once

#include <cuda.h>  // CUtensorMap (a plain 128-byte struct; libcuda is never linked)
#include <cuda_runtime.h>

#include <string>

#include "src/core/params.hpp"
#include "src/cuda/bwd/workspace.hpp"
#include "src/cuda/hopper/tile_order.hpp"
#include "src/cuda/hopper_bwd/tile_config.hpp"

namespace flashattn::cuda::hopper_bwd {

struct HopperBackwardParams {
  BackwardParams backward;
  bwd::Workspace workspace;
  // 4-D maps (head_dim, rows, heads, batch) as in the Hopper forward; varlen tensors
  // have one batch entry. Rows outside the tensor arrive as zeros.
  CUtensorMap q_map;     // box rows block_m
  CUtensorMap dout_map;  // box rows block_m
  CUtensorMap k_map;     // box rows block_n
  CUtensorMap v_map;     // box rows block_n
  // ALiBi's affine form on steps off the diagonal (common/alibi_path.hpp).
  bool is_alibi_affine = true;
  // The key-interval pass of listed partial tiles (kernel.cuh): are_mask_key_intervals_enabled
  // and a listed walk of a block mask without bits (set by backward_main).
  bool is_mask_key_intervals = false;
  // Dropout: each Philox draw of a step made once, by one of the two warps that use it
  // (kernel.cuh's draw exchange; the default, FLASHATTN_CUDA_HOPPER_BWD_DROPOUT_DRAW=twice off).
  bool is_dropout_draw_once = false;
  // The overlapped schedules' dQ hand-off (kernel.cuh): true (late, the default) fences the
  // staged dQ part and arrives on kDqFull after the next step's S^T and dP^T issue (a tile's
  // last step at once); false (early, FLASHATTN_CUDA_HOPPER_BWD_DQ_HANDOFF=early) right after
  // its stores.
  bool is_dq_handoff_late = false;
  // The overlapped schedule's dQ reductions (kernel.cuh, not the wide kernel): fp32 map
  // (head_dim, dq rows of a head, heads_q, 1) over workspace.dq_accum, box (32 columns, 64
  // rows, 1, 1), 128-byte swizzle; zero when unused.
  CUtensorMap dq_accum_map;
  // The dK/dV epilogue through shared memory and TMA stores (kernel.cuh, the overlapped and
  // deferred_dk schedules; FLASHATTN_CUDA_HOPPER_BWD_EPILOGUE=tma): maps (head_dim, rows,
  // heads_kv, batch) over dk and dv as q_map's, box 64 rows (a consumer's keys); zero and
  // is_epilogue_tma false otherwise (the accumulators stored from registers).
  CUtensorMap dk_map;
  CUtensorMap dv_map;
  bool is_epilogue_tma = false;
  // Which (key block, kv head, sequence) tile t is (pipeline.cuh: cta_key_block):
  // hopper::TileOrder over (key blocks) x (heads_kv x batch), flat or in L2 sections.
  hopper::TileOrder key_block_order;
  // kernel.cuh's grid (host only): 0 = one CTA per tile; n > 0 = at most n CTAs, each
  // looping over tiles (persistent_grid). The wide kernel ignores it.
  int grid_ctas = 0;
  // The persistent grid's dynamic claims (kernel.cuh, FLASHATTN_CUDA_HOPPER_BWD_GRID=dynamic):
  // the workspace's tile counter, zeroed by the preprocess; null: the static walk (CtaTiles).
  std::int32_t* maybe_tile_counter = nullptr;
};

// The schedule kernel.cuh runs (tile_config.hpp): FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE=
// overlapped selects FA3's order, =deferred_dk that with dK a step later (d128, default
// mode), anything else (or unset) lockstep; read once per process.
BackwardSchedule backward_schedule();

// The CTAs' order (both kernels): key block fastest (flat, the default), or, with
// FLASHATTN_CUDA_HOPPER_BWD_ORDER=l2_sections, FA3's backward order: the kv heads x
// sequences cut into sections whose Q, dO and dq_accum fit in L2, the key block slowest
// inside a section (first key block first: under a causal mask the longest CTAs first;
// deterministic: last first, the turns' order). Read once per process. The dynamic grid
// (persistent_grid) takes the L2-section order unless FLASHATTN_CUDA_HOPPER_BWD_ORDER=flat.
bool is_l2_section_order_requested();

// The key-interval pass (on by default; FLASHATTN_CUDA_MASKS_BWD_ROW_INTERVALS=0 turns it
// off, read once per process): under a block mask without bits (document ids, band,
// prefix) kernel.cuh makes each key row's allowed-query interval once per tile
// (mask_tables.hpp's key_query_interval, into shared memory) and turns it into a partial
// tile's allowed bits, instead of the fast pass's loads and span tests per partial tile.
// H200, 2026-11-27, vs FlexAttention's backward: window 1.01 -> 1.09x, document 0.84 -> 1.01x.
bool are_mask_key_intervals_enabled();
// Dropout's draws made once per step (HopperBackwardParams::is_dropout_draw_once), the
// default: H200, 2026-11-27, backward with dropout 0.1 +2-7% over drawing twice, the
// dropout-free backward unchanged. FLASHATTN_CUDA_HOPPER_BWD_DROPOUT_DRAW=twice: each of
// the two warps that use a draw makes it.
bool is_dropout_draw_once_enabled();
// The late dQ hand-off (HopperBackwardParams::is_dq_handoff_late), the default:
// FLASHATTN_CUDA_HOPPER_BWD_DQ_HANDOFF=early keeps the hand-off right after the dQ stores.
// Read once per process. Timed +1..8% (H200, TUNING.md "The dQ hand-off and the step decode").
bool is_dq_handoff_late_enabled();
// Tests and the timing tool (bench/gpu/kernels/hopper_bwd_timing.cu --dq-handoff) only: from
// now on in this process the params made take the late (late > 0) or the early (late == 0)
// dQ hand-off instead of the environment's; a negative value restores it.
void override_dq_handoff(int late);
// The dK/dV epilogue (HopperBackwardParams::is_epilogue_tma): FLASHATTN_CUDA_HOPPER_BWD_EPILOGUE=
// tma stages dK and dV in shared memory (the tile's last Q/dO stage, at d128 also the dS^T
// buffers) and one thread per consumer stores them with TMA stores; =registers (the default,
// unset or anything else) stores them from the accumulators. Read once per process.
bool is_epilogue_tma_requested();
// Tests and the timing tool (bench/gpu/kernels/hopper_bwd_timing.cu --epilogues) only: from
// now on in this process is_epilogue_tma_requested returns is_tma (0 or 1) instead of the
// environment's choice; a negative value restores it. Lets one process compare the two.
void override_epilogue_tma(int is_tma);

// kernel.cuh's grid on `device` (head dims 64, 128; the wide kernel keeps one CTA per
// tile) as the override or the environment asks for it (backward_grid: the call's own).
// ctas 0 = one CTA per tile; with FLASHATTN_CUDA_HOPPER_BWD_GRID=
// persistent one CTA per SM, each walking a static share of the tiles (CtaTiles,
// dq_order.hpp), or with =dynamic one CTA per SM, each claiming its next tile from a counter
// in the workspace (heaviest first: launch.cu picks the L2-section order for it). Either way
// a tile's K/V and first Q/dO loads overlap the previous tile's last steps and dK/dV stores
// (kernel.cuh). FLASHATTN_CUDA_HOPPER_BWD_GRID_CTAS=n (tests: many tiles per CTA) caps the
// persistent grids at n CTAs. The environment is read once per process.
struct BackwardGrid {
  int ctas = 0;             // 0: one CTA per tile
  bool is_dynamic = false;  // the counter's claims (ctas > 0 only)
};
BackwardGrid persistent_grid(int device);
// The grid a backward call on `device` takes: the override's or the environment's
// (persistent_grid; FLASHATTN_CUDA_HOPPER_BWD_GRID=per_tile forces one CTA per tile), else
// the problem's: the dynamic grid for causal problems of at most 4k keys without device
// masks or deterministic turns (where it was timed faster), one CTA per tile otherwise.
BackwardGrid backward_grid(const BackwardParams& params, int device);
int persistent_grid_ctas(int device);  // persistent_grid(device).ctas

// Tests and the timing tool (bench/gpu/kernels/hopper_bwd_timing.cu --grids) only: from now
// on in this process persistent_grid returns {min(ctas, SMs), is_dynamic} (ctas 0: one CTA
// per tile) instead of the environment's choice; a negative value restores it. Lets one
// process compare the grids (deterministic mode: bitwise).
void override_persistent_grid_ctas(int ctas, bool is_dynamic = false);

// kDeterministic: the dQ reductions of each query block ordered by key block (needs
// params.backward.deterministic and the workspace's dq_semaphore; see kernel.cuh); in
// `schedule` (params made by make_backward_params for it).
template <class T, int kHeadDim, bool kDeterministic>
void run_backward_sm90(const HopperBackwardParams& params, cudaStream_t stream, BackwardSchedule schedule);

// The wide head dims' kernel (kernel_wide.cuh: d256, the head dim split between the
// consumers); kDeterministic as above.
template <class T, int kHeadDim, bool kDeterministic>
void run_backward_sm90_wide(const HopperBackwardParams& params, cudaStream_t stream);

// Empty when the Hopper backward kernel runs these (validated) params, else why not.
std::string why_unsupported(const BackwardParams& params);

// The kernel's parameters for `config`'s tile rows (the tensor maps' boxes); the
// dq_accum map when `schedule` needs it.
HopperBackwardParams make_backward_params(const BackwardParams& params, const bwd::Workspace& workspace,
                                          const HopperBwdTileConfig& config,
                                          BackwardSchedule schedule = backward_schedule());
HopperBackwardParams make_backward_params(const BackwardParams& params, const bwd::Workspace& workspace,
                                          const HopperBwdWideConfig& config);

// Runs the dK/dV/dQ kernel (between launch_preprocess and launch_convert_dq); the
// caller has checked why_unsupported(params).empty(). `schedule`: kernel.cuh's (head dims
// 64, 128; the timing tool passes both to compare them in one process).
void backward_main(const BackwardParams& params, const bwd::Workspace& workspace, cudaStream_t stream,
                   BackwardSchedule schedule = backward_schedule());

}  // namespace flashattn::cuda::hopper_bwd
