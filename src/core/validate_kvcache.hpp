// src/core/validate_kvcache.hpp — turns KVCacheArgs into KVCacheParams, checking
// every argument first. Nothing here writes to any tensor.
#pragma once

#include "flashattn/kvcache.hpp"
#include "src/core/kvcache_backend.hpp"
#include "src/core/kvcache_params.hpp"

namespace flashattn {

// Throws flashattn::Error (NotSupported for valid-but-unsupported input). Resolves
// num_splits (0 = heuristic) but does not check maybe_workspace's size: dispatch
// does, once the split count is known (kvcache_dispatch.cpp).
KVCacheParams validate_kvcache(const KVCacheArgs& args);

}  // namespace flashattn
