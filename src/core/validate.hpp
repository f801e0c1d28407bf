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

// The FP8 descales of `options` (q_descale, k_descale, v_descale: float32 [batch,
// heads_kv], size-1 dimensions broadcast, zero strides allowed; an error naming the
// descale when given without FP8 inputs), then their params (pointers and strides).
void check_fp8_descales(const AttentionOptions& options, bool is_fp8, std::int64_t batch, std::int64_t heads_kv,
                        Device device, std::vector<checks::NamedExtent>& inputs);
void set_fp8_params(AttentionParams& p, const AttentionOptions& options);

// attn_mask and the block mask of `options` (validate_mask.cpp): checked against the
// problem (appended to `inputs` for the overlap checks), then copied into params.
struct MaskGeometry {
  bool is_varlen = false;
  std::int64_t batch = 0, heads_q = 0, seqlen_q = 0, seqlen_k = 0;
  Device device{};
  DType dtype = DType::float32;
};
void check_mask_options(const AttentionOptions& options, const MaskGeometry& geometry, const BackendLimits& limits,
                        std::vector<checks::NamedExtent>& inputs);
void set_mask_params(AttentionParams& p, const AttentionOptions& options);
checks::Extent check_dbias(const TensorView& dbias, const AttentionOptions& options);
void set_dbias_params(BackwardParams& p, const TensorView& dbias);

// The limits of the backend that runs tensors on `device`.
BackendLimits limits_for(Device device);

}  // namespace flashattn
