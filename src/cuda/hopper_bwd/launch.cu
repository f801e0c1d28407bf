// src/cuda/hopper_bwd/launch.cu — host side of the Hopper backward: the support
// predicate, the TMA tensor maps, and the dispatch to the generated (dtype, head dim)
// kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "flashattn/error.hpp"
#include "src/cuda/common/alibi_path.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/head_dims.hpp"
#include "src/cuda/hopper/launch.hpp"
#include "src/cuda/hopper_bwd/launch.hpp"
#include "src/cuda/hopper_bwd/tile_config.hpp"
#include "src/cuda/masks/device_mask.hpp"

namespace flashattn::cuda::hopper_bwd {
namespace {

// Head dims of the wide kernel (kernel_wide.cuh) rather than kernel.cuh: its tile table's.
bool is_wide_head_dim(std::int64_t head_dim) {
  return hopper_bwd_wide_tile_config(static_cast<int>(head_dim)).kernel_head_dim == head_dim;
}

bool is_built_head_dim(std::int64_t head_dim) {
  return HopperBackwardHeadDims::contains(head_dim) || HopperBackwardWideHeadDims::contains(head_dim);
}

// FLASHATTN_CUDA_BWD_SM90=0 keeps every backward, deterministic or not, on the
// FA2-class kernels (A/B timing, escape hatch); read once.
bool is_disabled_by_environment() {
  static const bool disabled = [] {
    const char* value = std::getenv("FLASHATTN_CUDA_BWD_SM90");
    return value != nullptr && std::string(value) == "0";
  }();
  return disabled;
}

}  // namespace

BackwardSchedule backward_schedule() {
  static const BackwardSchedule schedule = [] {
    const char* value = std::getenv("FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE");
    const std::string name = value != nullptr ? value : "";
    // Overlapped by default: 1.05-1.14x the lockstep one on the H200 (2026-11-27).
    return name == "lockstep"      ? BackwardSchedule::lockstep
           : name == "deferred_dk" ? BackwardSchedule::deferred_dk
                                   : BackwardSchedule::overlapped;
  }();
  return schedule;
}

bool is_l2_section_order_requested() {
  static const bool requested = [] {
    const char* value = std::getenv("FLASHATTN_CUDA_HOPPER_BWD_ORDER");
    return value != nullptr && std::string(value) == "l2_sections";
  }();
  return requested;
}

// kernel.cuh's draw exchange unless FLASHATTN_CUDA_HOPPER_BWD_DROPOUT_DRAW=twice (read once).
bool is_dropout_draw_once_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("FLASHATTN_CUDA_HOPPER_BWD_DROPOUT_DRAW");
    return value == nullptr || std::string(value) != "twice";
  }();
  return enabled;
}

// The late dQ hand-off unless FLASHATTN_CUDA_HOPPER_BWD_DQ_HANDOFF=early (read once).
bool is_dq_handoff_late_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("FLASHATTN_CUDA_HOPPER_BWD_DQ_HANDOFF");
    return value == nullptr || std::string(value) != "early";
  }();
  return enabled;
}

namespace {
// override_dq_handoff's choice; negative: none (the environment's).
std::atomic<int> dq_handoff_override{-1};
}  // namespace

void override_dq_handoff(int late) { dq_handoff_override.store(late, std::memory_order_relaxed); }
namespace {
std::atomic<int> epilogue_override{-1};  // override_epilogue_tma's choice; negative: none
}  // namespace

bool is_epilogue_tma_requested() {
  static const bool requested = [] {
    const char* value = std::getenv("FLASHATTN_CUDA_HOPPER_BWD_EPILOGUE");
    return value != nullptr && std::string(value) == "tma";
  }();
  const int overridden = epilogue_override.load(std::memory_order_relaxed);
  return overridden >= 0 ? overridden != 0 : requested;
}

void override_epilogue_tma(int is_tma) { epilogue_override.store(is_tma, std::memory_order_relaxed); }

bool are_mask_key_intervals_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("FLASHATTN_CUDA_MASKS_BWD_ROW_INTERVALS");
    return value == nullptr || std::string(value) != "0";
  }();
  return enabled;
}

