// src/cuda/common/alibi_path.hpp — which form the training kernels give ALiBi on key
// blocks off the diagonal (host code; the kernels receive the choice in their params).
//   affine (default)  one FFMA per element, the row offset per row and block
//                     (ScoreRule::affine_*, fragment::apply_affine_bias)
//   generic           the per-element |distance| form everywhere (fragment::apply_score_rule)
// FLASHATTN_CUDA_ALIBI_PATH=generic selects the second: an A/B switch for timing, read
// once per process. Read by the Hopper forward and backward launches, by the sm80
// (mma.sync) backward (bwd/launch_main.cuh: the general variant of the dK/dV and dQ
// kernels; the sm80 forward keeps the per-element form, measured faster there:
// fwd/TUNING.md), and by the 16-bit decode kernels (decode/
// launch_decode.cuh: whole key tiles left of every row's diagonal). Results agree to
// rounding: scripts/device_check.sh runs the ALiBi tests both ways (step alibi_generic).
#pragma once

#include <cstdlib>
#include <string>

namespace flashattn::cuda {

inline bool is_affine_alibi_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("FLASHATTN_CUDA_ALIBI_PATH");
    return value == nullptr || std::string(value) != "generic";
  }();
  return enabled;
}

}  // namespace flashattn::cuda
