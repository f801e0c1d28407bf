// python/src/module.cpp — flashattn._C, the native module under the `flashattn`
// Python package. Thin by design: arrays arrive through DLPack (any framework; its C
// exchange API where the type offers it), become TensorViews, and go to the public
// C++ API unchanged. stream=None means the arrays' framework's current stream. The Python layer allocates every output and passes it in
// (scratch through a callable it passes), so nothing here owns memory.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "flashattn/attention.hpp"
#include "flashattn/config.hpp"
#include "flashattn/dropout.hpp"
#include "flashattn/error.hpp"
#include "flashattn/fp8.hpp"
#include "flashattn/kvcache.hpp"
#include "python/src/array_arguments.hpp"
#include "python/src/call_arguments.hpp"
#include "src/core/checks.hpp"  // kMaxThreads

namespace nb = nanobind;
using namespace nb::literals;

namespace flashattn::python {
void register_mask_bindings(nb::module_& m);  // mask_bindings.cpp
namespace {

// Array arguments arrive as plain handles and become TensorViews in ArrayArguments
// (DLPack's C exchange API where the type has it, e.g. torch.Tensor; nanobind's DLPack /
// buffer-protocol import otherwise). None is an absent optional array.

Algorithm parse_algorithm(const std::string& name) {
  for (Algorithm a : {Algorithm::automatic, Algorithm::reference, Algorithm::flash2, Algorithm::flash1, Algorithm::flash3})
    if (name == algorithm_name(a)) return a;
  throw nb::value_error(
      ("flashattn: algorithm: expected 'automatic', 'reference', 'flash2', 'flash1' or 'flash3', got '" + name + "'").c_str());
}

AttentionOptions make_options(std::optional<double> softmax_scale, bool causal, std::int64_t window_left,
                              std::int64_t window_right, double softcap, bool deterministic, const char* algorithm) {
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

std::optional<VarlenArgs> make_varlen(ArrayArguments& arrays, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
                                      std::int64_t max_seqlen_q, std::int64_t max_seqlen_k) {
  if (cu_seqlens_q.is_none() != cu_seqlens_k.is_none())
    throw nb::value_error(!cu_seqlens_q.is_none()
                              ? "flashattn: cu_seqlens_k: missing: cu_seqlens_q and cu_seqlens_k are given together (varlen) or not at all"
                              : "flashattn: cu_seqlens_q: missing: cu_seqlens_q and cu_seqlens_k are given together (varlen) or not at all");
  if (cu_seqlens_q.is_none()) return std::nullopt;
  return VarlenArgs{arrays.input(cu_seqlens_q, "cu_seqlens_q"), arrays.input(cu_seqlens_k, "cu_seqlens_k"), max_seqlen_q,
                    max_seqlen_k};
}

// ALiBi slopes and dropout (keyword arguments of the native calls, defaulting to off):
// float32 slopes [heads_q] or [batch, heads_q]; dropout's seed and offset as host
// integers, or an int64 {seed, offset} array on the inputs' device read at run time.
void set_variants(AttentionOptions& options, ArrayArguments& arrays, nb::handle maybe_alibi_slopes, double dropout_p,
                  std::uint64_t dropout_seed, std::uint64_t dropout_offset, nb::handle maybe_dropout_seed_offset) {
  options.maybe_alibi_slopes = arrays.maybe_input(maybe_alibi_slopes, "alibi_slopes");
  options.dropout_p = dropout_p;
  options.dropout_seed = dropout_seed;
  options.dropout_offset = dropout_offset;
  options.maybe_dropout_seed_offset = arrays.maybe_input(maybe_dropout_seed_offset, "dropout_seed_offset");
}
#define FLASHATTN_VARIANT_PARAMETERS                                                                        \
  nb::handle maybe_alibi_slopes, double dropout_p, std::uint64_t dropout_seed, std::uint64_t dropout_offset, \
      nb::handle maybe_dropout_seed_offset
#define FLASHATTN_VARIANT_ARGUMENTS maybe_alibi_slopes, dropout_p, dropout_seed, dropout_offset, maybe_dropout_seed_offset

// stream None: the arrays' framework's current stream on their device (DLPack C exchange
// API), so the torch layer need not look it up in Python on every call.
ExecutionContext make_context(const ArrayArguments& arrays, int num_threads, std::optional<std::uintptr_t> stream) {
  return ExecutionContext{arrays.stream(stream), num_threads};
}

// FP8 codes held in uint8 arrays (NumPy has no float8 dtype; torch tensors are handed
// over as uint8 views): with fp8, a uint8 view is read as float8_e4m3 (flashattn.fp8
// documents it). Arrays that arrive as float8_e4m3fn through DLPack need no flag.
void as_float8_codes(TensorView& view) {
  if (view.dtype == DType::uint8) view.dtype = DType::float8_e4m3;
}

void forward_binding(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle maybe_lse,
                     nb::handle maybe_cu_seqlens_q, nb::handle maybe_cu_seqlens_k, std::int64_t max_seqlen_q,
                     std::int64_t max_seqlen_k, std::optional<double> softmax_scale, bool causal, std::int64_t window_left,
                     std::int64_t window_right, double softcap, const char* algorithm, int num_threads,
                     std::optional<std::uintptr_t> stream, nb::handle maybe_block_table, FLASHATTN_VARIANT_PARAMETERS,
                     bool fp8, nb::handle maybe_q_descale, nb::handle maybe_k_descale, nb::handle maybe_v_descale) {
  ArrayArguments arrays;
  ForwardArgs args = forward_tensors(arrays, q, k, v, out, maybe_lse);
  if (fp8) {
    as_float8_codes(args.q);
    as_float8_codes(args.k);
    as_float8_codes(args.v);
  }
  args.maybe_varlen = make_varlen(arrays, maybe_cu_seqlens_q, maybe_cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  if (!maybe_block_table.is_none()) {  // paged K/V: varlen only (flash_attn_varlen_func)
    if (!args.maybe_varlen)
      throw nb::value_error("flashattn: block_table: a paged KV cache needs cu_seqlens_q/cu_seqlens_k (flash_attn_varlen_func)");
    args.maybe_varlen->maybe_block_table = arrays.input(maybe_block_table, "block_table");
  }
  args.options = make_options(softmax_scale, causal, window_left, window_right, softcap, false, algorithm);
  set_variants(args.options, arrays, FLASHATTN_VARIANT_ARGUMENTS);
  args.options.maybe_q_descale = arrays.maybe_input(maybe_q_descale, "q_descale");
  args.options.maybe_k_descale = arrays.maybe_input(maybe_k_descale, "k_descale");
  args.options.maybe_v_descale = arrays.maybe_input(maybe_v_descale, "v_descale");
  const ExecutionContext context = make_context(arrays, num_threads, stream);
  nb::gil_scoped_release release;
  flashattn::forward(args, context);
}

// quantize_fp8 (flashattn/fp8.hpp) into preallocated out (uint8 or float8_e4m3fn codes)
// and descale (float32 [batch | 1, groups]).
void quantize_fp8_binding(nb::handle x, nb::handle out, nb::handle descale, bool incoherent, std::uint64_t seed,
                          int num_threads, std::optional<std::uintptr_t> stream) {
  ArrayArguments arrays;
  const TensorView x_view = arrays.input(x, "x");
  TensorView out_view = arrays.output(out, "out");
  as_float8_codes(out_view);
  const TensorView descale_view = arrays.output(descale, "descale");
  const ExecutionContext context = make_context(arrays, num_threads, stream);
  nb::gil_scoped_release release;
  flashattn::quantize_fp8(x_view, out_view, descale_view, QuantizeFp8Options{incoherent, seed}, context);
}

BackwardArgs make_backward_args(ArrayArguments& arrays, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
                                nb::handle dout, nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv,
                                nb::handle maybe_cu_seqlens_q, nb::handle maybe_cu_seqlens_k, std::int64_t max_seqlen_q,
                                std::int64_t max_seqlen_k, std::optional<double> softmax_scale, bool causal,
                                std::int64_t window_left, std::int64_t window_right, double softcap, bool deterministic,
                                const char* algorithm) {
  BackwardArgs args = backward_tensors(arrays, q, k, v, out, dout, lse, dq, dk, dv);
  args.maybe_varlen = make_varlen(arrays, maybe_cu_seqlens_q, maybe_cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  args.options = make_options(softmax_scale, causal, window_left, window_right, softcap, deterministic, algorithm);
  return args;
}

// workspace: a uint8 array of at least backward_workspace_bytes bytes, None, or a
// callable(nbytes) that returns one; the callable is asked only when the pass needs
// scratch (never on the CPU), so a caller gets the backward in one native call.
void backward_binding(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle dout, nb::handle lse,
                      nb::handle dq, nb::handle dk, nb::handle dv, nb::handle maybe_workspace,
                      nb::handle maybe_cu_seqlens_q, nb::handle maybe_cu_seqlens_k, std::int64_t max_seqlen_q,
                      std::int64_t max_seqlen_k, std::optional<double> softmax_scale, bool causal,
                      std::int64_t window_left, std::int64_t window_right, double softcap, bool deterministic,
                      const char* algorithm, int num_threads, std::optional<std::uintptr_t> stream,
                      FLASHATTN_VARIANT_PARAMETERS) {
  ArrayArguments arrays;
  BackwardArgs args = make_backward_args(arrays, q, k, v, out, dout, lse, dq, dk, dv, maybe_cu_seqlens_q,
                                         maybe_cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                                         window_left, window_right, softcap, deterministic, algorithm);
  set_variants(args.options, arrays, FLASHATTN_VARIANT_ARGUMENTS);
  const nb::object allocated_workspace = attach_workspace(arrays, maybe_workspace, args.q.device, args.maybe_workspace,
                                                          [&] { return flashattn::backward_workspace_bytes(args); });
  const ExecutionContext context = make_context(arrays, num_threads, stream);
  nb::gil_scoped_release release;
  flashattn::backward(args, context);
}

std::size_t backward_workspace_bytes_binding(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle dout,
                                             nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv,
                                             nb::handle maybe_cu_seqlens_q, nb::handle maybe_cu_seqlens_k,
                                             std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
                                             std::optional<double> softmax_scale, bool causal, std::int64_t window_left,
                                             std::int64_t window_right, double softcap, bool deterministic,
                                             const char* algorithm, FLASHATTN_VARIANT_PARAMETERS) {
  ArrayArguments arrays;
  BackwardArgs args = make_backward_args(arrays, q, k, v, out, dout, lse, dq, dk, dv, maybe_cu_seqlens_q,
                                         maybe_cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                                         window_left, window_right, softcap, deterministic, algorithm);
  set_variants(args.options, arrays, FLASHATTN_VARIANT_ARGUMENTS);
  return flashattn::backward_workspace_bytes(args);
}

void merge_binding(nb::handle out_a, nb::handle lse_a, nb::handle out_b, nb::handle lse_b, nb::handle out,
                   nb::handle lse, int num_threads, std::optional<std::uintptr_t> stream) {
  ArrayArguments arrays;
  const TensorView out_a_view = arrays.input(out_a, "out_a");
  const TensorView lse_a_view = arrays.input(lse_a, "lse_a");
  const TensorView out_b_view = arrays.input(out_b, "out_b");
  const TensorView lse_b_view = arrays.input(lse_b, "lse_b");
  const TensorView out_view = arrays.output(out, "out");
  const TensorView lse_view = arrays.output(lse, "lse");
  const ExecutionContext context = make_context(arrays, num_threads, stream);
  nb::gil_scoped_release release;
  flashattn::merge_attention_states(out_a_view, lse_a_view, out_b_view, lse_b_view, out_view, lse_view, context);
}

KVCacheArgs make_kvcache_args(ArrayArguments& arrays, nb::handle q, nb::handle k_cache, nb::handle v_cache,
                              nb::handle maybe_k_new, nb::handle maybe_v_new, nb::handle maybe_cache_seqlens,
                              std::optional<std::int64_t> maybe_uniform_cache_seqlen, nb::handle maybe_cache_batch_idx,
                              nb::handle maybe_cache_leftpad, nb::handle maybe_block_table,
                              nb::handle maybe_rotary_cos, nb::handle maybe_rotary_sin, bool rotary_interleaved,
                              nb::handle out, nb::handle maybe_lse, int num_splits, std::optional<double> softmax_scale,
                              bool causal, std::int64_t window_left, std::int64_t window_right, double softcap) {
  KVCacheArgs args;
  args.q = arrays.input(q, "q");
  // The caches are written only when new keys are appended: read-only ones are fine otherwise.
  const bool is_appending = !maybe_k_new.is_none() || !maybe_v_new.is_none();
  args.k_cache = is_appending ? arrays.output(k_cache, "k_cache") : arrays.input(k_cache, "k_cache");
  args.v_cache = is_appending ? arrays.output(v_cache, "v_cache") : arrays.input(v_cache, "v_cache");
  args.maybe_k_new = arrays.maybe_input(maybe_k_new, "k");
  args.maybe_v_new = arrays.maybe_input(maybe_v_new, "v");
  args.maybe_cache_seqlens = arrays.maybe_input(maybe_cache_seqlens, "cache_seqlens");
  args.maybe_uniform_cache_seqlen = maybe_uniform_cache_seqlen;
  args.maybe_cache_batch_idx = arrays.maybe_input(maybe_cache_batch_idx, "cache_batch_idx");
  args.maybe_cache_leftpad = arrays.maybe_input(maybe_cache_leftpad, "cache_leftpad");
  args.maybe_block_table = arrays.maybe_input(maybe_block_table, "block_table");
  args.maybe_rotary_cos = arrays.maybe_input(maybe_rotary_cos, "rotary_cos");
  args.maybe_rotary_sin = arrays.maybe_input(maybe_rotary_sin, "rotary_sin");
  args.rotary_interleaved = rotary_interleaved;
  args.out = arrays.output(out, "out");
  args.maybe_lse = arrays.maybe_output(maybe_lse, "lse");
  args.num_splits = num_splits;
  args.options = make_options(softmax_scale, causal, window_left, window_right, softcap, false, "automatic");
  return args;
}

// The KV-cache arguments, in flash_attn_with_kvcache's order; k_cache/v_cache are
// written when k/v (the new keys/values) are given.
#define FLASHATTN_KVCACHE_PARAMETERS                                                                                   \
  nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle maybe_k_new, nb::handle maybe_v_new,                \
      nb::handle maybe_cache_seqlens, std::optional<std::int64_t> maybe_uniform_cache_seqlen,                          \
      nb::handle maybe_cache_batch_idx, nb::handle maybe_cache_leftpad, nb::handle maybe_block_table,                  \
      nb::handle maybe_rotary_cos, nb::handle maybe_rotary_sin, bool rotary_interleaved, nb::handle out,               \
      nb::handle maybe_lse, int num_splits, std::optional<double> softmax_scale, bool causal, std::int64_t window_left, \
      std::int64_t window_right, double softcap
#define FLASHATTN_KVCACHE_ARGUMENTS                                                                                 \
  q, k_cache, v_cache, maybe_k_new, maybe_v_new, maybe_cache_seqlens, maybe_uniform_cache_seqlen,                   \
      maybe_cache_batch_idx, maybe_cache_leftpad, maybe_block_table, maybe_rotary_cos, maybe_rotary_sin,            \
      rotary_interleaved, out, maybe_lse, num_splits, softmax_scale, causal, window_left, window_right, softcap

// The keywords past flash_attn 2's arguments: ALiBi slopes, and an FP8 cache. A cache
// in float8_e4m3fn arrives as its bytes (uint8 views: not every framework's DLPack
// exports float8) with cache_is_fp8; k/v in uint8 then are e4m3 rows too. k_descale /
// v_descale: float32 [batch|1, heads_kv|1] (FA3's names).
void set_kvcache_keywords(KVCacheArgs& args, ArrayArguments& arrays, nb::handle maybe_alibi_slopes, nb::handle maybe_k_descale,
                          nb::handle maybe_v_descale, bool cache_is_fp8) {
  args.options.maybe_alibi_slopes = arrays.maybe_input(maybe_alibi_slopes, "alibi_slopes");
  args.options.maybe_k_descale = arrays.maybe_input(maybe_k_descale, "k_descale");
  args.options.maybe_v_descale = arrays.maybe_input(maybe_v_descale, "v_descale");
  if (!cache_is_fp8) return;
  for (auto [view, name] : {std::pair{&args.k_cache, "k_cache"}, std::pair{&args.v_cache, "v_cache"}}) {
    if (view->dtype != DType::uint8)
      throw nb::type_error(("flashattn: " + std::string(name) + ": cache_is_fp8 expects the cache's e4m3 bytes (a uint8 view), got " +
                            dtype_name(view->dtype)).c_str());
    view->dtype = DType::float8_e4m3;
  }
  for (TensorView* view : {&args.maybe_k_new, &args.maybe_v_new})
    if (view->defined() && view->dtype == DType::uint8) view->dtype = DType::float8_e4m3;
}

// workspace as in backward: an array, None, or a callable(nbytes) asked only when the
// call needs scratch.
void forward_with_kvcache_binding(FLASHATTN_KVCACHE_PARAMETERS, nb::handle maybe_workspace, int num_threads,
                                  std::optional<std::uintptr_t> stream, nb::handle maybe_alibi_slopes, nb::handle maybe_k_descale,
                                  nb::handle maybe_v_descale, bool cache_is_fp8) {
  ArrayArguments arrays;
  KVCacheArgs args = make_kvcache_args(arrays, FLASHATTN_KVCACHE_ARGUMENTS);
  set_kvcache_keywords(args, arrays, maybe_alibi_slopes, maybe_k_descale, maybe_v_descale, cache_is_fp8);
  const nb::object allocated_workspace = attach_workspace(arrays, maybe_workspace, args.q.device, args.maybe_workspace,
                                                          [&] { return flashattn::kvcache_workspace_bytes(args); });
  const ExecutionContext context = make_context(arrays, num_threads, stream);
  nb::gil_scoped_release release;
  flashattn::forward_with_kvcache(args, context);
}

std::size_t kvcache_workspace_bytes_binding(FLASHATTN_KVCACHE_PARAMETERS, nb::handle maybe_alibi_slopes, nb::handle maybe_k_descale,
                                            nb::handle maybe_v_descale, bool cache_is_fp8) {
  ArrayArguments arrays;
  KVCacheArgs args = make_kvcache_args(arrays, FLASHATTN_KVCACHE_ARGUMENTS);
  set_kvcache_keywords(args, arrays, maybe_alibi_slopes, maybe_k_descale, maybe_v_descale, cache_is_fp8);
  return flashattn::kvcache_workspace_bytes(args);
}

// Dropout's keep mask Z of a dense problem, as every backend draws it: out is a
// writable uint8 host array [batch, heads, seqlen_q, seqlen_k]; out[b, h, i, j] = 1 when
// (b, h, i, j) is kept (flashattn/dropout.hpp). For tests and return_attn_probs.
void dropout_keep_mask_binding(nb::handle out, double dropout_p, std::uint64_t seed, std::uint64_t offset) {
  if (!(dropout_p >= 0.0 && dropout_p < 1.0))
    throw nb::value_error(("flashattn: dropout_p: must be in [0, 1), got " + std::to_string(dropout_p)).c_str());
  ArrayArguments arrays;
  const TensorView view = arrays.output(out, "out");
  if (view.rank != 4 || view.dtype != DType::uint8 || view.device.type != DeviceType::cpu)
    throw nb::value_error("flashattn: out: expected a uint8 host array [batch, heads, seqlen_q, seqlen_k]");
  const DropoutRule rule = DropoutRule::with_probability(dropout_p, seed, offset);
  auto* data = static_cast<std::uint8_t*>(view.data);
  nb::gil_scoped_release release;
  for (std::int64_t b = 0; b < view.size(0); ++b)
    for (std::int64_t h = 0; h < view.size(1); ++h)
      for (std::int64_t i = 0; i < view.size(2); ++i)
        for (std::int64_t j = 0; j < view.size(3); ++j)
          data[b * view.stride(0) + h * view.stride(1) + i * view.stride(2) + j * view.stride(3)] =
              rule.keep(static_cast<std::uint32_t>(b * view.size(1) + h), i, j) ? 1 : 0;
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
  // The largest num_threads the native calls accept (the torch layer clamps torch's thread count to it).
  m.attr("MAX_THREADS") = flashattn::checks::kMaxThreads;

  // ALiBi and dropout: keyword arguments, off by default.
#define FLASHATTN_VARIANT_NAMES                                                                      \
  "alibi_slopes"_a = nb::none(), "dropout_p"_a = 0.0, "dropout_seed"_a = std::uint64_t{0},           \
      "dropout_offset"_a = std::uint64_t{0}, "dropout_seed_offset"_a = nb::none()
  m.def("forward", &forward_binding, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "cu_seqlens_q"_a.none(),
        "cu_seqlens_k"_a.none(), "max_seqlen_q"_a, "max_seqlen_k"_a, "softmax_scale"_a.none(), "causal"_a,
        "window_left"_a, "window_right"_a, "softcap"_a, "algorithm"_a, "num_threads"_a, "stream"_a.none(),
        "block_table"_a.none() = nb::none(), FLASHATTN_VARIANT_NAMES, "fp8"_a = false, "q_descale"_a = nb::none(),
        "k_descale"_a = nb::none(), "v_descale"_a = nb::none(),
        "Attention forward into preallocated out (and lse, float32, when given); block_table (int32 [batch, "
        "max_blocks]): k/v are paged [num_blocks, page_size, heads_kv, head_dim] (varlen only). fp8: uint8 q/k/v "
        "hold float8_e4m3fn codes; q_descale/k_descale/v_descale: float32 [batch, heads_kv] (size-1 dimensions "
        "broadcast), out bfloat16 or float16.");
  m.def("quantize_fp8", &quantize_fp8_binding, "x"_a, "out"_a, "descale"_a, "incoherent"_a, "seed"_a, "num_threads"_a,
        "stream"_a.none(),
        "x (float32/float16/bfloat16, [batch, seqlen, heads, head_dim] or [total, heads, head_dim]) as e4m3 codes "
        "into out (uint8 or float8_e4m3fn, x's shape) and descale (float32 [batch | 1, groups]) = amax / 448 per "
        "(batch, group of heads); incoherent: rotated by a random-sign Hadamard matrix (seed) first.");
  m.def("backward", &backward_binding, "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a,
        "workspace"_a.none(), "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(), "max_seqlen_q"_a, "max_seqlen_k"_a,
        "softmax_scale"_a.none(), "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a, "deterministic"_a,
        "algorithm"_a, "num_threads"_a, "stream"_a.none(), FLASHATTN_VARIANT_NAMES,
        "Attention backward into preallocated dq, dk, dv; workspace: uint8 of backward_workspace_bytes bytes, or a "
        "callable(nbytes) returning one, asked only when scratch is needed.");
  m.def("backward_workspace_bytes", &backward_workspace_bytes_binding, "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a,
        "dq"_a, "dk"_a, "dv"_a, "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(), "max_seqlen_q"_a, "max_seqlen_k"_a,
        "softmax_scale"_a.none(), "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a, "deterministic"_a,
        "algorithm"_a, FLASHATTN_VARIANT_NAMES, "Scratch bytes backward() needs for these arguments (0 on the CPU).");
#define FLASHATTN_KVCACHE_NAMES                                                                                     \
  "q"_a, "k_cache"_a, "v_cache"_a, "k"_a.none(), "v"_a.none(), "cache_seqlens"_a.none(), "uniform_cache_seqlen"_a.none(), \
      "cache_batch_idx"_a.none(), "cache_leftpad"_a.none(), "block_table"_a.none(), "rotary_cos"_a.none(),             \
      "rotary_sin"_a.none(), "rotary_interleaved"_a, "out"_a, "lse"_a.none(), "num_splits"_a, "softmax_scale"_a.none(), \
      "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a
  m.def("forward_with_kvcache", &forward_with_kvcache_binding, FLASHATTN_KVCACHE_NAMES, "workspace"_a.none(),
        "num_threads"_a, "stream"_a.none(), "alibi_slopes"_a = nb::none(), "k_descale"_a = nb::none(), "v_descale"_a = nb::none(),
        "cache_is_fp8"_a = false,
        "Attention of q over a KV cache (flash_attn_with_kvcache), appending k/v to the cache in place when given.");
  m.def("kvcache_workspace_bytes", &kvcache_workspace_bytes_binding, FLASHATTN_KVCACHE_NAMES, "alibi_slopes"_a = nb::none(),
        "k_descale"_a = nb::none(), "v_descale"_a = nb::none(), "cache_is_fp8"_a = false,
        "Scratch bytes forward_with_kvcache needs for these arguments (0 on the CPU or without a split).");
  m.def("merge_attention_states", &merge_binding, "out_a"_a, "lse_a"_a, "out_b"_a, "lse_b"_a, "out"_a, "lse"_a,
        "num_threads"_a, "stream"_a.none(), "Combine two partial attentions of the same queries by their LSEs.");
  m.def("dropout_keep_mask", &dropout_keep_mask_binding, "out"_a, "dropout_p"_a, "seed"_a, "offset"_a,
        "Dropout's keep mask (uint8 [batch, heads, seqlen_q, seqlen_k], 1 = kept) for (dropout_p, seed, offset), "
        "bit for bit the mask every backend and kernel draws.");
  register_mask_bindings(m);
  m.def("cuda_available", &flashattn::cuda_available, "Whether this build has the CUDA backend and a GPU is present.");
}
