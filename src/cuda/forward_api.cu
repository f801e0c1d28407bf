// src/cuda/forward_api.cu — CUDA backend entry points: device presence, limits,
// the forward dispatch to the generated kernels, and merge_attention_states.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "flashattn/error.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/core/backend.hpp"
#include "src/cuda/common/call_guards.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/common/numeric.cuh"
#include "src/cuda/fwd/launch.hpp"
#include "src/cuda/fwd/tile_config.hpp"
#include "src/cuda/hopper/launch.hpp"
#include "src/cuda/head_dims.hpp"
#include "src/cuda/hopper_fp8/launch.hpp"
#include "src/cuda/staging.hpp"


namespace flashattn::cuda {
namespace {

template <class T>
void run_forward_for_head_dim(int kernel_head_dim, const AttentionParams& params, cudaStream_t stream) {
  const bool ran = ForwardHeadDims::visit(kernel_head_dim, [&](auto head_dim) { fwd::run_forward<T, decltype(head_dim)::value>(params, stream); });
  if (!ran)
    throw NotSupported("flashattn: q: head_dim " + std::to_string(params.head_dim) +
                       ": no CUDA forward kernel was built for it (kernel head dim " + std::to_string(kernel_head_dim) +
                       "); rebuild with it in FLASHATTN_CUDA_HEAD_DIMS");
}

// merge_attention_states: one warp per (batch, row, head). All lanes read both LSEs
// before lane 0 writes the merged one, so lse may alias lse_a/lse_b; each output
// element is read and written by the same lane, so out may alias out_a/out_b.
template <class T>
__device__ __forceinline__ float load_as_float(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return *p;
  } else {
    return Numeric<T>::to_float(*p);
  }
}
template <class T>
__device__ __forceinline__ void store_from_float(T* p, float x) {
  if constexpr (std::is_same_v<T, float>) {
    *p = x;
  } else {
    *p = Numeric<T>::from_float(x);
  }
}

template <class T>
__global__ void merge_kernel(const __grid_constant__ MergeParams params) {
  const std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const std::int64_t rows = params.batch * params.seqlen * params.heads;
  if (warp >= rows) return;
  const std::int64_t head = warp % params.heads;
  const std::int64_t row = (warp / params.heads) % params.seqlen;
  const std::int64_t batch = warp / (params.heads * params.seqlen);
  auto lse_index = [&](int which) {
    return batch * params.lse_strides[which][0] + head * params.lse_strides[which][1] +
           row * params.lse_strides[which][2];
  };
  auto out_index = [&](int which) {
    return batch * params.out_strides[which][0] + row * params.out_strides[which][1] +
           head * params.out_strides[which][2];
  };
  const float lse_a = params.lse_a[lse_index(0)];
  const float lse_b = params.lse_b[lse_index(1)];
  const online_softmax::MergeWeights<float> weights = online_softmax::merge_weights(lse_a, lse_b);
  __syncwarp();
  if (lane == 0) params.lse[lse_index(2)] = weights.lse;
  const T* out_a = static_cast<const T*>(params.out_a) + out_index(0);
  const T* out_b = static_cast<const T*>(params.out_b) + out_index(1);
  T* out = static_cast<T*>(params.out) + out_index(2);
  for (std::int64_t d = lane; d < params.head_dim; d += 32) {
    // A part with weight 0 contributes nothing, even if its output is not finite.
    const float a = weights.weight_a == 0.0f ? 0.0f : weights.weight_a * load_as_float(out_a + d);
    const float b = weights.weight_b == 0.0f ? 0.0f : weights.weight_b * load_as_float(out_b + d);
    store_from_float(out + d, a + b);
  }
}

template <class T>
void launch_merge(const MergeParams& params, cudaStream_t stream) {
  const std::int64_t rows = params.batch * params.seqlen * params.heads;
  if (rows == 0) return;
  constexpr int kThreads = 256;
  const std::int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) throw NotSupported("flashattn: out: too many rows for one merge launch");
  merge_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(params);
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

// Scratch sections of 256-byte multiples, never empty: an empty problem still hands the
// kernels (and TMA descriptors, which refuse null addresses) a valid pointer.
std::size_t section_bytes(std::size_t bytes) { return (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256; }

// A problem the kernels have no layout for (staging.hpp): head_dim not a multiple of 8
// (q/k/v/out staged zero-padded to padded_head_dim) and/or paged K/V (gathered into
// packed varlen rows). Scratch: cudaMallocAsync on the call's stream, freed on it after
// the last copy. The LSE is written by the kernels in place.
void forward_staged(const AttentionParams& params, Algorithm algorithm, cudaStream_t stream) {
  const DeviceGuard device_guard(params.device.index);
  const std::int64_t head_dim = params.head_dim;
  const std::int64_t padded = staging::padded_head_dim(head_dim);
  const bool pads = padded != head_dim;
  const bool is_varlen = params.is_varlen();
  // Varlen tensors are one batch of total rows (batch stride 0).
  const std::int64_t batches = is_varlen ? 1 : params.batch;
  const std::int64_t q_rows = is_varlen ? params.total_q : params.seqlen_q;
  const std::int64_t k_rows = is_varlen ? params.total_k : params.seqlen_k;
  constexpr std::size_t kElement = 2;  // float16 / bfloat16
  const std::size_t q_bytes = pads ? section_bytes(kElement * static_cast<std::size_t>(params.total_q * params.heads_q * padded)) : 0;
  const std::size_t kv_bytes = section_bytes(kElement * static_cast<std::size_t>(params.total_k * params.heads_kv * padded));
  const staging::StreamScratch scratch(2 * q_bytes + 2 * kv_bytes, stream);  // q | out | k | v
  unsigned char* q_scratch = scratch.data();
  unsigned char* out_scratch = q_scratch + q_bytes;
  unsigned char* k_scratch = out_scratch + q_bytes;
  unsigned char* v_scratch = k_scratch + kv_bytes;

  AttentionParams staged = params;
  staged.head_dim = padded;
  auto use = [&](const staging::RowsView& view, const void*& data, std::int64_t& batch_stride, std::int64_t& row_stride,
                 std::int64_t& head_stride) {
    data = view.data;
    batch_stride = is_varlen ? 0 : view.batch_stride;
    row_stride = view.row_stride;
    head_stride = view.head_stride;
  };
  const staging::RowsView q_view = staging::dense_view(q_scratch, q_rows, params.heads_q, padded);
  const staging::RowsView out_view = staging::dense_view(out_scratch, q_rows, params.heads_q, padded);
  const staging::RowsView k_view = staging::dense_view(k_scratch, k_rows, params.heads_kv, padded);
  const staging::RowsView v_view = staging::dense_view(v_scratch, k_rows, params.heads_kv, padded);
  if (pads) {
    const staging::RowsView q_src{const_cast<void*>(params.q), params.q_batch_stride, params.q_row_stride, params.q_head_stride};
    staging::copy_columns(q_src, head_dim, q_view, padded, batches, q_rows, params.heads_q, nullptr, stream);
    use(q_view, staged.q, staged.q_batch_stride, staged.q_row_stride, staged.q_head_stride);
    staged.out = out_view.data;
    staged.out_batch_stride = is_varlen ? 0 : out_view.batch_stride;
    staged.out_row_stride = out_view.row_stride;
    staged.out_head_stride = out_view.head_stride;
  }
  if (params.is_paged()) {
    staging::gather_paged_kv(params, k_scratch, v_scratch, params.total_k, padded, stream);
    staged.maybe_block_table = nullptr;
  } else {
    const staging::RowsView k_src{const_cast<void*>(params.k), params.k_batch_stride, params.k_row_stride, params.k_head_stride};
    const staging::RowsView v_src{const_cast<void*>(params.v), params.v_batch_stride, params.v_row_stride, params.v_head_stride};
    staging::copy_columns(k_src, head_dim, k_view, padded, batches, k_rows, params.heads_kv, nullptr, stream);
    staging::copy_columns(v_src, head_dim, v_view, padded, batches, k_rows, params.heads_kv, nullptr, stream);
  }
  use(k_view, staged.k, staged.k_batch_stride, staged.k_row_stride, staged.k_head_stride);
  use(v_view, staged.v, staged.v_batch_stride, staged.v_row_stride, staged.v_head_stride);
  forward(staged, algorithm, stream);
  if (pads) {
    // Rows no sequence owns (varlen q past cu_seqlens_q[batch]) stay untouched, as unstaged.
    const staging::RowsView out_dst{params.out, params.out_batch_stride, params.out_row_stride, params.out_head_stride};
    staging::copy_columns(out_view, padded, out_dst, head_dim, batches, q_rows, params.heads_q,
                          is_varlen ? params.maybe_cu_seqlens_q + params.batch : nullptr, stream);
  }
}

// FP8 inputs: only the Hopper FP8 kernel takes them (issue 16). Everything it cannot
// run is refused here, naming the argument; the CPU backend runs all of it.
std::string why_fp8_unsupported(const AttentionParams& params, Algorithm algorithm) {
  if (algorithm != Algorithm::automatic && algorithm != Algorithm::flash3)
    return std::string("algorithm: ") + dtype_name(params.input_dtype) +
           " inputs run on the flash3 (Hopper FP8) kernel only, got " + algorithm_name(algorithm);
  // The kernel's own coverage (device, head dim, features, strides) ...
  if (std::string why_not = hopper_fp8::why_unsupported(params); !why_not.empty()) return why_not;
  // ... and the TMA's 16-byte aligned base addresses, which it takes for granted.
  const struct {
    const char* name;
    const void* data;
    std::int64_t batch, row, head;
  } inputs[] = {{"q", params.q, params.q_batch_stride, params.q_row_stride, params.q_head_stride},
                {"k", params.k, params.k_batch_stride, params.k_row_stride, params.k_head_stride},
                {"v", params.v, params.v_batch_stride, params.v_row_stride, params.v_head_stride}};
  for (const auto& t : inputs)
    if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0 || t.batch % 16 != 0 || t.row % 16 != 0 || t.head % 16 != 0)
      return std::string(t.name) + ": the FP8 kernel needs 16-byte aligned rows (data pointer aligned to 16 bytes and " +
             "batch/row/head strides multiples of 16 elements), got strides " + std::to_string(t.batch) + "/" +
             std::to_string(t.row) + "/" + std::to_string(t.head);
  return {};
}

void forward_fp8(const AttentionParams& params, Algorithm algorithm, cudaStream_t stream) {
  const std::string why_not = why_fp8_unsupported(params, algorithm);
  if (!why_not.empty()) throw NotSupported("flashattn: " + why_not);
  require_16_byte_rows("out", params.out, params.out_batch_stride, params.out_row_stride, params.out_head_stride);
  const DeviceGuard device_guard(params.device.index);
  hopper_fp8::forward(params, stream);
}

}  // namespace

