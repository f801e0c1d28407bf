// src/core/validate_mask.cpp — the checks of attn_mask, the block mask and dBias
// (called from validate.cpp's check_inputs / validate_backward), and their params.
// Every check names the argument; nothing is written.
#include <algorithm>
#include <string>
#include <vector>

#include "flashattn/block_mask.hpp"
#include "flashattn/error.hpp"
#include "src/core/checks.hpp"
#include "src/core/validate.hpp"

namespace flashattn {
namespace {

using namespace checks;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

struct ListNames {
  const char* num;
  const char* indices;
};

// A (num_blocks, indices) pair: int32, [B|1, H|1, rows] and [B|1, H|1, rows, capacity].
void check_list(const TensorView& num, const TensorView& indices, ListNames names, std::int64_t batch, std::int64_t heads,
                std::int64_t rows, Device device, std::vector<NamedExtent>& inputs) {
  inputs.push_back({names.num, check_any_strides(num, names.num, 3)});
  check_dtype(num, names.num, DType::int32, "");
  check_device(num, names.num, device);
  if (!indices.defined()) fail(names.indices, std::string("missing: given together with ") + names.num);
  inputs.push_back({names.indices, check_any_strides(indices, names.indices, 4)});
  check_dtype(indices, names.indices, DType::int32, "");
  check_device(indices, names.indices, device);
  check_broadcast_shape(num, names.num, {batch, heads, rows}, "[batch, heads_q, blocks]");
  if (num.size(2) != rows)
    fail(names.num, "block count mismatch: " + expected_got(std::to_string(rows) + " blocks in the last dimension (the sequence divided by the block size)", shape_string(num)));
  if (indices.size(0) != num.size(0) || indices.size(1) != num.size(1) || indices.size(2) != rows || indices.size(3) < 1)
    fail(names.indices, "shape mismatch: " + expected_got("[" + std::to_string(num.size(0)) + ", " + std::to_string(num.size(1)) + ", " +
                                                              std::to_string(rows) + ", capacity >= 1] (like " + names.num + ")",
                                                          shape_string(indices)));
}

BlockListTensor list_tensor(const TensorView& num, const TensorView& indices, const TensorView& maybe_ids) {
  BlockListTensor t;
  if (!num.defined()) return t;
  t.num_blocks = static_cast<const std::int32_t*>(num.data);
  t.indices = static_cast<const std::int32_t*>(indices.data);
  t.maybe_ids = maybe_ids.defined() ? static_cast<const std::int32_t*>(maybe_ids.data) : nullptr;
  for (int d = 0; d < 3; ++d) t.num_strides[d] = broadcast_stride(num, d);
  for (int d = 0; d < 4; ++d) t.index_strides[d] = d < 2 ? broadcast_stride(indices, d) : indices.stride(d);
  t.capacity = indices.size(3);
  return t;
}

// CPU only (host memory): counts within capacity, indices in range, no block listed
// twice for one row (partial and full lists together), ids in range.
void check_list_contents(const BlockListTensor& partial, const BlockListTensor& full, ListNames partial_names,
                         ListNames full_names, const char* ids_name, std::int64_t batch_size, std::int64_t head_size,
                         std::int64_t rows, std::int64_t bound, std::int64_t id_count, std::vector<std::int8_t>* maybe_kinds) {
  std::vector<std::int8_t> seen(static_cast<std::size_t>(bound));
  for (std::int64_t b = 0; b < batch_size; ++b)
    for (std::int64_t h = 0; h < head_size; ++h)
      for (std::int64_t m = 0; m < rows; ++m) {
        std::fill(seen.begin(), seen.end(), 0);
        for (int which = 0; which < 2; ++which) {
          const BlockListTensor& list = which == 0 ? partial : full;
          if (!list.present()) continue;
          const ListNames names = which == 0 ? partial_names : full_names;
          const std::int32_t count = list.num_blocks[b * list.num_strides[0] + h * list.num_strides[1] + m * list.num_strides[2]];
          const std::string where = " at [" + std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(m) + "]";
          if (count < 0 || count > list.capacity)
            fail(names.num, "out of range" + where + ": " + expected_got("a count in [0, " + std::to_string(list.capacity) + "]", count));
          const BlockList row = list.row(b, h, m, static_cast<std::int32_t>(bound));
          for (std::int32_t i = 0; i < count; ++i) {
            const std::int32_t index = row.indices[i * row.stride];
            if (index < 0 || index >= bound)
              fail(names.indices, "block index out of range" + where + ": " + expected_got("[0, " + std::to_string(bound) + ")", index));
            if (seen[static_cast<std::size_t>(index)])
              fail(names.indices, "block " + std::to_string(index) + " listed twice" + where + " (partial and full lists together)");
            seen[static_cast<std::size_t>(index)] = static_cast<std::int8_t>(which + 1);
            if (which == 0 && row.maybe_ids != nullptr) {
              const std::int32_t id = row.id_at(i);
              if (id < 0 || id >= id_count)
                fail(ids_name, "partial block id out of range" + where + ": " + expected_got("[0, " + std::to_string(id_count) + ")", id));
            }
          }
        }
        if (maybe_kinds)
          for (std::int64_t n = 0; n < bound; ++n)
            (*maybe_kinds)[static_cast<std::size_t>(((b * head_size + h) * rows + m) * bound + n)] = seen[static_cast<std::size_t>(n)];
      }
}

}  // namespace

void check_mask_options(const AttentionOptions& options, const MaskGeometry& g, const BackendLimits& limits,
                        std::vector<NamedExtent>& inputs) {
  const bool has_attn_mask = options.maybe_attn_mask.defined();
  const bool has_block_mask = options.maybe_block_mask.has_value();
  if (!has_attn_mask && !has_block_mask) return;
  const char* first = has_attn_mask ? "attn_mask" : "block_mask";
  if (!limits.supports_masks)
    unsupported(first, std::string("masks are not supported on the ") + limits.name + " backend yet");
  // Why not: docs/algorithm.md §7b (the packed-batch equivalent is a document mask).
  if (g.is_varlen)
    unsupported(first, "masks are not supported with variable-length batches (cu_seqlens_q, cu_seqlens_k): pack the sequences into one batch item with a document mask (BlockMaskArgs q_document_ids / k_document_ids) or pad them to [batch, max_seqlen]");
  if (has_attn_mask) {
    const TensorView& m = options.maybe_attn_mask;
    inputs.push_back({"attn_mask", check_any_strides(m, "attn_mask", 4)});
    check_device(m, "attn_mask", g.device);
    const bool is_bool = m.dtype == DType::boolean || m.dtype == DType::uint8;
    if (!is_bool && m.dtype != DType::float32 && m.dtype != g.dtype)
      fail("attn_mask", std::string("unsupported dtype: ") + expected_got(std::string("bool, uint8, float32 or ") + dtype_name(g.dtype) + " (like q)", dtype_name(m.dtype)));
    check_broadcast_shape(m, "attn_mask", {g.batch, g.heads_q, g.seqlen_q, g.seqlen_k}, "[batch, heads_q, seqlen_q, seqlen_k]");
  }
  if (!has_block_mask) return;
  const BlockMaskArgs& bm = *options.maybe_block_mask;
  if (!is_valid_mask_block_size(bm.block_size_q))
    unsupported("block_size_q", "must be a power of two in [16, 1024], got " + std::to_string(bm.block_size_q));
  if (!is_valid_mask_block_size(bm.block_size_kv))
    unsupported("block_size_kv", "must be a power of two in [16, 1024], got " + std::to_string(bm.block_size_kv));
  const std::int64_t q_blocks = ceil_div(g.seqlen_q, bm.block_size_q), kv_blocks = ceil_div(g.seqlen_k, bm.block_size_kv);
  check_list(bm.kv_num_blocks, bm.kv_indices, {"kv_num_blocks", "kv_indices"}, g.batch, g.heads_q, q_blocks, g.device, inputs);
  if (bm.maybe_full_kv_num_blocks.defined())
    check_list(bm.maybe_full_kv_num_blocks, bm.maybe_full_kv_indices, {"full_kv_num_blocks", "full_kv_indices"}, g.batch, g.heads_q, q_blocks, g.device, inputs);
  else if (bm.maybe_full_kv_indices.defined())
    fail("full_kv_num_blocks", "missing: given together with full_kv_indices");
  const bool has_q_lists = bm.maybe_q_num_blocks.defined();
  if (has_q_lists) {
    check_list(bm.maybe_q_num_blocks, bm.maybe_q_indices, {"q_num_blocks", "q_indices"}, g.batch, g.heads_q, kv_blocks, g.device, inputs);
    if (bm.maybe_full_q_num_blocks.defined())
      check_list(bm.maybe_full_q_num_blocks, bm.maybe_full_q_indices, {"full_q_num_blocks", "full_q_indices"}, g.batch, g.heads_q, kv_blocks, g.device, inputs);
    if (bm.maybe_full_kv_num_blocks.defined() != bm.maybe_full_q_num_blocks.defined())
      fail("full_q_num_blocks", "the full lists must be given in both directions or in neither (full_kv_num_blocks, full_q_num_blocks)");
  } else if (bm.maybe_q_indices.defined() || bm.maybe_full_q_num_blocks.defined()) {
    fail("q_num_blocks", "missing: the transposed lists start with q_num_blocks");
  }
  if (bm.window_left < -1) fail("block_mask window_left", "must be >= -1, got " + std::to_string(bm.window_left));
  if (bm.window_right < -1) fail("block_mask window_right", "must be >= -1, got " + std::to_string(bm.window_right));
  auto check_int32 = [&](const TensorView& t, const char* name, int rank) {
    inputs.push_back({name, check_any_strides(t, name, rank)});
    check_dtype(t, name, DType::int32, "");
    check_device(t, name, g.device);
  };
  if (bm.maybe_prefix_lengths.defined()) {
    if (!bm.has_band) fail("prefix_lengths", "a prefix-LM rule needs the band (causal or window) it relaxes");
    check_int32(bm.maybe_prefix_lengths, "prefix_lengths", 1);
    if (bm.maybe_prefix_lengths.size(0) != g.batch && bm.maybe_prefix_lengths.size(0) != 1)
      fail("prefix_lengths", "shape mismatch: " + expected_got("[" + std::to_string(g.batch) + "] or [1]", shape_string(bm.maybe_prefix_lengths)));
  }
  if (bm.maybe_q_document_ids.defined() != bm.maybe_k_document_ids.defined())
    fail(bm.maybe_q_document_ids.defined() ? "k_document_ids" : "q_document_ids", "missing: q_document_ids and k_document_ids are given together");
  if (bm.maybe_q_document_ids.defined()) {
    check_int32(bm.maybe_q_document_ids, "q_document_ids", 2);
    check_int32(bm.maybe_k_document_ids, "k_document_ids", 2);
    check_broadcast_shape(bm.maybe_q_document_ids, "q_document_ids", {g.batch, g.seqlen_q}, "[batch, seqlen_q]");
    check_broadcast_shape(bm.maybe_k_document_ids, "k_document_ids", {g.batch, g.seqlen_k}, "[batch, seqlen_k]");
    if (bm.maybe_q_document_ids.size(1) != g.seqlen_q) fail("q_document_ids", "shape mismatch: one id per query row expected, got " + shape_string(bm.maybe_q_document_ids));
    if (bm.maybe_k_document_ids.size(1) != g.seqlen_k) fail("k_document_ids", "shape mismatch: one id per key row expected, got " + shape_string(bm.maybe_k_document_ids));
    if (bm.maybe_q_document_ids.size(1) > 1 && bm.maybe_q_document_ids.stride(1) != 1) fail("q_document_ids", "rows must be contiguous");
    if (bm.maybe_k_document_ids.size(1) > 1 && bm.maybe_k_document_ids.stride(1) != 1) fail("k_document_ids", "rows must be contiguous");
  }
  std::int64_t id_count = 0;
  if (bm.maybe_partial_bits.defined()) {
    const TensorView& bits = bm.maybe_partial_bits;
    check_int32(bits, "partial_bits", 3);
    if (bits.size(1) != bm.block_size_q || bits.size(2) != ceil_div(bm.block_size_kv, 32))
      fail("partial_bits", "shape mismatch: " + expected_got("[partial blocks, " + std::to_string(bm.block_size_q) + ", " +
                                                                  std::to_string(ceil_div(bm.block_size_kv, 32)) + "]", shape_string(bits)));
    if (bits.size(0) > 0 && !bits.is_contiguous()) fail("partial_bits", "must be contiguous");
    id_count = bits.size(0);
    if (!bm.maybe_partial_ids.defined()) fail("partial_ids", "missing: partial_bits needs the partial block ids");
    check_int32(bm.maybe_partial_ids, "partial_ids", 4);
    for (int d = 0; d < 4; ++d)
      if (bm.maybe_partial_ids.size(d) != bm.kv_indices.size(d) || (bm.kv_indices.size(d) > 1 && bm.maybe_partial_ids.stride(d) != bm.kv_indices.stride(d)))
        fail("partial_ids", "layout mismatch: expected the shape and strides of kv_indices " + shape_string(bm.kv_indices) + ", got " + shape_string(bm.maybe_partial_ids));
    if (bm.maybe_q_partial_ids.defined()) {
      if (!has_q_lists) fail("q_partial_ids", "given without q_indices");
      check_int32(bm.maybe_q_partial_ids, "q_partial_ids", 4);
      for (int d = 0; d < 4; ++d)
        if (bm.maybe_q_partial_ids.size(d) != bm.maybe_q_indices.size(d) || (bm.maybe_q_indices.size(d) > 1 && bm.maybe_q_partial_ids.stride(d) != bm.maybe_q_indices.stride(d)))
          fail("q_partial_ids", "layout mismatch: expected the shape and strides of q_indices " + shape_string(bm.maybe_q_indices) + ", got " + shape_string(bm.maybe_q_partial_ids));
    }
  } else if (bm.maybe_partial_ids.defined() || bm.maybe_q_partial_ids.defined()) {
    fail("partial_bits", "missing: partial_ids are given without partial_bits");
  }
  if (g.device.type != DeviceType::cpu) return;  // device memory: the kernels' BlockList clamps (block_mask.hpp)
  // Contents (host memory): ranges, duplicates, and the transposed lists equal to the
  // transpose of the forward lists (else forward and backward would disagree).
  const std::int64_t bsz = bm.kv_num_blocks.size(0), hsz = bm.kv_num_blocks.size(1);
  const BlockListTensor partial_kv = list_tensor(bm.kv_num_blocks, bm.kv_indices, bm.maybe_partial_ids);
  const BlockListTensor full_kv = list_tensor(bm.maybe_full_kv_num_blocks, bm.maybe_full_kv_indices, {});
  std::vector<std::int8_t> kinds(static_cast<std::size_t>(bsz * hsz * q_blocks * kv_blocks));
  check_list_contents(partial_kv, full_kv, {"kv_num_blocks", "kv_indices"}, {"full_kv_num_blocks", "full_kv_indices"}, "partial_ids",
                      bsz, hsz, q_blocks, kv_blocks, id_count, has_q_lists ? &kinds : nullptr);
  if (!has_q_lists) return;
  const std::int64_t qbsz = bm.maybe_q_num_blocks.size(0), qhsz = bm.maybe_q_num_blocks.size(1);
  const BlockListTensor partial_q = list_tensor(bm.maybe_q_num_blocks, bm.maybe_q_indices, bm.maybe_q_partial_ids);
  const BlockListTensor full_q = list_tensor(bm.maybe_full_q_num_blocks, bm.maybe_full_q_indices, {});
  std::vector<std::int8_t> q_kinds(static_cast<std::size_t>(qbsz * qhsz * kv_blocks * q_blocks));
  check_list_contents(partial_q, full_q, {"q_num_blocks", "q_indices"}, {"full_q_num_blocks", "full_q_indices"}, "q_partial_ids",
                      qbsz, qhsz, kv_blocks, q_blocks, id_count, &q_kinds);
  for (std::int64_t b = 0; b < std::max(bsz, qbsz); ++b)
    for (std::int64_t h = 0; h < std::max(hsz, qhsz); ++h)
      for (std::int64_t m = 0; m < q_blocks; ++m)
        for (std::int64_t n = 0; n < kv_blocks; ++n) {
          const auto kv_kind = kinds[static_cast<std::size_t>((((bsz > 1 ? b : 0) * hsz + (hsz > 1 ? h : 0)) * q_blocks + m) * kv_blocks + n)];
          const auto q_kind = q_kinds[static_cast<std::size_t>((((qbsz > 1 ? b : 0) * qhsz + (qhsz > 1 ? h : 0)) * kv_blocks + n) * q_blocks + m)];
          if (kv_kind != q_kind)
            fail("q_indices", "not the transpose of kv_indices: block (q " + std::to_string(m) + ", kv " + std::to_string(n) + ") of [" +
                                  std::to_string(b) + ", " + std::to_string(h) + "] is " + (kv_kind == 0 ? "absent" : kv_kind == 1 ? "partial" : "full") +
                                  " in the kv lists but " + (q_kind == 0 ? "absent" : q_kind == 1 ? "partial" : "full") + " in the q lists");
        }
}

void set_mask_params(AttentionParams& p, const AttentionOptions& options) {
  if (options.maybe_attn_mask.defined()) {
    const TensorView& m = options.maybe_attn_mask;
    p.maybe_attn_mask = m.data;
    p.attn_mask_dtype = m.dtype;
    p.attn_mask_is_bias = !(m.dtype == DType::boolean || m.dtype == DType::uint8);
    for (int d = 0; d < 4; ++d) p.attn_mask_strides[d] = broadcast_stride(m, d);
  }
  if (!options.maybe_block_mask) return;
  const BlockMaskArgs& bm = *options.maybe_block_mask;
  BlockMaskView& v = p.block_mask;
  v.block_m = bm.block_size_q;
  v.block_n = bm.block_size_kv;
  v.q_blocks = ceil_div(p.seqlen_q, v.block_m);
  v.kv_blocks = ceil_div(p.seqlen_k, v.block_n);
  v.partial_kv = list_tensor(bm.kv_num_blocks, bm.kv_indices, bm.maybe_partial_ids);
  v.full_kv = list_tensor(bm.maybe_full_kv_num_blocks, bm.maybe_full_kv_indices, {});
  v.partial_q = list_tensor(bm.maybe_q_num_blocks, bm.maybe_q_indices, bm.maybe_q_partial_ids);
  v.full_q = list_tensor(bm.maybe_full_q_num_blocks, bm.maybe_full_q_indices, {});
  ElementRule& r = v.rule;
  r.has_band = bm.has_band;
  r.diagonal_offset = bm.diagonal_offset;
  r.window_left = bm.window_left;
  r.window_right = bm.window_right;
  if (bm.maybe_prefix_lengths.defined()) {
    r.maybe_prefix_lengths = static_cast<const std::int32_t*>(bm.maybe_prefix_lengths.data);
    r.prefix_batch_stride = broadcast_stride(bm.maybe_prefix_lengths, 0);
  }
  if (bm.maybe_q_document_ids.defined()) {
    r.maybe_q_document_ids = static_cast<const std::int32_t*>(bm.maybe_q_document_ids.data);
    r.maybe_k_document_ids = static_cast<const std::int32_t*>(bm.maybe_k_document_ids.data);
    r.q_document_batch_stride = broadcast_stride(bm.maybe_q_document_ids, 0);
    r.k_document_batch_stride = broadcast_stride(bm.maybe_k_document_ids, 0);
  }
  r.block_m = v.block_m;
  r.block_n = v.block_n;
  r.words_per_row = ceil_div(v.block_n, 32);
  if (bm.maybe_partial_bits.defined()) {
    r.maybe_partial_bits = static_cast<const std::uint32_t*>(bm.maybe_partial_bits.data);
    r.partial_block_count = bm.maybe_partial_bits.size(0);
  }
}

// dBias: attn_mask's shape and dtype, a float attn_mask only.
Extent check_dbias(const TensorView& dbias, const AttentionOptions& options) {
  if (!options.maybe_attn_mask.defined()) fail("dbias", "given without attn_mask (dBias is the gradient of a float attn_mask)");
  const TensorView& m = options.maybe_attn_mask;
  if (m.dtype == DType::boolean || m.dtype == DType::uint8) fail("dbias", "attn_mask is boolean: it has no gradient");
  const Extent e = check_any_strides(dbias, "dbias", 4);
  check_dtype(dbias, "dbias", m.dtype, " (like attn_mask)");
  check_device(dbias, "dbias", m.device);
  check_shape(dbias, "dbias", std::vector<std::int64_t>(m.shape.begin(), m.shape.begin() + 4), " (like attn_mask)");
  for (int d = 0; d < 4; ++d)
    if (dbias.size(d) > 1 && dbias.stride(d) == 0) fail("dbias", "an output cannot have zero strides (dimension " + std::to_string(d) + ")");
  return e;
}

void set_dbias_params(BackwardParams& p, const TensorView& dbias) {
  p.maybe_dbias = dbias.data;
  for (int d = 0; d < 4; ++d) {
    p.dbias_shape[d] = dbias.size(d);
    p.dbias_strides[d] = dbias.stride(d);
  }
}

}  // namespace flashattn
