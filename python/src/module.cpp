// python/src/module.cpp — flashattn._C, the native module under the `flashattn`
// Python package. Thin by design: arrays arrive through DLPack (any framework),
// become TensorViews, and go to the public C++ API unchanged. The Python layer
// allocates every output and passes it in, so nothing here owns memory.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "flashattn/attention.hpp"
#include "flashattn/config.hpp"
#include "flashattn/error.hpp"
#include "flashattn/kvcache.hpp"
#include "python/src/tensor_view_from_dlpack.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace flashattn::python {
namespace {

using InputArray = nb::ndarray<nb::ro>;  // read-only inputs (q, k, v, LSE, cu_seqlens, ...)
using OutputArray = nb::ndarray<>;       // written by the call

// An optional array argument: None on the Python side is an invalid ndarray here.
TensorView maybe_view(const InputArray& array, const char* name) {
  return array.is_valid() ? tensor_view_from_dlpack(array, name) : TensorView{};
}
TensorView maybe_view(const OutputArray& array, const char* name) {
  return array.is_valid() ? tensor_view_from_dlpack(array, name) : TensorView{};
}

Algorithm parse_algorithm(const std::string& name) {
  for (Algorithm a : {Algorithm::automatic, Algorithm::reference, Algorithm::flash2, Algorithm::flash1, Algorithm::flash3})
    if (name == algorithm_name(a)) return a;
  throw nb::value_error(
      ("flashattn: algorithm: expected 'automatic', 'reference', 'flash2', 'flash1' or 'flash3', got '" + name + "'").c_str());
}

AttentionOptions make_options(std::optional<double> softmax_scale, bool causal, std::int64_t window_left,
                              std::int64_t window_right, double softcap, bool deterministic, const std::string& algorithm) {
  AttentionOptions options;
  options.softmax_scale = softmax_scale;
  options.causal = causal;
  options.window_left = window_left;
  options.window_right = window_right;
  options.softcap = softcap;
  options.deterministic = deterministic;
  options.algorithm = parse_algorithm(algorithm);
  return options;
}

std::optional<VarlenArgs> make_varlen(const InputArray& cu_seqlens_q, const InputArray& cu_seqlens_k,
                                      std::int64_t max_seqlen_q, std::int64_t max_seqlen_k) {
  if (cu_seqlens_q.is_valid() != cu_seqlens_k.is_valid())
    throw nb::value_error(cu_seqlens_q.is_valid()
                              ? "flashattn: cu_seqlens_k: missing: cu_seqlens_q and cu_seqlens_k are given together (varlen) or not at all"
                              : "flashattn: cu_seqlens_q: missing: cu_seqlens_q and cu_seqlens_k are given together (varlen) or not at all");
  if (!cu_seqlens_q.is_valid()) return std::nullopt;
  return VarlenArgs{tensor_view_from_dlpack(cu_seqlens_q, "cu_seqlens_q"), tensor_view_from_dlpack(cu_seqlens_k, "cu_seqlens_k"),
                    max_seqlen_q, max_seqlen_k};
}

ExecutionContext make_context(int num_threads, std::uintptr_t stream) {
  return ExecutionContext{reinterpret_cast<void*>(stream), num_threads};
}

void forward_binding(const InputArray& q, const InputArray& k, const InputArray& v, const OutputArray& out,
                     const OutputArray& maybe_lse, const InputArray& maybe_cu_seqlens_q, const InputArray& maybe_cu_seqlens_k,
                     std::int64_t max_seqlen_q, std::int64_t max_seqlen_k, std::optional<double> softmax_scale, bool causal,
                     std::int64_t window_left, std::int64_t window_right, double softcap, const std::string& algorithm,
                     int num_threads, std::uintptr_t stream) {
  ForwardArgs args;
  args.q = tensor_view_from_dlpack(q, "q");
  args.k = tensor_view_from_dlpack(k, "k");
  args.v = tensor_view_from_dlpack(v, "v");
  args.out = tensor_view_from_dlpack(out, "out");
  args.maybe_lse = maybe_view(maybe_lse, "lse");
  args.maybe_varlen = make_varlen(maybe_cu_seqlens_q, maybe_cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  args.options = make_options(softmax_scale, causal, window_left, window_right, softcap, false, algorithm);
  const ExecutionContext context = make_context(num_threads, stream);
  nb::gil_scoped_release release;
  flashattn::forward(args, context);
}

BackwardArgs make_backward_args(const InputArray& q, const InputArray& k, const InputArray& v, const InputArray& out,
                                const InputArray& dout, const InputArray& lse, const OutputArray& dq, const OutputArray& dk,
                                const OutputArray& dv, const InputArray& maybe_cu_seqlens_q,
                                const InputArray& maybe_cu_seqlens_k, std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
                                std::optional<double> softmax_scale, bool causal, std::int64_t window_left,
                                std::int64_t window_right, double softcap, bool deterministic, const std::string& algorithm) {
  BackwardArgs args;
  args.q = tensor_view_from_dlpack(q, "q");
  args.k = tensor_view_from_dlpack(k, "k");
  args.v = tensor_view_from_dlpack(v, "v");
  args.out = tensor_view_from_dlpack(out, "out");
  args.dout = tensor_view_from_dlpack(dout, "dout");
  args.lse = tensor_view_from_dlpack(lse, "lse");
  args.dq = tensor_view_from_dlpack(dq, "dq");
  args.dk = tensor_view_from_dlpack(dk, "dk");
  args.dv = tensor_view_from_dlpack(dv, "dv");
  args.maybe_varlen = make_varlen(maybe_cu_seqlens_q, maybe_cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  args.options = make_options(softmax_scale, causal, window_left, window_right, softcap, deterministic, algorithm);
  return args;
}

void backward_binding(const InputArray& q, const InputArray& k, const InputArray& v, const InputArray& out,
                      const InputArray& dout, const InputArray& lse, const OutputArray& dq, const OutputArray& dk,
                      const OutputArray& dv, const OutputArray& maybe_workspace, const InputArray& maybe_cu_seqlens_q,
                      const InputArray& maybe_cu_seqlens_k, std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
                      std::optional<double> softmax_scale, bool causal, std::int64_t window_left, std::int64_t window_right,
                      double softcap, bool deterministic, const std::string& algorithm, int num_threads,
                      std::uintptr_t stream) {
  BackwardArgs args = make_backward_args(q, k, v, out, dout, lse, dq, dk, dv, maybe_cu_seqlens_q, maybe_cu_seqlens_k,
                                         max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                                         softcap, deterministic, algorithm);
  args.maybe_workspace = maybe_view(maybe_workspace, "workspace");
  const ExecutionContext context = make_context(num_threads, stream);
  nb::gil_scoped_release release;
  flashattn::backward(args, context);
}

std::size_t backward_workspace_bytes_binding(const InputArray& q, const InputArray& k, const InputArray& v,
                                             const InputArray& out, const InputArray& dout, const InputArray& lse,
                                             const OutputArray& dq, const OutputArray& dk, const OutputArray& dv,
                                             const InputArray& maybe_cu_seqlens_q, const InputArray& maybe_cu_seqlens_k,
                                             std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
                                             std::optional<double> softmax_scale, bool causal, std::int64_t window_left,
                                             std::int64_t window_right, double softcap, bool deterministic,
                                             const std::string& algorithm) {
  const BackwardArgs args = make_backward_args(q, k, v, out, dout, lse, dq, dk, dv, maybe_cu_seqlens_q, maybe_cu_seqlens_k,
                                               max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                                               window_right, softcap, deterministic, algorithm);
  return flashattn::backward_workspace_bytes(args);
}

void merge_binding(const InputArray& out_a, const InputArray& lse_a, const InputArray& out_b, const InputArray& lse_b,
                   const OutputArray& out, const OutputArray& lse, int num_threads, std::uintptr_t stream) {
  const TensorView out_a_view = tensor_view_from_dlpack(out_a, "out_a");
  const TensorView lse_a_view = tensor_view_from_dlpack(lse_a, "lse_a");
  const TensorView out_b_view = tensor_view_from_dlpack(out_b, "out_b");
  const TensorView lse_b_view = tensor_view_from_dlpack(lse_b, "lse_b");
  const TensorView out_view = tensor_view_from_dlpack(out, "out");
  const TensorView lse_view = tensor_view_from_dlpack(lse, "lse");
  const ExecutionContext context = make_context(num_threads, stream);
  nb::gil_scoped_release release;
  flashattn::merge_attention_states(out_a_view, lse_a_view, out_b_view, lse_b_view, out_view, lse_view, context);
}

KVCacheArgs make_kvcache_args(const InputArray& q, const OutputArray& k_cache, const OutputArray& v_cache,
                              const InputArray& maybe_k_new, const InputArray& maybe_v_new,
                              const InputArray& maybe_cache_seqlens, std::optional<std::int64_t> maybe_uniform_cache_seqlen,
                              const InputArray& maybe_cache_batch_idx, const InputArray& maybe_cache_leftpad,
                              const InputArray& maybe_block_table, const InputArray& maybe_rotary_cos,
                              const InputArray& maybe_rotary_sin, bool rotary_interleaved, const OutputArray& out,
                              const OutputArray& maybe_lse, int num_splits, std::optional<double> softmax_scale, bool causal,
                              std::int64_t window_left, std::int64_t window_right, double softcap) {
  KVCacheArgs args;
  args.q = tensor_view_from_dlpack(q, "q");
  args.k_cache = tensor_view_from_dlpack(k_cache, "k_cache");
  args.v_cache = tensor_view_from_dlpack(v_cache, "v_cache");
  args.maybe_k_new = maybe_view(maybe_k_new, "k");
  args.maybe_v_new = maybe_view(maybe_v_new, "v");
  args.maybe_cache_seqlens = maybe_view(maybe_cache_seqlens, "cache_seqlens");
  args.maybe_uniform_cache_seqlen = maybe_uniform_cache_seqlen;
  args.maybe_cache_batch_idx = maybe_view(maybe_cache_batch_idx, "cache_batch_idx");
  args.maybe_cache_leftpad = maybe_view(maybe_cache_leftpad, "cache_leftpad");
  args.maybe_block_table = maybe_view(maybe_block_table, "block_table");
  args.maybe_rotary_cos = maybe_view(maybe_rotary_cos, "rotary_cos");
  args.maybe_rotary_sin = maybe_view(maybe_rotary_sin, "rotary_sin");
  args.rotary_interleaved = rotary_interleaved;
  args.out = tensor_view_from_dlpack(out, "out");
  args.maybe_lse = maybe_view(maybe_lse, "lse");
  args.num_splits = num_splits;
  args.options = make_options(softmax_scale, causal, window_left, window_right, softcap, false, "automatic");
  return args;
}

// The KV-cache arguments, in flash_attn_with_kvcache's order; k_cache/v_cache are
// written when k/v (the new keys/values) are given.
#define FLASHATTN_KVCACHE_PARAMETERS                                                                                     \
  const InputArray &q, const OutputArray &k_cache, const OutputArray &v_cache, const InputArray &maybe_k_new,            \
      const InputArray &maybe_v_new, const InputArray &maybe_cache_seqlens,                                              \
      std::optional<std::int64_t> maybe_uniform_cache_seqlen, const InputArray &maybe_cache_batch_idx,                   \
      const InputArray &maybe_cache_leftpad, const InputArray &maybe_block_table, const InputArray &maybe_rotary_cos,    \
      const InputArray &maybe_rotary_sin, bool rotary_interleaved, const OutputArray &out, const OutputArray &maybe_lse, \
      int num_splits, std::optional<double> softmax_scale, bool causal, std::int64_t window_left,                        \
      std::int64_t window_right, double softcap
#define FLASHATTN_KVCACHE_ARGUMENTS                                                                                 \
  q, k_cache, v_cache, maybe_k_new, maybe_v_new, maybe_cache_seqlens, maybe_uniform_cache_seqlen,                   \
      maybe_cache_batch_idx, maybe_cache_leftpad, maybe_block_table, maybe_rotary_cos, maybe_rotary_sin,            \
      rotary_interleaved, out, maybe_lse, num_splits, softmax_scale, causal, window_left, window_right, softcap

void forward_with_kvcache_binding(FLASHATTN_KVCACHE_PARAMETERS, const OutputArray& maybe_workspace, int num_threads,
                                  std::uintptr_t stream) {
  KVCacheArgs args = make_kvcache_args(FLASHATTN_KVCACHE_ARGUMENTS);
  args.maybe_workspace = maybe_view(maybe_workspace, "workspace");
  const ExecutionContext context = make_context(num_threads, stream);
  nb::gil_scoped_release release;
  flashattn::forward_with_kvcache(args, context);
}

std::size_t kvcache_workspace_bytes_binding(FLASHATTN_KVCACHE_PARAMETERS) {
  return flashattn::kvcache_workspace_bytes(make_kvcache_args(FLASHATTN_KVCACHE_ARGUMENTS));
}

// flashattn::Error -> ValueError (TypeError when the problem is a dtype), NotSupported
// -> NotImplementedError; the message is the C++ one, unchanged.
void translate_errors(const std::exception_ptr& exception, void*) {
  try {
    std::rethrow_exception(exception);
  } catch (const NotSupported& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.what());
  } catch (const Error& e) {
    const bool is_dtype_problem = std::string(e.what()).find("dtype") != std::string::npos;
    PyErr_SetString(is_dtype_problem ? PyExc_TypeError : PyExc_ValueError, e.what());
  }
}

}  // namespace
}  // namespace flashattn::python