bool available() noexcept {
  // Cached: presence does not change during a process's life, and validation asks on every call.
  static const bool is_available = [] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  }();
  return is_available;
}

BackendLimits limits() noexcept {
  BackendLimits limits;
  limits.name = "cuda";
  // Any head_dim up to the largest kernel: one that is not a multiple of 8 runs staged,
  // zero-padded to the next multiple (staging.hpp), and the built head dims are all
  // multiples of 8, so head_dim <= largest built <=> its padded size is.
  limits.max_head_dim = ForwardHeadDims::largest();
  limits.head_dim_multiple = 1;
  limits.supports_float32 = false;
  limits.supports_half = true;
  limits.supports_algorithm[static_cast<int>(Algorithm::automatic)] = true;
  limits.supports_algorithm[static_cast<int>(Algorithm::reference)] = false;
  limits.supports_algorithm[static_cast<int>(Algorithm::flash2)] = true;
  limits.supports_algorithm[static_cast<int>(Algorithm::flash1)] = false;
  // flash3 needs an sm_90 device too: forward() says so per call (hopper::why_unsupported).
  limits.supports_algorithm[static_cast<int>(Algorithm::flash3)] = hopper::is_built();
  // The Hopper FP8 kernel is built with the Hopper kernels (sm_90a); the device, head
  // dim and features are checked per call (why_fp8_unsupported).
  limits.supports_fp8 = hopper_fp8::is_built();
  // attn_mask, block masks, dBias: the kernels walk the tile lists of src/cuda/masks.
  limits.supports_masks = true;
  return limits;
}

