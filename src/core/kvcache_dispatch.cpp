// src/core/kvcache_dispatch.cpp — forward_with_kvcache: validate once, check the
// split workspace, then hand KVCacheParams to the backend owning the tensors.
#include <string>

#include "flashattn/error.hpp"
#include "flashattn/kvcache.hpp"
#include "src/core/checks.hpp"
#include "src/core/kvcache_backend.hpp"
#include "src/core/validate_kvcache.hpp"

namespace flashattn {
namespace {

std::size_t workspace_bytes_of(const KVCacheParams& p) {
  if (p.attention.device.type == DeviceType::cpu) return 0;
  return kvcache_split_workspace_bytes(p.num_splits, p.attention.batch, p.attention.heads_q, p.attention.seqlen_q,
                                       p.attention.head_dim);
}

}  // namespace

void forward_with_kvcache(const KVCacheArgs& args, const ExecutionContext& context) {
  const KVCacheParams params = validate_kvcache(args);
  checks::check_num_threads(context.num_threads);
  if (params.attention.device.type == DeviceType::cpu) {
    cpu::forward_with_kvcache(params, context.num_threads);
    return;
  }
  const std::size_t needed = workspace_bytes_of(params);
  if (params.workspace_bytes < needed)
    throw Error("flashattn: workspace: too small for " + std::to_string(params.num_splits) + " splits: expected at least " +
                std::to_string(needed) + " bytes (see kvcache_workspace_bytes), got " + std::to_string(params.workspace_bytes));
  cuda::forward_with_kvcache(params, context.stream);
}

std::size_t kvcache_workspace_bytes(const KVCacheArgs& args) {
  KVCacheArgs without_workspace = args;
  without_workspace.maybe_workspace = {};
  return workspace_bytes_of(validate_kvcache(without_workspace));
}

int kvcache_num_splits(const KVCacheArgs& args) {
  KVCacheArgs without_workspace = args;
  without_workspace.maybe_workspace = {};
  return validate_kvcache(without_workspace).num_splits;
}

#if !defined(FLASHATTN_CUDA_DECODE)
// A build without the CUDA decode kernels (src/cuda/decode defines FLASHATTN_CUDA_DECODE):
// the KV-cache path accepts no head dim on CUDA tensors, so validation refuses them.
namespace cuda {
KVCacheLimits kvcache_limits() noexcept { return KVCacheLimits{"cuda (not built)", false, 0, 1}; }
SplitProblem kvcache_split_problem(const KVCacheParams&) { return SplitProblem{}; }
void forward_with_kvcache(const KVCacheParams&, void*) {
  throw NotSupported("flashattn: q: forward_with_kvcache on CUDA tensors needs a build with the CUDA decode kernels (FLASHATTN_CUDA=ON)");
}
}  // namespace cuda
#endif

}  // namespace flashattn
