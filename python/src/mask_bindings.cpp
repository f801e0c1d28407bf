// python/src/mask_bindings.cpp — the native calls behind flashattn.scaled_dot_product_attention
// and block masks: forward/backward with attn_mask, a block mask and dBias (registered
// from module.cpp by register_mask_bindings). Arrays are in flashattn's layout
// (q [batch, seqlen_q, heads, head_dim], ...); the Python layer transposes PyTorch's
// [batch, heads, seqlen, head_dim] views without copying.
//
// block_mask: None or the tuple made by flashattn/block_mask.py (_native_tuple):
//   (block_size_q, block_size_kv, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
//    q_num_blocks, q_indices, full_q_num_blocks, full_q_indices, partial_bits, partial_ids,
//    q_partial_ids, has_band, diagonal_offset, window_left, window_right, prefix_lengths,
//    q_document_ids, k_document_ids)       arrays may be None where optional.
// dropout_seed_offset: None (dropout_seed/dropout_offset are used) or an int64 {seed, offset}
// array on q's device, read by the kernels at run time (CUDA-graph replays draw fresh masks).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>

#include "flashattn/attention.hpp"
#include "src/core/dense_mask_blocks.hpp"
#include "python/src/array_arguments.hpp"
#include "python/src/call_arguments.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace flashattn::python {
namespace {

constexpr std::size_t kBlockMaskFields = 20;

std::optional<BlockMaskArgs> make_block_mask(ArrayArguments& arrays, nb::handle block_mask) {
  if (block_mask.is_none()) return std::nullopt;
  if (!nb::isinstance<nb::tuple>(block_mask) || nb::len(block_mask) != kBlockMaskFields)
    throw nb::type_error("flashattn: block_mask: expected the native tuple of flashattn.BlockMask (use flashattn.create_block_mask)");
  const nb::tuple t = nb::borrow<nb::tuple>(block_mask);
  BlockMaskArgs a;
  a.block_size_q = nb::cast<std::int64_t>(t[0]);
  a.block_size_kv = nb::cast<std::int64_t>(t[1]);
  a.kv_num_blocks = arrays.input(t[2], "kv_num_blocks");
  a.kv_indices = arrays.input(t[3], "kv_indices");
  a.maybe_full_kv_num_blocks = arrays.maybe_input(t[4], "full_kv_num_blocks");
  a.maybe_full_kv_indices = arrays.maybe_input(t[5], "full_kv_indices");
  a.maybe_q_num_blocks = arrays.maybe_input(t[6], "q_num_blocks");
  a.maybe_q_indices = arrays.maybe_input(t[7], "q_indices");
  a.maybe_full_q_num_blocks = arrays.maybe_input(t[8], "full_q_num_blocks");
  a.maybe_full_q_indices = arrays.maybe_input(t[9], "full_q_indices");
  a.maybe_partial_bits = arrays.maybe_input(t[10], "partial_bits");
  a.maybe_partial_ids = arrays.maybe_input(t[11], "partial_ids");
  a.maybe_q_partial_ids = arrays.maybe_input(t[12], "q_partial_ids");
  a.has_band = nb::cast<bool>(t[13]);
  a.diagonal_offset = nb::cast<std::int64_t>(t[14]);
  a.window_left = nb::cast<std::int64_t>(t[15]);
  a.window_right = nb::cast<std::int64_t>(t[16]);
  a.maybe_prefix_lengths = arrays.maybe_input(t[17], "prefix_lengths");
  a.maybe_q_document_ids = arrays.maybe_input(t[18], "q_document_ids");
  a.maybe_k_document_ids = arrays.maybe_input(t[19], "k_document_ids");
  return a;
}

AttentionOptions make_masked_options(ArrayArguments& arrays, nb::handle attn_mask, nb::handle block_mask,
                                     std::optional<double> softmax_scale, bool causal, std::int64_t window_left,
                                     std::int64_t window_right, double dropout_p, std::uint64_t dropout_seed,
                                     std::uint64_t dropout_offset, nb::handle maybe_dropout_seed_offset) {
  AttentionOptions o;
  o.softmax_scale = softmax_scale;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.dropout_p = dropout_p;
  o.dropout_seed = dropout_seed;
  o.dropout_offset = dropout_offset;
  o.maybe_dropout_seed_offset = arrays.maybe_input(maybe_dropout_seed_offset, "dropout_seed_offset");
  o.maybe_attn_mask = arrays.maybe_input(attn_mask, "attn_mask");
  o.maybe_block_mask = make_block_mask(arrays, block_mask);
  return o;
}

void forward_masked(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle maybe_lse, nb::handle attn_mask,
                    nb::handle block_mask, std::optional<double> softmax_scale, bool causal, std::int64_t window_left,
                    std::int64_t window_right, double dropout_p, std::uint64_t dropout_seed, std::uint64_t dropout_offset,
                    int num_threads, std::optional<std::uintptr_t> stream, nb::handle maybe_dropout_seed_offset) {
  ArrayArguments arrays;
  ForwardArgs args = forward_tensors(arrays, q, k, v, out, maybe_lse);
  args.options = make_masked_options(arrays, attn_mask, block_mask, softmax_scale, causal, window_left, window_right, dropout_p,
                                     dropout_seed, dropout_offset, maybe_dropout_seed_offset);
  const ExecutionContext context{arrays.stream(stream), num_threads};
  nb::gil_scoped_release release;
  flashattn::forward(args, context);
}

void backward_masked(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle dout, nb::handle lse, nb::handle dq,
                     nb::handle dk, nb::handle dv, nb::handle maybe_dbias, nb::handle maybe_workspace, nb::handle attn_mask,
                     nb::handle block_mask, std::optional<double> softmax_scale, bool causal, std::int64_t window_left,
                     std::int64_t window_right, double dropout_p, std::uint64_t dropout_seed, std::uint64_t dropout_offset,
                     int num_threads, std::optional<std::uintptr_t> stream, nb::handle maybe_dropout_seed_offset) {
  ArrayArguments arrays;
  BackwardArgs args = backward_tensors(arrays, q, k, v, out, dout, lse, dq, dk, dv);
  args.maybe_dbias = arrays.maybe_output(maybe_dbias, "dbias");
  args.options = make_masked_options(arrays, attn_mask, block_mask, softmax_scale, causal, window_left, window_right, dropout_p,
                                     dropout_seed, dropout_offset, maybe_dropout_seed_offset);
  const nb::object allocated_workspace = attach_workspace(arrays, maybe_workspace, args.q.device, args.maybe_workspace,
                                                          [&] { return flashattn::backward_workspace_bytes(args); });
  const ExecutionContext context{arrays.stream(stream), num_threads};
  nb::gil_scoped_release release;
  flashattn::backward(args, context);
}

}  // namespace

