// src/core/kvcache_backend.hpp — what forward_with_kvcache needs from each backend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/core/kvcache_params.hpp"
#include "src/core/split_heuristic.hpp"

namespace flashattn {

// What a backend's KV-cache path accepts (validation reads it).
struct KVCacheLimits {
  const char* name = "";
  bool supports_float32 = false;  // float16 and bfloat16 always
  std::int64_t max_head_dim = 0;
  std::int64_t head_dim_multiple = 1;
};

namespace cpu {
KVCacheLimits kvcache_limits() noexcept;
// Appends (with rotary), then attends; params.num_splits is honoured (merged on the CPU).
void forward_with_kvcache(const KVCacheParams& params, int num_threads);
}  // namespace cpu

namespace cuda {
KVCacheLimits kvcache_limits() noexcept;
// The geometry the heuristic sees for this problem on the current device (SM count,
// tile size, packed query blocks).
SplitProblem kvcache_split_problem(const KVCacheParams& params);
// Launches the append (+ rotary), the split-KV kernel and, for num_splits > 1, the
// combine kernel on `stream`. The workspace must already be in params.
void forward_with_kvcache(const KVCacheParams& params, void* stream);
}  // namespace cuda

}  // namespace flashattn
