// src/core/cuda_unavailable.cpp — the CUDA backend's entry points in a build
// without CUDA (FLASHATTN_CUDA=OFF, or AUTO without nvcc). Validation calls
// available() first, so these throwing bodies are a second line of defence.
#include "flashattn/error.hpp"
#include "src/core/backend.hpp"
#include "src/core/fp8_quantize_params.hpp"

namespace flashattn::cuda {
namespace {
[[noreturn]] void no_cuda() {
  throw NotSupported("flashattn: q: CUDA tensors need a build with FLASHATTN_CUDA=ON (this build has no CUDA backend)");
}
}  // namespace

bool available() noexcept { return false; }
BackendLimits limits() noexcept { return BackendLimits{"cuda (not built)", 0, 1, false, false, {false, false, false, false}}; }
void forward(const AttentionParams&, Algorithm, void*) { no_cuda(); }
void backward(const BackwardParams&, void*) { no_cuda(); }
std::size_t backward_workspace_bytes(const BackwardParams&) { no_cuda(); }
void merge_attention_states(const MergeParams&, void*) { no_cuda(); }
void quantize_fp8(const QuantizeFp8Params&, void*) { no_cuda(); }

}  // namespace flashattn::cuda