NB_MODULE(_C, m) {
  using namespace flashattn::python;
  m.doc() = "flashattn native module: DLPack arrays in, the C++ attention API underneath. Use the `flashattn` package.";
  m.attr("__version__") = std::to_string(FLASHATTN_VERSION_MAJOR) + "." + std::to_string(FLASHATTN_VERSION_MINOR) + "." +
                          std::to_string(FLASHATTN_VERSION_PATCH);
  nb::register_exception_translator(translate_errors);

  m.def("forward", &forward_binding, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "cu_seqlens_q"_a.none(),
        "cu_seqlens_k"_a.none(), "max_seqlen_q"_a, "max_seqlen_k"_a, "softmax_scale"_a.none(), "causal"_a,
        "window_left"_a, "window_right"_a, "softcap"_a, "algorithm"_a, "num_threads"_a, "stream"_a,
        "Attention forward into preallocated out (and lse, float32, when given).");
  m.def("backward", &backward_binding, "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a,
        "workspace"_a.none(), "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(), "max_seqlen_q"_a, "max_seqlen_k"_a,
        "softmax_scale"_a.none(), "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a, "deterministic"_a,
        "algorithm"_a, "num_threads"_a, "stream"_a,
        "Attention backward into preallocated dq, dk, dv; workspace (uint8) of backward_workspace_bytes bytes.");
  m.def("backward_workspace_bytes", &backward_workspace_bytes_binding, "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a,
        "dq"_a, "dk"_a, "dv"_a, "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(), "max_seqlen_q"_a, "max_seqlen_k"_a,
        "softmax_scale"_a.none(), "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a, "deterministic"_a,
        "algorithm"_a, "Scratch bytes backward() needs for these arguments (0 on the CPU).");
#define FLASHATTN_KVCACHE_NAMES                                                                                     \
  "q"_a, "k_cache"_a, "v_cache"_a, "k"_a.none(), "v"_a.none(), "cache_seqlens"_a.none(), "uniform_cache_seqlen"_a.none(), \
      "cache_batch_idx"_a.none(), "cache_leftpad"_a.none(), "block_table"_a.none(), "rotary_cos"_a.none(),             \
      "rotary_sin"_a.none(), "rotary_interleaved"_a, "out"_a, "lse"_a.none(), "num_splits"_a, "softmax_scale"_a.none(), \
      "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a
  m.def("forward_with_kvcache", &forward_with_kvcache_binding, FLASHATTN_KVCACHE_NAMES, "workspace"_a.none(),
        "num_threads"_a, "stream"_a,
        "Attention of q over a KV cache (flash_attn_with_kvcache), appending k/v to the cache in place when given.");
  m.def("kvcache_workspace_bytes", &kvcache_workspace_bytes_binding, FLASHATTN_KVCACHE_NAMES,
        "Scratch bytes forward_with_kvcache needs for these arguments (0 on the CPU or without a split).");
  m.def("merge_attention_states", &merge_binding, "out_a"_a, "lse_a"_a, "out_b"_a, "lse_b"_a, "out"_a, "lse"_a,
        "num_threads"_a, "stream"_a, "Combine two partial attentions of the same queries by their LSEs.");
  m.def("cuda_available", &flashattn::cuda_available, "Whether this build has the CUDA backend and a GPU is present.");
}
