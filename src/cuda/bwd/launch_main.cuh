// src/cuda/bwd/launch_main.cuh — launch_main<Element, kHeadDim>, included only by
// the generated per-(dtype, head dim) translation units (and the timing tool): the
// configs select.hpp picks for the device, one instantiation per distinct config.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

#include "flashattn/error.hpp"
#include "src/cuda/bwd/dkdv_kernel.cuh"
#include "src/cuda/bwd/dq_kernel.cuh"
#include "src/cuda/bwd/launch.hpp"
#include "src/cuda/common/alibi_path.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/masks/device_mask.hpp"

namespace flashattn::cuda::bwd {

// Flattened grids (block index = ((b * heads) + h) * blocks + block) never hit the
// 65535 limit of grid y/z; x allows 2^31 - 1.
inline unsigned int flat_grid(std::int64_t blocks, std::int64_t heads, std::int64_t batch) {
  const std::int64_t total = blocks * heads * batch;
  if (total > std::numeric_limits<int>::max())
    throw NotSupported("flashattn: cuda backward: too many blocks for one launch (" + std::to_string(total) + ")");
  return static_cast<unsigned int>(total);
}

template <class Kernel>
void allow_shared_memory(Kernel kernel, std::size_t bytes) {
  int device = 0, optin = 0;
  FLASHATTN_CUDA_CHECK(cudaGetDevice(&device));
  FLASHATTN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > static_cast<std::size_t>(optin))
    throw NotSupported("flashattn: cuda backward: needs " + std::to_string(bytes) +
                       " bytes of shared memory per block, this GPU allows " + std::to_string(optin));
  FLASHATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// Which instantiation of each kernel runs (KernelVariant, dkdv_kernel.cuh), from the
// params the kernel gets (device_mask filled in).
inline KernelVariant kernel_variant(const BackwardParams& params) {
  if (params.device_mask.present()) return KernelVariant::masked;
  if (params.score_is_positive_scale() && !params.has_dropout()) return KernelVariant::plain;
  return KernelVariant::general;
}

// Programs that sweep many tile configs and never pass masks (bench/gpu/kernels/
// bwd_timing.cu) define this as 0: the masked kernels are half of their compile time.
#ifndef FLASHATTN_BWD_MASKED_KERNELS
#define FLASHATTN_BWD_MASKED_KERNELS 1
#endif

// The kernel of `variant`: Kernels::of<kVariant>() for the three variants.
template <class Kernels>
auto kernel_of_variant(KernelVariant variant) {
  if (variant == KernelVariant::plain) return Kernels::template of<KernelVariant::plain>();
#if FLASHATTN_BWD_MASKED_KERNELS
  if (variant == KernelVariant::masked) return Kernels::template of<KernelVariant::masked>();
#else
  if (variant == KernelVariant::masked)
    throw NotSupported("flashattn: this program was built without the masked backward kernels");
#endif
  return Kernels::template of<KernelVariant::general>();
}
template <class T>
struct DkdvKernels {
  template <KernelVariant kVariant>
  static auto of() { return dkdv_kernel<T, kVariant>; }
};
template <class D>
struct DqKernels {
  template <KernelVariant kVariant>
  static auto of() { return dq_kernel<D, kVariant>; }
};

// ALiBi's affine form (common/alibi_path.hpp), for the kernels' is_alibi_affine: it keeps
// positions as 32-bit integers (ScoreRule::bias_on_side of a float distance, exact below 2^24
// like the per-element form's).
inline bool is_alibi_affine_for(const BackwardParams& params) {
  return is_affine_alibi_enabled() && params.seqlen_q <= std::numeric_limits<std::int32_t>::max() &&
         params.seqlen_k <= std::numeric_limits<std::int32_t>::max();
}

// With a block mask / attn_mask (masks/device_mask.hpp) each kernel reads tile lists
// built for its own tile sizes (the two kernels' differ), so each launch builds its
// tables; the dBias accumulator belongs to the dK/dV kernel's, which alone sums dS.
template <class T>
void launch_dkdv(const BackwardParams& params, const Workspace& workspace, bool is_aligned, cudaStream_t stream) {
  const std::int64_t num_n_blocks = (params.seqlen_k + T::kBlockN - 1) / T::kBlockN;
  const unsigned int dkdv_grid = flat_grid(num_n_blocks, params.heads_kv, params.batch);
  // Built (and dBias finished) even without a grid: dBias is then the zeros of no visited tile.
  const masks::MaskTables tables = masks::prepare(params, {T::kBlockM, T::kBlockN, false, true}, stream);
  if (dkdv_grid > 0) {
    BackwardParams launch_params = params;
    tables.bind(launch_params);
    const auto kernel = kernel_of_variant<DkdvKernels<T>>(kernel_variant(launch_params));
    allow_shared_memory(kernel, T::kSmemBytes);
    kernel<<<dkdv_grid, T::kThreads, T::kSmemBytes, stream>>>(launch_params, workspace, static_cast<int>(num_n_blocks),
                                                              is_aligned, is_alibi_affine_for(params));
    FLASHATTN_CUDA_CHECK_LAUNCH();
  }
  masks::finish_dbias(params, tables, stream);
}

template <class D>
void launch_dq(const BackwardParams& params, const Workspace& workspace, bool is_aligned, cudaStream_t stream) {
  const std::int64_t num_m_blocks = (params.seqlen_q + D::kBlockM - 1) / D::kBlockM;
  const unsigned int dq_grid = flat_grid(num_m_blocks, params.heads_q, params.batch);
  if (dq_grid == 0) return;
  // The AttentionParams overload: lists only, no second dBias accumulator.
  const masks::MaskTables tables =
      masks::prepare(static_cast<const AttentionParams&>(params), {D::kBlockM, D::kBlockN, true, false}, stream);
  BackwardParams launch_params = params;
  tables.bind(launch_params);
  const auto kernel = kernel_of_variant<DqKernels<D>>(kernel_variant(launch_params));
  allow_shared_memory(kernel, D::kDqSmemBytes);
  kernel<<<dq_grid, D::kThreads, D::kDqSmemBytes, stream>>>(launch_params, workspace, static_cast<int>(num_m_blocks),
                                                            is_aligned, is_alibi_affine_for(params));
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

// The dK/dV kernel (traits T), and the dQ kernel (traits D) when deterministic.
template <class T, class D>
void launch_kernels(const BackwardParams& params, const Workspace& workspace, bool is_aligned, cudaStream_t stream) {
  launch_dkdv<T>(params, workspace, is_aligned, stream);
  if (params.deterministic) launch_dq<D>(params, workspace, is_aligned, stream);
}

// The kernel of `tier` (a canonical tier from select_kernels); only canonical tiers are
// instantiated, so a config shared by two tiers is compiled once.
template <class Element, int kHeadDim, int kTier = 0>
void launch_dkdv_tier(SmemTier tier, const BackwardParams& params, const Workspace& workspace, bool is_aligned,
                      cudaStream_t stream) {
  if constexpr (kTier < kSmemTierCount) {
    constexpr auto kThisTier = static_cast<SmemTier>(kTier);
    if constexpr (canonical_dkdv_tier(kHeadDim, kThisTier) == kThisTier) {
      if (tier == kThisTier) {
        using T = DkdvTraits<Element, kHeadDim, dkdv_config(kHeadDim, kThisTier)>;
        static_assert(T::kSmemBytes == kDkdvSmemBytes<kHeadDim>[kTier]);
        return launch_dkdv<T>(params, workspace, is_aligned, stream);
      }
    }
    launch_dkdv_tier<Element, kHeadDim, kTier + 1>(tier, params, workspace, is_aligned, stream);
  } else {
    throw std::logic_error("flashattn: cuda backward: no dK/dV kernel for tier " + std::to_string(static_cast<int>(tier)));
  }
}

template <class Element, int kHeadDim, int kTier = 0>
void launch_dq_tier(SmemTier tier, const BackwardParams& params, const Workspace& workspace, bool is_aligned,
                    cudaStream_t stream) {
  if constexpr (kTier < kSmemTierCount) {
    constexpr auto kThisTier = static_cast<SmemTier>(kTier);
    if constexpr (canonical_dq_tier(kHeadDim, kThisTier) == kThisTier) {
      if (tier == kThisTier) {
        using D = DqTraits<Element, kHeadDim, dq_config(kHeadDim, kThisTier)>;
        static_assert(static_cast<int>(D::kDqSmemBytes) == kDqSmemBytes<kHeadDim>[kTier]);
        return launch_dq<D>(params, workspace, is_aligned, stream);
      }
    }
    launch_dq_tier<Element, kHeadDim, kTier + 1>(tier, params, workspace, is_aligned, stream);
  } else {
    throw std::logic_error("flashattn: cuda backward: no dQ kernel for tier " + std::to_string(static_cast<int>(tier)));
  }
}

template <class Element, int kHeadDim>
void launch_main(const BackwardParams& params, const Workspace& workspace, bool is_aligned, cudaStream_t stream) {
  const DeviceLimits device = current_device_limits();
  const std::optional<KernelChoice> choice = select_kernels<kHeadDim>(device);
  if (!choice)
    throw NotSupported("flashattn: cuda backward: head dim " + std::to_string(params.head_dim) + " needs " +
                       std::to_string(least_shared_memory<kHeadDim>()) +
                       " bytes of shared memory per block, this GPU allows " +
                       std::to_string(device.shared_memory_per_block));
  launch_dkdv_tier<Element, kHeadDim>(choice->dkdv, params, workspace, is_aligned, stream);
  if (params.deterministic) launch_dq_tier<Element, kHeadDim>(choice->dq, params, workspace, is_aligned, stream);
}

}  // namespace flashattn::cuda::bwd
