// src/core/dispatch.cpp — the public entry points: validate once, then hand the
// plain parameter struct to the backend that owns the tensors' device.
#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "src/core/backend.hpp"
#include "src/core/checks.hpp"
#include "src/core/validate.hpp"

namespace flashattn {

void forward(const ForwardArgs& args, const ExecutionContext& context) {
  const AttentionParams params = validate_forward(args);
  checks::check_num_threads(context.num_threads);
  if (params.device.type == DeviceType::cpu) {
    cpu::forward(params, args.options.algorithm, context.num_threads);
  } else {
    cuda::forward(params, args.options.algorithm, context.stream);
  }
}

void backward(const BackwardArgs& args, const ExecutionContext& context) {
  const BackwardParams params = validate_backward(args);
  checks::check_num_threads(context.num_threads);
  if (params.device.type == DeviceType::cpu) {
    cpu::backward(params, args.options.algorithm, context.num_threads);
    return;
  }
  const std::size_t needed = cuda::backward_workspace_bytes(params);
  if (params.workspace_bytes < needed)
    throw Error("flashattn: workspace: too small: expected at least " + std::to_string(needed) + " bytes (see backward_workspace_bytes), got " +
                std::to_string(params.workspace_bytes));
  cuda::backward(params, context.stream);
}

std::size_t backward_workspace_bytes(const BackwardArgs& args) {
  BackwardArgs without_workspace = args;
  without_workspace.maybe_workspace = {};
  const BackwardParams params = validate_backward(without_workspace);
  if (params.device.type == DeviceType::cpu) return 0;
  return cuda::backward_workspace_bytes(params);
}

std::string why_unsupported(const ForwardArgs& args) {
  try {
    (void)validate_forward(args);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

void merge_attention_states(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                            const TensorView& lse_b, const TensorView& out, const TensorView& lse,
                            const ExecutionContext& context) {
  const MergeParams params = validate_merge(out_a, lse_a, out_b, lse_b, out, lse);
  checks::check_num_threads(context.num_threads);
  if (out_a.device.type == DeviceType::cpu) {
    cpu::merge_attention_states(params);
  } else {
    (void)limits_for(out_a.device);  // throws NotSupported without a CUDA backend
    cuda::merge_attention_states(params, context.stream);
  }
}

bool cuda_available() noexcept { return cuda::available(); }

}  // namespace flashattn
