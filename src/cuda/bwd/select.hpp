// src/cuda/bwd/select.hpp — which tile configs of the backward kernels a device runs:
// per kernel, the first shared-memory tier (tile_config.hpp) whose config the device
// can launch. The one decision behind both "does this GPU run the backward?" and the
// launch itself (launch_main.cuh). Host only; test_backward_layout.cpp checks it.
#pragma once

#include <cstdint>
#include <optional>

#include "src/cuda/bwd/dkdv_traits.hpp"
#include "src/cuda/bwd/dq_traits.hpp"
#include "src/cuda/bwd/tile_config.hpp"

namespace flashattn::cuda::bwd {

// What the choice depends on.
struct DeviceLimits {
  int shared_memory_per_block = 0;  // the opt-in limit (cudaDevAttrMaxSharedMemoryPerBlockOptin)
  // The code the device runs was compiled for sm_90 or newer, so the dK/dV kernel's
  // staged dQ (cp.reduce.async.bulk) exists. On older code the staged configs trap.
  bool has_bulk_reduce = false;
};

struct KernelChoice {
  SmemTier dkdv = SmemTier::hopper;  // config of the dK/dV kernel: dkdv_config(head dim, dkdv)
  SmemTier dq = SmemTier::hopper;    // of the deterministic dQ kernel: dq_config(head dim, dq)
};

// The lowest tier with the same config: the one launch_main instantiates.
constexpr SmemTier canonical_dkdv_tier(int head_dim, SmemTier tier) {
  for (int t = 0; t < static_cast<int>(tier); ++t)
    if (dkdv_config(head_dim, static_cast<SmemTier>(t)) == dkdv_config(head_dim, tier)) return static_cast<SmemTier>(t);
  return tier;
}
constexpr SmemTier canonical_dq_tier(int head_dim, SmemTier tier) {
  for (int t = 0; t < static_cast<int>(tier); ++t)
    if (dq_config(head_dim, static_cast<SmemTier>(t)) == dq_config(head_dim, tier)) return static_cast<SmemTier>(t);
  return tier;
}

// Shared memory per block of each tier's kernels, from the traits (16-bit elements:
// the layout does not depend on which).
template <int kHeadDim>
inline constexpr int kDkdvSmemBytes[kSmemTierCount] = {
    DkdvTraits<std::uint16_t, kHeadDim, dkdv_config(kHeadDim, SmemTier::hopper)>::kSmemBytes,
    DkdvTraits<std::uint16_t, kHeadDim, dkdv_config(kHeadDim, SmemTier::ampere)>::kSmemBytes,
    DkdvTraits<std::uint16_t, kHeadDim, dkdv_config(kHeadDim, SmemTier::compact)>::kSmemBytes};
template <int kHeadDim>
inline constexpr int kDqSmemBytes[kSmemTierCount] = {
    static_cast<int>(DqTraits<std::uint16_t, kHeadDim, dq_config(kHeadDim, SmemTier::hopper)>::kDqSmemBytes),
    static_cast<int>(DqTraits<std::uint16_t, kHeadDim, dq_config(kHeadDim, SmemTier::ampere)>::kDqSmemBytes),
    static_cast<int>(DqTraits<std::uint16_t, kHeadDim, dq_config(kHeadDim, SmemTier::compact)>::kDqSmemBytes)};

// std::nullopt: no config of this kernel head dim fits the device.
template <int kHeadDim>
constexpr std::optional<KernelChoice> select_kernels(const DeviceLimits& device) {
  std::optional<SmemTier> dkdv, dq;
  for (int t = 0; t < kSmemTierCount && !dkdv; ++t) {
    const auto tier = static_cast<SmemTier>(t);
    const bool has_dq_path = dkdv_config(kHeadDim, tier).dq_atomics || device.has_bulk_reduce;
    if (has_dq_path && kDkdvSmemBytes<kHeadDim>[t] <= device.shared_memory_per_block)
      dkdv = canonical_dkdv_tier(kHeadDim, tier);
  }
  for (int t = 0; t < kSmemTierCount && !dq; ++t) {
    const auto tier = static_cast<SmemTier>(t);
    if (kDqSmemBytes<kHeadDim>[t] <= device.shared_memory_per_block) dq = canonical_dq_tier(kHeadDim, tier);
  }
  if (!dkdv || !dq) return std::nullopt;
  return KernelChoice{*dkdv, *dq};
}

// The same for a kernel head dim known at run time (one of kHeadDims).
inline std::optional<KernelChoice> select_kernels(int kernel_head_dim, const DeviceLimits& device) {
  switch (kernel_head_dim) {
    case 32: return select_kernels<32>(device);
    case 64: return select_kernels<64>(device);
    case 96: return select_kernels<96>(device);
    case 128: return select_kernels<128>(device);
    case 192: return select_kernels<192>(device);
    case 256: return select_kernels<256>(device);
    default: return std::nullopt;
  }
}

// The shared memory per block the smallest configs of a head dim need (for messages).
template <int kHeadDim>
constexpr int least_shared_memory() {
  constexpr int kCompact = static_cast<int>(SmemTier::compact);
  return kDkdvSmemBytes<kHeadDim>[kCompact] > kDqSmemBytes<kHeadDim>[kCompact] ? kDkdvSmemBytes<kHeadDim>[kCompact]
                                                                                 : kDqSmemBytes<kHeadDim>[kCompact];
}

}  // namespace flashattn::cuda::bwd
