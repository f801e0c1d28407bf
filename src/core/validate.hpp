// src/core/validate.hpp — turns public arguments into AttentionParams, checking
// everything first. Nothing here writes to any tensor.
#pragma once

#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "src/core/backend.hpp"
#include "src/core/checks.hpp"
#include "src/core/params.hpp"

namespace flashattn {

// Throws flashattn::Error (NotSupported for valid-but-unsupported input).
AttentionParams validate_forward(const ForwardArgs& args);
BackwardParams validate_backward(const BackwardArgs& args);
MergeParams validate_merge(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                           const TensorView& lse_b, const TensorView& out, const TensorView& lse);

// ALiBi slopes and the dropout seed/offset tensor of `options`: checked against the
// problem (appended to `inputs` for the overlap checks), then copied into params.
void check_variant_tensors(const AttentionOptions& options, std::int64_t batch, std::int64_t heads_q, Device device,
                           std::vector<checks::NamedExtent>& inputs);
void set_variant_params(AttentionParams& p, const AttentionOptions& options);

// The limits of the backend that runs tensors on `device`.
BackendLimits limits_for(Device device);

}  // namespace flashattn