// Kernel choice, one place: flash2 = the mma.sync kernel; flash3 = the Hopper kernel or
// NotSupported saying why; automatic = the Hopper kernel where it runs the problem
// without more head-dim padding than the FA2 kernel would use (e.g. d96 stays on the
// FA2 d96 kernel instead of the Hopper d128 one), else the FA2 kernel.
void forward(const AttentionParams& params, Algorithm algorithm, void* stream) {
  if (params.is_fp8()) return forward_fp8(params, algorithm, static_cast<cudaStream_t>(stream));
  if (algorithm != Algorithm::automatic && algorithm != Algorithm::flash2 && algorithm != Algorithm::flash3)
    throw NotSupported(std::string("flashattn: algorithm: the CUDA backend runs automatic, flash2 or flash3, got ") +
                       algorithm_name(algorithm));
  if (staging::needs_head_dim_padding(params) || params.is_paged())
    return forward_staged(params, algorithm, static_cast<cudaStream_t>(stream));
  require_16_byte_rows("q", params.q, params.q_batch_stride, params.q_row_stride, params.q_head_stride);
  require_16_byte_rows("k", params.k, params.k_batch_stride, params.k_row_stride, params.k_head_stride);
  require_16_byte_rows("v", params.v, params.v_batch_stride, params.v_row_stride, params.v_head_stride);
  require_16_byte_rows("out", params.out, params.out_batch_stride, params.out_row_stride, params.out_head_stride);
  const int kernel_head_dim = ForwardHeadDims::smallest_holding(params.head_dim);
  if (algorithm != Algorithm::flash2) {
    const std::string why_not_flash3 = hopper::why_unsupported(params);
    const bool is_hopper_preferred =
        why_not_flash3.empty() && (algorithm == Algorithm::flash3 ||
                                   hopper::kernel_head_dim_for(params.head_dim) <= kernel_head_dim || kernel_head_dim == 0);
    if (algorithm == Algorithm::flash3 && !why_not_flash3.empty())
      throw NotSupported("flashattn: algorithm: " + why_not_flash3);
    if (is_hopper_preferred) {
      const DeviceGuard device_guard(params.device.index);
      hopper::forward(params, static_cast<cudaStream_t>(stream));
      return;
    }
  }
  if (kernel_head_dim == 0)
    throw NotSupported("flashattn: q: head_dim " + std::to_string(params.head_dim) +
                       " is larger than every CUDA forward kernel built (largest: " +
                       std::to_string(ForwardHeadDims::largest()) + "; see FLASHATTN_CUDA_HEAD_DIMS)");
  const DeviceGuard device_guard(params.device.index);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (params.dtype == DType::bfloat16) {
    run_forward_for_head_dim<__nv_bfloat16>(kernel_head_dim, params, cuda_stream);
  } else if (params.dtype == DType::float16) {
    run_forward_for_head_dim<__half>(kernel_head_dim, params, cuda_stream);
  } else {
    throw NotSupported(std::string("flashattn: q: the CUDA forward runs float16 and bfloat16, got ") +
                       dtype_name(params.dtype));
  }
}

void merge_attention_states(const MergeParams& params, void* stream) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  switch (params.dtype) {
    case DType::float32: return launch_merge<float>(params, cuda_stream);
    case DType::float16: return launch_merge<__half>(params, cuda_stream);
    case DType::bfloat16: return launch_merge<__nv_bfloat16>(params, cuda_stream);
    default:
      throw NotSupported(std::string("flashattn: out_a: the CUDA merge runs float32, float16 and bfloat16, got ") +
                         dtype_name(params.dtype));
  }
}

}  // namespace flashattn::cuda
