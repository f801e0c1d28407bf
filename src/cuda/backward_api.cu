// src/cuda/backward_api.cu — CUDA backward entry points (placeholder until the backward kernel lands).
#include "flashattn/error.hpp"
#include "src/core/backend.hpp"

namespace flashattn::cuda {
void backward(const BackwardParams&, void*) { throw NotSupported("flashattn: cuda backward: not built yet"); }
std::size_t backward_workspace_bytes(const BackwardParams&) { return 0; }
}  // namespace flashattn::cuda
