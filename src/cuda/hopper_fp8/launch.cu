// src/cuda/hopper_fp8/launch.cu — host side of the FP8 Hopper forward: the support
// predicate, the e4m3 TMA tensor maps, and the dispatch to the generated head-dim kernels.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "flashattn/error.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/head_dims.hpp"
#include "src/cuda/hopper/launch.hpp"  // device_compute_capability, the TMA map encoder and its stride rule
#include "src/cuda/hopper_fp8/launch.hpp"
#include "src/cuda/hopper_fp8/tile_config.hpp"

namespace flashattn::cuda::hopper_fp8 {
namespace {

// A stride of e4m3 elements (= bytes) the tensor maps encode (hopper/launch.cu's rule).
bool is_encodable_stride(std::int64_t stride_bytes, std::int64_t extent) {
  return hopper::is_tma_encodable_stride(stride_bytes, extent, /*element_bytes=*/1);
}

// 4-D map (head_dim, rows, heads, batch) over one e4m3 tensor, box (panel_bytes, box_rows).
CUtensorMap make_tensor_map(const char* name, const void* data, std::int64_t head_dim, std::int64_t rows,
                            std::int64_t heads, std::int64_t batch, std::int64_t row_stride, std::int64_t head_stride,
                            std::int64_t batch_stride, int panel_bytes, int box_rows) {
  return hopper::make_panel_tensor_map(name, data, DType::float8_e4m3, head_dim, rows, heads, batch, row_stride,
                                       head_stride, batch_stride, box_rows, panel_bytes);
}

// `schedule` as asked for: run_forward_fp8 launches kernel_schedule(schedule)'s kernel,
// whose tile config is `config`; the in_place_overlap kernel reads whether it was asked
// to take turns (in_place_overlap_ping_pong).
Fp8ForwardParams make_fp8_forward_params(const AttentionParams& params, Fp8Schedule schedule, Fp8Rescale rescale,
                                         const Fp8TileConfig& config) {
  const bool is_varlen = params.is_varlen();
  const std::int64_t rows_q = is_varlen ? params.total_q : params.seqlen_q;
  const std::int64_t rows_k = is_varlen ? params.total_k : params.seqlen_k;
  const std::int64_t batch = is_varlen ? 1 : params.batch;
  Fp8ForwardParams fp8_params{};
  fp8_params.attention = params;
  fp8_params.schedule = schedule;
  fp8_params.rescale = rescale;
  if (rows_q == 0 || batch == 0 || params.heads_q == 0) return fp8_params;
  const int panel_bytes = config.panel_bytes();
  fp8_params.q_map = make_tensor_map("q", params.q, params.head_dim, rows_q, params.heads_q, batch, params.q_row_stride,
                                     params.q_head_stride, params.q_batch_stride, panel_bytes, config.block_m);
  if (rows_k == 0) return fp8_params;
  fp8_params.k_map = make_tensor_map("k", params.k, params.head_dim, rows_k, params.heads_kv, batch, params.k_row_stride,
                                     params.k_head_stride, params.k_batch_stride, panel_bytes, config.block_n);
  fp8_params.v_map = make_tensor_map("v", params.v, params.head_dim, rows_k, params.heads_kv, batch, params.v_row_stride,
                                     params.v_head_stride, params.v_batch_stride, panel_bytes, config.block_n);
  return fp8_params;
}

void run_for_head_dim(int kernel_head_dim, const Fp8ForwardParams& params, cudaStream_t stream) {
  const bool ran = HopperFp8HeadDims::visit(
      kernel_head_dim, [&](auto head_dim) { run_forward_fp8<decltype(head_dim)::value>(params, stream); });
  if (!ran)
    throw NotSupported("flashattn: q: head_dim " + std::to_string(params.attention.head_dim) +
                       ": no FP8 Hopper kernel was built for it (kernel head dim " + std::to_string(kernel_head_dim) + ")");
}

}  // namespace

bool is_built() { return !HopperFp8HeadDims::empty(); }

int kernel_head_dim_for(std::int64_t head_dim) { return HopperFp8HeadDims::smallest_holding(head_dim); }

// Each refusal starts with the argument it is about (the API's names).
std::string why_unsupported(const AttentionParams& params) {
  if (!params.is_fp8())
    return std::string("q: the FP8 forward runs float8_e4m3fn q/k/v, got ") + dtype_name(params.input_dtype);
  if (params.dtype != DType::bfloat16 && params.dtype != DType::float16)
    return std::string("out: the FP8 forward writes bfloat16 or float16, got ") + dtype_name(params.dtype);
  if (!is_built())
    return "q: this library has no FP8 Hopper kernel (it needs sm_90a among CMAKE_CUDA_ARCHITECTURES and head dim "
           "64, 128 or 256 in FLASHATTN_CUDA_HEAD_DIMS)";
  const int capability = hopper::device_compute_capability(params.device.index);
  if (capability != 90)
    return "q: the FP8 forward runs on compute capability 9.0 (Hopper) only; device " +
           std::to_string(params.device.index) + " has " + std::to_string(capability / 10) + "." +
           std::to_string(capability % 10);
  if (params.head_dim % 16 != 0 || kernel_head_dim_for(params.head_dim) == 0)
    return "q: the FP8 forward has no kernel for head_dim " + std::to_string(params.head_dim) +
           " in this build (multiples of 16 up to the largest built of 64, 128, 256)";
  if (params.has_dropout()) return "dropout_p: the FP8 forward has no dropout";
  if (params.has_attn_mask()) return "attn_mask: the FP8 forward takes no dense mask";
  if (params.has_block_mask()) return "block_mask: the FP8 forward takes no block-sparse mask";
  if (params.is_paged()) return "block_table: the FP8 forward takes no paged K/V";
  const bool is_varlen = params.is_varlen();
  const std::int64_t rows_q = is_varlen ? params.total_q : params.seqlen_q;
  const std::int64_t rows_k = is_varlen ? params.total_k : params.seqlen_k;
  const std::int64_t batch = is_varlen ? 1 : params.batch;
  // An empty tensor is never read, so its strides (often 0) need not be encodable.
  const bool is_q_empty = rows_q == 0 || batch == 0 || params.heads_q == 0;
  const bool is_k_empty = is_q_empty || rows_k == 0;
  if (!is_q_empty && !(is_encodable_stride(params.q_row_stride, rows_q) &&
                       is_encodable_stride(params.q_head_stride, params.heads_q) &&
                       is_encodable_stride(params.q_batch_stride, batch)))
    return "q: the FP8 forward's TMA needs positive strides that are multiples of 16 bytes";
  if (!is_k_empty && !(is_encodable_stride(params.k_row_stride, rows_k) &&
                       is_encodable_stride(params.k_head_stride, params.heads_kv) &&
                       is_encodable_stride(params.k_batch_stride, batch)))
    return "k: the FP8 forward's TMA needs positive strides that are multiples of 16 bytes";
  if (!is_k_empty && !(is_encodable_stride(params.v_row_stride, rows_k) &&
                       is_encodable_stride(params.v_head_stride, params.heads_kv) &&
                       is_encodable_stride(params.v_batch_stride, batch)))
    return "v: the FP8 forward's TMA needs positive strides that are multiples of 16 bytes";
  const std::int64_t int32_limit = std::int64_t{1} << 31;
  if (rows_q + 256 >= int32_limit || rows_k + 256 >= int32_limit)
    return "q: the FP8 forward's TMA coordinates are 32-bit: too many rows";
  return {};
}

bool supports(const AttentionParams& params) { return why_unsupported(params).empty(); }

Fp8Schedule default_schedule(int kernel_head_dim, std::int64_t seqlen_k) {
  static const std::optional<Fp8Schedule> requested = []() -> std::optional<Fp8Schedule> {
    const char* value = std::getenv("FLASHATTN_CUDA_FP8_SCHEDULE");
    if (value != nullptr)
      for (const Fp8Schedule candidate : kFp8Schedules)
        if (std::string(value) == fp8_schedule_name(candidate)) return candidate;
    return std::nullopt;
  }();
  if (requested) return *requested;
  // FLASHATTN_CUDA_FP8_BLOCK_N: a comma-separated list of key-tile widths, e.g. "224" or
  // "160,224": each head dim with a wide entry of one of them runs it (an A/B switch, not
  // timed yet; the other head dims keep their default).
  // (Widths parsed once into a bit set over multiples of 32.)
  static const std::uint32_t wide_block_ns = [] {
    std::uint32_t widths = 0;
    const char* value = std::getenv("FLASHATTN_CUDA_FP8_BLOCK_N");
    for (const char* item = value; item != nullptr && *item != '\0';) {
      char* end = nullptr;
      const long width = std::strtol(item, &end, 10);
      if (end == item) break;
      if (width > 0 && width <= 1024 && width % 32 == 0) widths |= std::uint32_t{1} << (width / 32 - 1);
      item = *end == ',' ? end + 1 : end;
    }
    return widths;
  }();
  for (const Fp8Schedule wide : kFp8WideSchedules) {
    const Fp8TileConfig config = fp8_tile_config(kernel_head_dim, wide);
    if (config.schedule == wide && (wide_block_ns >> (config.block_n / 32 - 1) & 1) != 0) return wide;
  }
  // Timed on the H200, 2026-11-27 (hopper_fp8/TUNING.md): the rotated loop (in_place_overlap)
  // over in_place at d256 1.05-1.17x (16k: 819 -> 961 TF/s), at d128 16k 1.06x (663 -> 707),
  // at d64 1.01-1.02x. Wide key tiles (same process, session 21): d128's 224 keys over
  // overlap at 4k 1.03-1.09x, at 16k 1.14-1.16x (704 -> 801 non-causal), but 0.86x at 1k
  // causal (a fifth tile mostly past the keys); d64's 160 keys 1.01-1.03x at 16k, 0.85-0.97x
  // at 1k-4k.
  // The 224-key kernel taking turns (no kernel of its own), session 21 in one process with
  // n224: 16k 772 -> 792 TF/s, 16k causal 745 -> 765, 4k 702 -> 697 and causal 551 -> 554.
  if (kernel_head_dim == 128 && seqlen_k >= 4096) return Fp8Schedule::in_place_overlap_n224_ping_pong;
  if (kernel_head_dim == 64 && seqlen_k >= 16384) return Fp8Schedule::in_place_overlap_n160;
  return Fp8Schedule::in_place_overlap;
}

Fp8Rescale default_rescale(int kernel_head_dim) {
  static const std::optional<Fp8Rescale> requested = []() -> std::optional<Fp8Rescale> {
    const char* value = std::getenv("FLASHATTN_CUDA_FP8_RESCALE");
    if (value != nullptr)
      for (const Fp8Rescale candidate : kFp8Rescales)
        if (std::string(value) == fp8_rescale_name(candidate)) return candidate;
    return std::nullopt;
  }();
  if (requested) return *requested;
  // H200, 2026-11-27 (hopper_fp8/TUNING.md), the same bf16 anchor within 0.2% in both
  // processes: skipping the unit rescales gained 6-7% at d256 (16k 895 -> 956 TF/s, causal
  // 902 -> 963; 4k 901 -> 956). d128's 224-key tiles, in two calls: +1-2% and +7% in TF/s
  // at 4k/16k (the bf16 anchor moved too: +0-1% in ratio to it), never a loss. d64 was not
  // timed: it keeps every_block.
  return kernel_head_dim == 64 ? Fp8Rescale::every_block : Fp8Rescale::when_max_moves;
}

void forward(const AttentionParams& params, cudaStream_t stream, Fp8Schedule schedule, Fp8Rescale rescale) {
  const std::string why_not = why_unsupported(params);
  if (!why_not.empty()) throw NotSupported("flashattn: " + why_not);
  if (params.batch == 0 || params.seqlen_q == 0 || params.heads_q == 0) return;
  const int kernel_head_dim = kernel_head_dim_for(params.head_dim);
  run_for_head_dim(kernel_head_dim,
                   make_fp8_forward_params(params, schedule, rescale, fp8_tile_config(kernel_head_dim, schedule)),
                   stream);
}

void forward(const AttentionParams& params, cudaStream_t stream, Fp8Schedule schedule) {
  forward(params, stream, schedule, default_rescale(kernel_head_dim_for(params.head_dim)));
}

void forward(const AttentionParams& params, cudaStream_t stream) {
  forward(params, stream, default_schedule(kernel_head_dim_for(params.head_dim), params.seqlen_k));
}

}  // namespace flashattn::cuda::hopper_fp8