namespace {

// Multiprocessors of a device, asked once per device index.
int multiprocessor_count(int device) {
  constexpr int kMaxCachedDevices = 64;
  static std::atomic<int> cached[kMaxCachedDevices];
  int count = device >= 0 && device < kMaxCachedDevices ? cached[device].load(std::memory_order_relaxed) : 0;
  if (count == 0) {
    FLASHATTN_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    if (device >= 0 && device < kMaxCachedDevices) cached[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

// FLASHATTN_CUDA_HOPPER_BWD_ORDER=flat: the flat order even under the dynamic grid.
bool is_flat_order_requested() {
  static const bool requested = [] {
    const char* value = std::getenv("FLASHATTN_CUDA_HOPPER_BWD_ORDER");
    return value != nullptr && std::string(value) == "flat";
  }();
  return requested;
}

// The environment's grid: ctas 0 = one CTA per tile, -1 = persistent on every SM, n > 0 =
// persistent with at most n CTAs; nullopt: not set (the problem picks: backward_grid).
std::optional<BackwardGrid> environment_grid() {
  static const std::optional<BackwardGrid> grid = []() -> std::optional<BackwardGrid> {
    const char* value = std::getenv("FLASHATTN_CUDA_HOPPER_BWD_GRID");
    const std::string name = value != nullptr ? value : "";
    if (name == "per_tile") return BackwardGrid{};
    if (name != "persistent" && name != "dynamic") return std::nullopt;
    const char* ctas = std::getenv("FLASHATTN_CUDA_HOPPER_BWD_GRID_CTAS");
    const int cap = ctas != nullptr ? std::atoi(ctas) : 0;
    return BackwardGrid{cap > 0 ? cap : -1, name == "dynamic"};
  }();
  return grid;
}

// override_persistent_grid_ctas's grid; ctas negative: none.
std::atomic<int> grid_override{-1};
std::atomic<bool> dynamic_override{false};

}  // namespace

namespace {

// A grid asked for (ctas -1: every SM) on `device`.
BackwardGrid resident_grid(const BackwardGrid& grid, int device) {
  if (grid.ctas == 0) return {};
  // All CTAs resident at once (one per SM: the kernel's shared memory and registers allow
  // no second), which the deterministic mode's turns need (kernel.cuh).
  const int sms = multiprocessor_count(device);
  return {grid.ctas > 0 && grid.ctas < sms ? grid.ctas : sms, grid.is_dynamic};
}

// The override's or the environment's grid, if either names one.
std::optional<BackwardGrid> requested_grid() {
  const int overridden = grid_override.load(std::memory_order_relaxed);
  if (overridden >= 0) return BackwardGrid{overridden, dynamic_override.load(std::memory_order_relaxed)};
  return environment_grid();
}

}  // namespace

BackwardGrid persistent_grid(int device) { return resident_grid(requested_grid().value_or(BackwardGrid{}), device); }

BackwardGrid backward_grid(const BackwardParams& params, int device) {
  if (const std::optional<BackwardGrid> requested = requested_grid()) return resident_grid(*requested, device);
  // Unasked: the dynamic grid where it was timed faster (H200, 2026-11-27, hopper_bwd/
  // TUNING.md), all at most 4k keys (at 16k the per-tile grid was 0-2.5% faster):
  // - causal problems (no left window), whose per-tile grid leaves SMs idle behind the long
  //   diagonal tiles: +4-9% at 1k, +4-5% at 4k;
  // - block masks, whose key tiles list very unequal numbers of query tiles: N4k d128
  //   causal +1.5%, sliding window +3%, document +4%;
  // - the deterministic turns without any mask: +10-73% (the per-tile grid's CTAs wait for
  //   their turn while later tiles cannot start); causal deterministic lost (0.41-0.84x).
  // Not under a dense attn_mask (not timed).
  if (params.seqlen_k > 4096 || params.has_attn_mask()) return BackwardGrid{};
  const bool is_causal_prefix = params.is_causal && params.window_left < 0;
  const bool is_unmasked = !params.is_causal && params.window_left < 0 && params.window_right < 0 &&
                           !params.has_block_mask();
  const bool is_dynamic = params.deterministic ? is_unmasked : is_causal_prefix || params.has_block_mask();
  return is_dynamic ? resident_grid(BackwardGrid{-1, true}, device) : BackwardGrid{};
}

int persistent_grid_ctas(int device) { return persistent_grid(device).ctas; }

void override_persistent_grid_ctas(int ctas, bool is_dynamic) {
  dynamic_override.store(is_dynamic, std::memory_order_relaxed);
  grid_override.store(ctas, std::memory_order_relaxed);
}

namespace {

template <class T, bool kDeterministic>
void run_for_head_dim(const HopperBackwardParams& params, cudaStream_t stream, BackwardSchedule schedule) {
  const std::int64_t d = params.backward.head_dim;
  const bool ran =
      HopperBackwardHeadDims::visit(d, [&](auto head_dim) {
        run_backward_sm90<T, decltype(head_dim)::value, kDeterministic>(params, stream, schedule);
      }) ||
      HopperBackwardWideHeadDims::visit(d, [&](auto head_dim) {
        run_backward_sm90_wide<T, decltype(head_dim)::value, kDeterministic>(params, stream);
      });
  if (!ran)
    throw NotSupported("flashattn: cuda backward: no Hopper backward kernel for head_dim " + std::to_string(d));
}

}  // namespace

std::string why_unsupported(const BackwardParams& params) {
  if (HopperBackwardHeadDims::empty() && HopperBackwardWideHeadDims::empty())
    return "no Hopper backward kernel in this build (needs sm_90a and a head dim of its kernels in FLASHATTN_CUDA_HEAD_DIMS)";
  if (is_disabled_by_environment()) return "disabled by FLASHATTN_CUDA_BWD_SM90=0";
  // Deterministic mode runs here too: the dQ bulk reductions of each query block are
  // ordered by key block (semaphores in the workspace, kernel.cuh); dK/dV are summed in
  // registers in a fixed order in both modes.
  if (hopper::device_compute_capability(params.device.index) != 90) return "not a compute capability 9.0 device";
  if (params.dtype != DType::float16 && params.dtype != DType::bfloat16) return "dtype is not float16/bfloat16";
  // Exact head dims only: dQ goes out as one contiguous bulk reduction per tile.
  if (!is_built_head_dim(params.head_dim)) return "head_dim " + std::to_string(params.head_dim) + " not built";
  if (!bwd::allows_vector_access(params)) return "a pointer or stride is not 16-byte aligned";
  const bool is_varlen = params.is_varlen();
  const std::int64_t rows_q = is_varlen ? params.total_q : params.seqlen_q;
  const std::int64_t rows_k = is_varlen ? params.total_k : params.seqlen_k;
  const std::int64_t batch = is_varlen ? 1 : params.batch;
  using hopper::is_tma_encodable_stride;
  const bool encodable =
      is_tma_encodable_stride(params.q_row_stride, rows_q) && is_tma_encodable_stride(params.q_head_stride, params.heads_q) &&
      is_tma_encodable_stride(params.q_batch_stride, batch) &&
      is_tma_encodable_stride(params.dout_row_stride, rows_q) &&
      is_tma_encodable_stride(params.dout_head_stride, params.heads_q) &&
      is_tma_encodable_stride(params.dout_batch_stride, batch) &&
      is_tma_encodable_stride(params.k_row_stride, rows_k) && is_tma_encodable_stride(params.k_head_stride, params.heads_kv) &&
      is_tma_encodable_stride(params.k_batch_stride, batch) &&
      is_tma_encodable_stride(params.v_row_stride, rows_k) && is_tma_encodable_stride(params.v_head_stride, params.heads_kv) &&
      is_tma_encodable_stride(params.v_batch_stride, batch);
  if (!encodable) return "TMA needs positive q/k/v/dout strides below 2^40 bytes";
  const std::int64_t int32_limit = std::int64_t{1} << 31;
  if (rows_q + 256 >= int32_limit || rows_k + 256 >= int32_limit) return "TMA coordinates are 32-bit: too many rows";
  return {};
}

namespace {

// The maps' boxes: block_m rows of Q/dO, block_n rows of K/V.
HopperBackwardParams make_params_with_boxes(const BackwardParams& params, const bwd::Workspace& workspace,
                                            int block_m, int block_n, bool is_dynamic_grid = false) {
  const bool is_varlen = params.is_varlen();
  const std::int64_t rows_q = is_varlen ? params.total_q : params.seqlen_q;
  const std::int64_t rows_k = is_varlen ? params.total_k : params.seqlen_k;
  const std::int64_t batch = is_varlen ? 1 : params.batch;
  HopperBackwardParams hopper_params{};
  hopper_params.backward = params;
  hopper_params.workspace = workspace;
  hopper_params.is_alibi_affine = is_affine_alibi_enabled();
  hopper_params.is_dropout_draw_once = is_dropout_draw_once_enabled();
  const int dq_handoff = dq_handoff_override.load(std::memory_order_relaxed);
  hopper_params.is_dq_handoff_late = dq_handoff >= 0 ? dq_handoff > 0 : is_dq_handoff_late_enabled();
  // The CTAs' order (launch.hpp). A section's kv heads share their query heads' Q, dO
  // (16-bit) and dq_accum (fp32): 8 d bytes per query row, seqlen_q rows (varlen: the
  // longest sequence), group_size query heads; FA3 budgets 40 MB of L2 for them.
  const std::int64_t num_n_blocks = (params.seqlen_k + block_n - 1) / block_n;
  hopper_params.key_block_order.num_m_blocks = static_cast<std::int32_t>(num_n_blocks);
  hopper_params.key_block_order.num_heads_batches = static_cast<std::int32_t>(params.heads_kv * params.batch);
  // The dynamic grid claims tiles in this order: the L2 sections put the heaviest first
  // (key block 0, the most query blocks under a causal mask; deterministic: the turns'
  // order, the last key block first) unless the flat order is asked for.
  if (is_l2_section_order_requested() || (is_dynamic_grid && !is_flat_order_requested())) {
    const std::int64_t kv_head_bytes = params.group_size * params.seqlen_q * params.head_dim * 8;
    hopper_params.key_block_order.section_heads =
        hopper::l2_section_heads(kv_head_bytes, /*group_size=*/1, std::int64_t{40} << 20);
  }
  using hopper::make_panel_tensor_map;
  // Maps of empty tensors stay zero: the kernel never reads them (no step without query rows).
  if (rows_q > 0) {
    hopper_params.q_map = make_panel_tensor_map("q", params.q, params.dtype, params.head_dim, rows_q, params.heads_q,
                                                batch, params.q_row_stride, params.q_head_stride, params.q_batch_stride,
                                                block_m);
    hopper_params.dout_map = make_panel_tensor_map("dout", params.dout, params.dtype, params.head_dim, rows_q,
                                                   params.heads_q, batch, params.dout_row_stride,
                                                   params.dout_head_stride, params.dout_batch_stride, block_m);
  }
  if (rows_k > 0) {
    hopper_params.k_map = make_panel_tensor_map("k", params.k, params.dtype, params.head_dim, rows_k, params.heads_kv,
                                                batch, params.k_row_stride, params.k_head_stride,
                                                params.k_batch_stride, block_n);
    hopper_params.v_map = make_panel_tensor_map("v", params.v, params.dtype, params.head_dim, rows_k, params.heads_kv,
                                                batch, params.v_row_stride, params.v_head_stride,
                                                params.v_batch_stride, block_n);
  }
  return hopper_params;
}

}  // namespace

HopperBackwardParams make_backward_params(const BackwardParams& params, const bwd::Workspace& workspace,
                                          const HopperBwdTileConfig& config, BackwardSchedule schedule) {
  const BackwardGrid grid = backward_grid(params, params.device.index);
  // The dynamic grid needs the workspace's counter (every carved workspace has one).
  const bool is_dynamic = grid.ctas > 0 && grid.is_dynamic && workspace.maybe_tile_counter != nullptr;
  HopperBackwardParams hopper_params =
      make_params_with_boxes(params, workspace, config.block_m, config.block_n, is_dynamic);
  hopper_params.grid_ctas = grid.ctas;
  if (is_dynamic) hopper_params.maybe_tile_counter = workspace.maybe_tile_counter;
  // dq_accum as (head_dim, rows of a head, heads_q, 1) fp32 (bwd/workspace.hpp: row
  // h * dq_head_stride + packed row): the overlapped schedule's TMA reductions of one
  // consumer's 32-column panels (64 rows each). Its rows are below total_q + kMaxBlockM,
  // which why_unsupported keeps below 2^31 (32-bit coordinates).
  const std::int64_t rows_q = params.is_varlen() ? params.total_q : params.seqlen_q;
  if (schedule != BackwardSchedule::lockstep && rows_q > 0 && workspace.dq_accum != nullptr) {
    hopper_params.dq_accum_map = hopper::make_panel_tensor_map(
        "dq_accum", workspace.dq_accum, DType::float32, params.head_dim, workspace.dq_head_stride, params.heads_q, 1,
        params.head_dim, workspace.dq_head_stride * params.head_dim, 0, kDqPanelRows, kDqPanelColumns * 4);
  }
  // The TMA epilogue (kernel.cuh): dk and dv as the kernel's 64-row bands (a consumer's keys).
  // The lockstep schedule and strides the TMA cannot take keep the stores from registers.
  const bool is_varlen = params.is_varlen();
  const std::int64_t rows_k = is_varlen ? params.total_k : params.seqlen_k;
  const std::int64_t batch = is_varlen ? 1 : params.batch;
  using hopper::is_tma_encodable_stride;
  const bool is_output_encodable =
      is_tma_encodable_stride(params.dk_row_stride, rows_k) &&
      is_tma_encodable_stride(params.dk_head_stride, params.heads_kv) &&
      is_tma_encodable_stride(params.dk_batch_stride, batch) &&
      is_tma_encodable_stride(params.dv_row_stride, rows_k) &&
      is_tma_encodable_stride(params.dv_head_stride, params.heads_kv) &&
      is_tma_encodable_stride(params.dv_batch_stride, batch) &&
      reinterpret_cast<std::uintptr_t>(params.dk) % 16 == 0 && reinterpret_cast<std::uintptr_t>(params.dv) % 16 == 0;
  if (is_epilogue_tma_requested() && schedule != BackwardSchedule::lockstep && rows_k > 0 && is_output_encodable) {
    hopper_params.dk_map = hopper::make_panel_tensor_map("dk", params.dk, params.dtype, params.head_dim, rows_k,
                                                         params.heads_kv, batch, params.dk_row_stride,
                                                         params.dk_head_stride, params.dk_batch_stride,
                                                         kKeysPerConsumer);
    hopper_params.dv_map = hopper::make_panel_tensor_map("dv", params.dv, params.dtype, params.head_dim, rows_k,
                                                         params.heads_kv, batch, params.dv_row_stride,
                                                         params.dv_head_stride, params.dv_batch_stride,
                                                         kKeysPerConsumer);
    hopper_params.is_epilogue_tma = true;
  }
  return hopper_params;
}

HopperBackwardParams make_backward_params(const BackwardParams& params, const bwd::Workspace& workspace,
                                          const HopperBwdWideConfig& config) {
  return make_params_with_boxes(params, workspace, config.block_m, config.block_n);
}

void backward_main(const BackwardParams& params, const bwd::Workspace& workspace, cudaStream_t stream,
                   BackwardSchedule schedule) {
  // No keys: no dK/dV to write, dQ stays the zeroed accumulator (a dBias, whose rows may
  // broadcast over the keys, is still written: zeros; masks are never varlen, so no
  // CTA runs then). No query rows: the kernel runs no step and writes dK = dV = 0.
  const std::int64_t rows_k = params.is_varlen() ? params.total_k : params.seqlen_k;
  if (rows_k == 0 && params.maybe_dbias == nullptr) return;
  const int head_dim = static_cast<int>(params.head_dim);
  const bool is_wide = is_wide_head_dim(head_dim);
  HopperBackwardParams hopper_params =
      is_wide ? make_backward_params(params, workspace, hopper_bwd_wide_tile_config(head_dim))
              : make_backward_params(params, workspace, hopper_bwd_tile_config(head_dim), schedule);
  // Masks beyond MaskRule: the key tiles' lists of query tiles at the kernel's tiles; the
  // deterministic turns also need the query tiles' lists (kernel.cuh). The tables are
  // freed stream-ordered after the kernels.
  const int block_m = is_wide ? hopper_bwd_wide_tile_config(head_dim).block_m : hopper_bwd_tile_config(head_dim).block_m;
  const int block_n = is_wide ? hopper_bwd_wide_tile_config(head_dim).block_n : hopper_bwd_tile_config(head_dim).block_n;
  const masks::MaskTables tables =
      masks::prepare(params, {block_m, block_n, /*by_query_tile=*/params.deterministic, /*by_key_tile=*/true}, stream);
  tables.bind(hopper_params.backward);
  const DeviceMask& device_mask = hopper_params.backward.device_mask;
  if (device_mask.present() && (!device_mask.by_key_tile.present() ||
                                (params.deterministic && !device_mask.by_query_tile.present())))
    throw Error("flashattn: cuda backward: the Hopper kernels' mask tables lack the lists they walk");
  // The key-interval pass (kernel.cuh) where it applies: a listed walk of a block mask
  // without bits. One flag, so that the kernel tests one uniform bool per partial step.
  hopper_params.is_mask_key_intervals = are_mask_key_intervals_enabled() && device_mask.by_key_tile.present() &&
                                        params.has_block_mask() && !params.block_mask.rule.has_bits();
  if (params.deterministic) {
    if (params.dtype == DType::bfloat16) {
      run_for_head_dim<__nv_bfloat16, true>(hopper_params, stream, schedule);
    } else {
      run_for_head_dim<__half, true>(hopper_params, stream, schedule);
    }
  } else if (params.dtype == DType::bfloat16) {
    run_for_head_dim<__nv_bfloat16, false>(hopper_params, stream, schedule);
  } else {
    run_for_head_dim<__half, false>(hopper_params, stream, schedule);
  }
  masks::finish_dbias(params, tables, stream);
}

}  // namespace flashattn::cuda::hopper_bwd