void register_mask_bindings(nb::module_& m) {
  m.def("forward_masked", &forward_masked, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "attn_mask"_a.none(),
        "block_mask"_a.none(), "softmax_scale"_a.none(), "causal"_a, "window_left"_a, "window_right"_a, "dropout_p"_a,
        "dropout_seed"_a, "dropout_offset"_a, "num_threads"_a, "stream"_a.none(), "dropout_seed_offset"_a = nb::none(),
        "Attention forward with attn_mask (bool or additive bias) and/or a block mask, into preallocated out/lse.");
  m.def("backward_masked", &backward_masked, "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a,
        "dbias"_a.none(), "workspace"_a.none(), "attn_mask"_a.none(), "block_mask"_a.none(), "softmax_scale"_a.none(),
        "causal"_a, "window_left"_a, "window_right"_a, "dropout_p"_a, "dropout_seed"_a, "dropout_offset"_a,
        "num_threads"_a, "stream"_a.none(), "dropout_seed_offset"_a = nb::none(),
        "Attention backward with masks into preallocated dq, dk, dv (and dbias, the gradient of a float attn_mask).");
  m.def("_set_dense_mask_conversion", &flashattn::set_dense_mask_conversion_override, "mode"_a,
        "Benchmarks and tests: 1 converts a dense boolean attn_mask to blocks inside the library, 0 does not, "
        "-1 follows the default (converts unless FLASHATTN_DENSE_MASK=elements, read once per process).");
}

}  // namespace flashattn::python
