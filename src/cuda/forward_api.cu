// src/cuda/forward_api.cu — CUDA backend entry points (placeholder until the forward kernel lands).
#include "flashattn/error.hpp"
#include "src/core/backend.hpp"

namespace flashattn::cuda {
bool available() noexcept { return false; }
BackendLimits limits() noexcept { return BackendLimits{"cuda", 256, 8, false, true, {true, false, true, false}}; }
void forward(const AttentionParams&, Algorithm, void*) { throw NotSupported("flashattn: cuda forward: not built yet"); }
void merge_attention_states(const MergeParams&, void*) { throw NotSupported("flashattn: cuda merge: not built yet"); }
}  // namespace flashattn::cuda
