// src/core/validate.cpp — every argument check of the library, in one place.
#include "src/core/validate.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "flashattn/error.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/core/checks.hpp"

namespace flashattn {
namespace {

using namespace checks;


void check_options(const AttentionOptions& options, std::int64_t head_dim, const BackendLimits& limits,
                   Device device) {
  check_common_options(options);
  if (!(options.dropout_p >= 0.0 && options.dropout_p < 1.0)) fail("dropout_p", "must be in [0, 1), got " + std::to_string(options.dropout_p));
  const auto algorithm_index = static_cast<std::size_t>(options.algorithm);
  if (algorithm_index >= static_cast<std::size_t>(kAlgorithmCount)) fail("algorithm", "unknown algorithm value " + std::to_string(algorithm_index));
  if (!limits.supports_algorithm[algorithm_index])
    unsupported("algorithm", std::string(algorithm_name(options.algorithm)) + " is not available on " + to_string(device) +
                                 " (" + limits.name + " backend)");
  if (head_dim <= 0) fail("q", "head_dim must be >= 1, got " + std::to_string(head_dim));
  if (head_dim > limits.max_head_dim)
    unsupported("q", "head_dim " + std::to_string(head_dim) + " exceeds the " + limits.name + " backend's limit of " +
                         std::to_string(limits.max_head_dim));
  if (head_dim % limits.head_dim_multiple != 0)
    unsupported("q", "head_dim must be a multiple of " + std::to_string(limits.head_dim_multiple) + " on the " +
                         limits.name + " backend, got " + std::to_string(head_dim));
}

void check_compute_dtype(const TensorView& q, const BackendLimits& limits) {
  const bool is_half = q.dtype == DType::float16 || q.dtype == DType::bfloat16;
  const bool ok = (q.dtype == DType::float32 && limits.supports_float32) || (is_half && limits.supports_half) ||
                  (q.dtype == DType::float8_e4m3 && limits.supports_fp8);
  if (ok) return;
  std::string accepted;
  if (limits.supports_float32) accepted += "float32";
  if (limits.supports_half) accepted += std::string(accepted.empty() ? "" : ", ") + "float16, bfloat16";
  if (limits.supports_fp8) accepted += std::string(accepted.empty() ? "" : ", ") + "float8_e4m3fn";
  const std::string problem = "unsupported dtype: " + expected_got(accepted + " on the " + limits.name + " backend", dtype_name(q.dtype));
  if (q.dtype == DType::float8_e4m3) unsupported("q", problem);  // valid input, no kernel for it here
  fail("q", problem);
}

// Geometry shared by forward and backward, read off q/k/v (+ varlen).
struct Geometry {
  bool is_varlen = false;
  std::int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  std::int64_t total_q = 0, total_k = 0;  // paged: total_k = rows of the gathered keys (see check_block_table)
  const std::int32_t* cu_q = nullptr;
  const std::int32_t* cu_k = nullptr;
  // Paged K/V (varlen forward only): k/v are pools of pages, mapped by block_table.
  bool is_paged = false;
  const std::int32_t* block_table = nullptr;
  std::int64_t block_table_stride = 0, max_blocks = 0, page_size = 0, num_blocks = 0;
  std::vector<NamedExtent> input_extents;
};

void check_cu_seqlens(const TensorView& cu, const std::string& name, std::int64_t batch, std::int64_t total,
                      std::int64_t max_seqlen, const std::string& max_name, Device device) {
  check_layout(cu, name, 1);
  check_dtype(cu, name, DType::int32, "");
  check_device(cu, name, device);
  if (cu.size(0) != batch + 1) fail(name, "shape mismatch: " + expected_got("[" + std::to_string(batch + 1) + "] (batch + 1, like cu_seqlens_q)", shape_string(cu)));
  if (device.type != DeviceType::cpu) return;  // device memory: checked by the kernel's documented contract
  const auto* data = static_cast<const std::int32_t*>(cu.data);
  const std::int64_t stride = cu.stride(0);
  if (batch >= 0 && cu.size(0) > 0 && data[0] != 0) fail(name, "must start at 0, got " + std::to_string(data[0]));
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t begin = data[b * stride];
    const std::int64_t end = data[(b + 1) * stride];
    if (end < begin) fail(name, "must be non-decreasing: entry " + std::to_string(b + 1) + " is " + std::to_string(end) + " < " + std::to_string(begin));
    if (end - begin > max_seqlen)
      fail(max_name, "sequence " + std::to_string(b) + " has length " + std::to_string(end - begin) + " > " + max_name + " = " + std::to_string(max_seqlen));
  }
  if (batch > 0 && data[batch * stride] > total)
    fail(name, "last entry " + expected_got("<= " + std::to_string(total) + " (rows of the packed tensor)", data[batch * stride]));
}

// Paged K/V: block_table int32 [batch, max_blocks] maps key j of sequence b to row
// j % page_size of page block_table[b, j / page_size] of the k/v pools. cu_seqlens_k
// gives each sequence's length only (its differences); where sequence b's keys would
// start in a packed k does not matter. Capacity: max_seqlen_k <= max_blocks * page_size.
// Host-resident tables are range-checked over the pages each sequence touches (unused
// slots may hold anything, as in forward_with_kvcache); device-resident ones are the
// caller's contract, the CUDA gather clamping a page id outside the pool into it.
void check_block_table(Geometry& g, const VarlenArgs& varlen, const TensorView& k, Device device) {
  const TensorView& table = varlen.maybe_block_table;
  check_layout(table, "block_table", 2);
  check_dtype(table, "block_table", DType::int32, "");
  check_device(table, "block_table", device);
  if (table.size(0) != g.batch)
    fail("block_table", "shape mismatch: " + expected_got("[" + std::to_string(g.batch) + ", max_blocks_per_seq] (batch like cu_seqlens_q)", shape_string(table)));
  if (table.stride(1) != 1 && table.size(1) > 1) fail("block_table", "rows must be contiguous: stride " + expected_got(1, table.stride(1)));
  g.num_blocks = k.size(0);
  g.page_size = k.size(1);
  g.max_blocks = table.size(1);
  g.block_table_stride = table.stride(0);
  g.block_table = static_cast<const std::int32_t*>(table.data);
  if (g.page_size < 1) fail("k", "page_size (dimension 1 of a paged k) must be >= 1, got " + std::to_string(g.page_size));
  const std::int64_t capacity = checked_mul(g.max_blocks, g.page_size, "block_table");
  if (varlen.max_seqlen_k > capacity)
    fail("block_table", "max_seqlen_k = " + std::to_string(varlen.max_seqlen_k) + " keys exceed the capacity " + std::to_string(capacity) +
                            " (max_blocks_per_seq * page_size)");
  // Lengths only: no bound on the last entry from the rows of k (k is a page pool).
  check_cu_seqlens(varlen.cu_seqlens_k, "cu_seqlens_k", g.batch, std::numeric_limits<std::int64_t>::max(), varlen.max_seqlen_k,
                   "max_seqlen_k", device);
  if (device.type == DeviceType::cpu) {
    const auto* cu = static_cast<const std::int32_t*>(varlen.cu_seqlens_k.data);
    for (std::int64_t b = 0; b < g.batch; ++b) {
      const std::int64_t length = cu[b + 1] - cu[b];
      for (std::int64_t page = 0; page < (length + g.page_size - 1) / g.page_size; ++page) {
        const std::int64_t block = g.block_table[b * g.block_table_stride + page];
        if (block < 0 || block >= g.num_blocks)
          fail("block_table", "entry [" + std::to_string(b) + ", " + std::to_string(page) + "] " +
                                  expected_got("a block id in [0, " + std::to_string(g.num_blocks) + ") (num_blocks of k)", block));
      }
    }
    g.total_k = g.batch > 0 ? cu[g.batch] : 0;
  } else {
    // The gathered keys fill at most batch * max_seqlen_k rows (every length <= max_seqlen_k).
    g.total_k = checked_mul(g.batch, varlen.max_seqlen_k, "max_seqlen_k");
  }
}

}  // namespace

// ALiBi slopes and the dropout seed/offset tensor (shared with the KV-cache validation).
void check_variant_tensors(const AttentionOptions& options, std::int64_t batch, std::int64_t heads_q, Device device,
                           std::vector<NamedExtent>& inputs) {
  if (options.maybe_alibi_slopes.defined()) {
    const TensorView& slopes = options.maybe_alibi_slopes;
    const Extent e = check_layout(slopes, "alibi_slopes", slopes.rank);
    check_dtype(slopes, "alibi_slopes", DType::float32, "");
    check_device(slopes, "alibi_slopes", device);
    const bool per_head = slopes.rank == 1 && slopes.size(0) == heads_q;
    const bool per_batch_head = slopes.rank == 2 && slopes.size(0) == batch && slopes.size(1) == heads_q;
    if (!per_head && !per_batch_head)
      fail("alibi_slopes", "shape mismatch: " + expected_got("[" + std::to_string(heads_q) + "] or [" + std::to_string(batch) + ", " +
                                                                 std::to_string(heads_q) + "] ([heads_q] or [batch, heads_q])",
                                                             shape_string(slopes)));
    if (slopes.stride(slopes.rank - 1) != 1 && heads_q > 1)
      fail("alibi_slopes", "the heads dimension must be contiguous: stride " + expected_got(1, slopes.stride(slopes.rank - 1)));
    inputs.push_back({"alibi_slopes", e});
  }
  if (options.maybe_dropout_seed_offset.defined()) {
    const TensorView& t = options.maybe_dropout_seed_offset;
    const Extent e = check_layout(t, "dropout_seed_offset", 1);
    check_dtype(t, "dropout_seed_offset", DType::int64, " ({seed, offset})");
    check_device(t, "dropout_seed_offset", device);
    check_shape(t, "dropout_seed_offset", {2}, " ({seed, offset})");
    if (t.stride(0) != 1) fail("dropout_seed_offset", "must be contiguous: stride " + expected_got(1, t.stride(0)));
    inputs.push_back({"dropout_seed_offset", e});
  }
}

// The ALiBi and dropout fields of the parameter struct.
void set_variant_params(AttentionParams& p, const AttentionOptions& options) {
  if (options.maybe_alibi_slopes.defined()) {
    p.maybe_alibi_slopes = static_cast<const float*>(options.maybe_alibi_slopes.data);
    p.alibi_batch_stride = options.maybe_alibi_slopes.rank == 2 ? options.maybe_alibi_slopes.stride(0) : 0;
  }
  if (options.dropout_p > 0.0) {
    const DropoutRule rule = DropoutRule::with_probability(options.dropout_p, options.dropout_seed, options.dropout_offset);
    p.dropout_keep_threshold = rule.keep_threshold;
    p.dropout_inverse_keep = rule.inverse_keep;
    p.dropout_seed = options.dropout_seed;
    p.dropout_offset = options.dropout_offset;
    if (options.maybe_dropout_seed_offset.defined())
      p.maybe_dropout_seed_offset = static_cast<const std::int64_t*>(options.maybe_dropout_seed_offset.data);
  }
}

// FP8 descales: float32 [batch, heads_kv], size-1 dimensions broadcast (zero strides
// anywhere), on q's device; only with float8_e4m3 inputs.
void check_fp8_descales(const AttentionOptions& options, bool is_fp8, std::int64_t batch, std::int64_t heads_kv,
                        Device device, std::vector<NamedExtent>& inputs) {
  const std::pair<const TensorView*, const char*> descales[] = {
      {&options.maybe_q_descale, "q_descale"}, {&options.maybe_k_descale, "k_descale"}, {&options.maybe_v_descale, "v_descale"}};
  for (const auto& [descale, name] : descales) {
    if (!descale->defined()) continue;
    if (!is_fp8) fail(name, "given, but the inputs are not float8_e4m3fn (descales apply to FP8 inputs only)");
    const Extent e = check_any_strides(*descale, name, 2);
    check_dtype(*descale, name, DType::float32, "");
    check_device(*descale, name, device);
    check_broadcast_shape(*descale, name, {batch, heads_kv}, "[batch, heads_kv]");
    inputs.push_back({name, e});
  }
}

void set_fp8_params(AttentionParams& p, const AttentionOptions& options) {
  const std::pair<const TensorView*, std::pair<const float**, std::int64_t*>> descales[] = {
      {&options.maybe_q_descale, {&p.maybe_q_descale, p.q_descale_strides}},
      {&options.maybe_k_descale, {&p.maybe_k_descale, p.k_descale_strides}},
      {&options.maybe_v_descale, {&p.maybe_v_descale, p.v_descale_strides}}};
  for (const auto& [descale, fields] : descales) {
    if (!descale->defined()) continue;
    *fields.first = static_cast<const float*>(descale->data);
    fields.second[0] = broadcast_stride(*descale, 0);
    fields.second[1] = broadcast_stride(*descale, 1);
  }
}

namespace {

Geometry check_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                      const std::optional<VarlenArgs>& varlen, const AttentionOptions& options,
                      const BackendLimits& limits) {
  Geometry g;
  g.is_varlen = varlen.has_value();
  g.is_paged = g.is_varlen && varlen->maybe_block_table.defined();
  const int rank = g.is_varlen ? 3 : 4;
  const int kv_rank = g.is_paged ? 4 : rank;  // paged: k/v are [num_blocks, page_size, heads_kv, head_dim] pools
  const Extent q_extent = check_layout(q, "q", rank);
  check_compute_dtype(q, limits);
  check_dtype(k, "k", q.dtype, " (like q)");
  check_dtype(v, "v", q.dtype, " (like q)");
  check_device(k, "k", q.device);
  check_device(v, "v", q.device);
  const Extent k_extent = check_layout(k, "k", kv_rank);
  const Extent v_extent = check_layout(v, "v", kv_rank);
  const int h = rank - 2;  // heads dimension
  const int d = rank - 1;  // head_dim dimension
  const int kv_h = kv_rank - 2, kv_d = kv_rank - 1;
  g.head_dim = q.size(d);
  g.heads_q = q.size(h);
  g.heads_kv = k.size(kv_h);
  if (k.size(kv_d) != g.head_dim) fail("k", "head_dim mismatch: " + expected_got(std::to_string(g.head_dim) + " (like q)", k.size(kv_d)));
  if (v.size(kv_d) != g.head_dim) fail("v", "head_dim mismatch: " + expected_got(std::to_string(g.head_dim) + " (like q)", v.size(kv_d)));
  if (v.size(kv_h) != g.heads_kv) fail("v", "heads mismatch: " + expected_got(std::to_string(g.heads_kv) + " (like k)", v.size(kv_h)));
  if (v.size(0) != k.size(0) || (kv_rank == 4 && v.size(1) != k.size(1)))
    fail("v", "shape mismatch: " + expected_got(shape_string(k) + " up to head_dim (like k)", shape_string(v)));
  if (g.heads_kv <= 0) fail("k", "heads_kv must be >= 1, got " + std::to_string(g.heads_kv));
  if (g.heads_q <= 0) fail("q", "heads_q must be >= 1, got " + std::to_string(g.heads_q));
  if (g.heads_q % g.heads_kv != 0)
    fail("k", "heads_q must be a multiple of heads_kv (GQA/MQA): heads_q = " + std::to_string(g.heads_q) +
                  ", heads_kv = " + std::to_string(g.heads_kv));
  check_options(options, g.head_dim, limits, q.device);
  if (g.is_varlen) {
    g.total_q = q.size(0);
    g.total_k = k.size(0);
    if (varlen->max_seqlen_q < 0) fail("max_seqlen_q", "must be >= 0, got " + std::to_string(varlen->max_seqlen_q));
    if (varlen->max_seqlen_k < 0) fail("max_seqlen_k", "must be >= 0, got " + std::to_string(varlen->max_seqlen_k));
    // A maximum no sequence can reach would only size work that is never done (and
    // with 2^62 overflow the work counts): bound it by the rows that exist.
    if (varlen->max_seqlen_q > g.total_q)
      fail("max_seqlen_q", expected_got("<= " + std::to_string(g.total_q) + " (rows of q)", varlen->max_seqlen_q));
    if (!g.is_paged && varlen->max_seqlen_k > g.total_k)
      fail("max_seqlen_k", expected_got("<= " + std::to_string(g.total_k) + " (rows of k)", varlen->max_seqlen_k));
    if (!varlen->cu_seqlens_q.defined() || varlen->cu_seqlens_q.rank != 1)
      fail("cu_seqlens_q", "expected an int32 tensor of shape [batch + 1], got rank " + std::to_string(varlen->cu_seqlens_q.rank));
    g.batch = varlen->cu_seqlens_q.size(0) - 1;
    if (g.batch < 0) fail("cu_seqlens_q", "must have batch + 1 >= 1 entries, got 0");
    check_cu_seqlens(varlen->cu_seqlens_q, "cu_seqlens_q", g.batch, g.total_q, varlen->max_seqlen_q, "max_seqlen_q", q.device);
    if (g.is_paged) {
      check_block_table(g, *varlen, k, q.device);
    } else {
      check_cu_seqlens(varlen->cu_seqlens_k, "cu_seqlens_k", g.batch, g.total_k, varlen->max_seqlen_k, "max_seqlen_k", q.device);
    }
    g.seqlen_q = varlen->max_seqlen_q;
    g.seqlen_k = varlen->max_seqlen_k;
    g.cu_q = static_cast<const std::int32_t*>(varlen->cu_seqlens_q.data);
    g.cu_k = static_cast<const std::int32_t*>(varlen->cu_seqlens_k.data);
    if (varlen->cu_seqlens_q.stride(0) != 1 && g.batch > 0) fail("cu_seqlens_q", "must be contiguous: stride " + expected_got(1, varlen->cu_seqlens_q.stride(0)));
    if (varlen->cu_seqlens_k.stride(0) != 1 && g.batch > 0) fail("cu_seqlens_k", "must be contiguous: stride " + expected_got(1, varlen->cu_seqlens_k.stride(0)));
  } else {
    g.batch = q.size(0);
    g.seqlen_q = q.size(1);
    g.seqlen_k = k.size(1);
    if (k.size(0) != g.batch) fail("k", "batch mismatch: " + expected_got(std::to_string(g.batch) + " (like q)", k.size(0)));
    g.total_q = checked_mul(g.batch, g.seqlen_q, "q");
    g.total_k = checked_mul(g.batch, g.seqlen_k, "k");
  }
  // The work counts the backends size their loops by (rows of every (sequence, head)).
  checked_mul(checked_mul(g.batch, g.heads_q, "q"), g.seqlen_q, g.is_varlen ? "max_seqlen_q" : "q");
  checked_mul(checked_mul(g.batch, g.heads_kv, "k"), g.seqlen_k, g.is_varlen ? "max_seqlen_k" : "k");
  g.input_extents = {{"q", q_extent}, {"k", k_extent}, {"v", v_extent}};
  check_variant_tensors(options, g.batch, g.heads_q, q.device, g.input_extents);
  const bool is_fp8 = q.dtype == DType::float8_e4m3;
  check_fp8_descales(options, is_fp8, g.batch, g.heads_kv, q.device, g.input_extents);
  // FP8 inputs are dequantised to float32 wherever a float bias meets them (CPU), so
  // a float attn_mask is float32 there.
  const DType mask_dtype = is_fp8 ? DType::float32 : q.dtype;
  check_mask_options(options, MaskGeometry{g.is_varlen, g.batch, g.heads_q, g.seqlen_q, g.seqlen_k, q.device, mask_dtype}, limits,
                     g.input_extents);
  if (g.is_varlen) {
    g.input_extents.push_back({"cu_seqlens_q", check_layout(varlen->cu_seqlens_q, "cu_seqlens_q", 1)});
    g.input_extents.push_back({"cu_seqlens_k", check_layout(varlen->cu_seqlens_k, "cu_seqlens_k", 1)});
    if (g.is_paged) g.input_extents.push_back({"block_table", check_layout(varlen->maybe_block_table, "block_table", 2)});
  }
  return g;
}

std::vector<std::int64_t> lse_shape(const Geometry& g) {
  if (g.is_varlen) return {g.heads_q, g.total_q};
  return {g.batch, g.heads_q, g.seqlen_q};
}

Extent check_lse(const TensorView& lse, const std::string& name, const Geometry& g, Device device) {
  const int rank = g.is_varlen ? 2 : 3;
  const Extent e = check_layout(lse, name, rank);
  check_dtype(lse, name, DType::float32, "");
  check_device(lse, name, device);
  check_shape(lse, name, lse_shape(g), g.is_varlen ? " ([heads_q, total_q])" : " ([batch, heads_q, seqlen_q])");
  return e;
}

Extent check_like(const TensorView& t, const std::string& name, const TensorView& model, const std::string& model_name) {
  const Extent e = check_layout(t, name, model.rank);
  check_dtype(t, name, model.dtype, " (like " + model_name + ")");
  check_device(t, name, model.device);
  check_shape(t, name, std::vector<std::int64_t>(model.shape.begin(), model.shape.begin() + model.rank), " (like " + model_name + ")");
  return e;
}

// The output of FP8 inputs: q's shape, in bfloat16 or float16 (FA3 returns bfloat16).
Extent check_fp8_out(const TensorView& out, const TensorView& q) {
  const Extent e = check_layout(out, "out", q.rank);
  if (out.dtype != DType::bfloat16 && out.dtype != DType::float16)
    fail("out", "unsupported dtype: " + expected_got("bfloat16 or float16 (the output of float8_e4m3fn inputs)", dtype_name(out.dtype)));
  check_device(out, "out", q.device);
  check_shape(out, "out", std::vector<std::int64_t>(q.shape.begin(), q.shape.begin() + q.rank), " (like q)");
  return e;
}

// Strides of a [batch, row, head, dim] (or varlen [row, head, dim]) view.
struct Strides3 {
  std::int64_t batch, row, head;
};
Strides3 strides_of(const TensorView& t, bool is_varlen) {
  if (is_varlen) return {0, t.stride(0), t.stride(1)};
  return {t.stride(0), t.stride(1), t.stride(2)};
}

AttentionParams make_params(const Geometry& g, const TensorView& q, const TensorView& k, const TensorView& v,
                            const AttentionOptions& options) {
  AttentionParams p;
  p.dtype = q.dtype;
  p.input_dtype = q.dtype;
  p.device = q.device;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.batch = g.batch;
  p.seqlen_q = g.seqlen_q;
  p.seqlen_k = g.seqlen_k;
  p.heads_q = g.heads_q;
  p.heads_kv = g.heads_kv;
  p.head_dim = g.head_dim;
  p.group_size = g.heads_q / g.heads_kv;
  // Paged k/v: the batch stride is the page stride ([num_blocks, page_size, heads_kv, head_dim]).
  const Strides3 qs = strides_of(q, g.is_varlen), ks = strides_of(k, g.is_varlen && !g.is_paged),
                 vs = strides_of(v, g.is_varlen && !g.is_paged);
  p.q_batch_stride = qs.batch, p.q_row_stride = qs.row, p.q_head_stride = qs.head;
  p.k_batch_stride = ks.batch, p.k_row_stride = ks.row, p.k_head_stride = ks.head;
  p.v_batch_stride = vs.batch, p.v_row_stride = vs.row, p.v_head_stride = vs.head;
  p.maybe_cu_seqlens_q = g.cu_q;
  p.maybe_cu_seqlens_k = g.cu_k;
  p.total_q = g.total_q;
  p.total_k = g.total_k;
  if (g.is_paged) {
    p.maybe_block_table = g.block_table;
    p.block_table_batch_stride = g.block_table_stride;
    p.max_blocks_per_seq = g.max_blocks;
    p.page_size = g.page_size;
    p.num_blocks = g.num_blocks;
  }
  const double scale = options.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(g.head_dim)));
  p.softmax_scale = static_cast<float>(scale);
  p.softmax_scale_log2 = static_cast<float>(scale * online_softmax::kLog2e);
  p.softcap = static_cast<float>(options.softcap);
  p.is_causal = options.causal;
  // Windows at least as wide as the whole problem are the same as unbounded; folding
  // them keeps index arithmetic (row + offset + window) far from int64 overflow.
  const std::int64_t span = g.seqlen_q + g.seqlen_k;
  p.window_left = options.window_left >= span ? -1 : options.window_left;
  p.window_right = options.causal ? 0 : (options.window_right >= span ? -1 : options.window_right);
  set_variant_params(p, options);
  set_fp8_params(p, options);
  set_mask_params(p, options);
  return p;
}

void set_lse_strides(AttentionParams& p, const TensorView& lse, bool is_varlen) {
  if (is_varlen) {
    p.lse_batch_stride = 0, p.lse_head_stride = lse.stride(0), p.lse_row_stride = lse.stride(1);
  } else {
    p.lse_batch_stride = lse.stride(0), p.lse_head_stride = lse.stride(1), p.lse_row_stride = lse.stride(2);
  }
}

}  // namespace

BackendLimits limits_for(Device device) {
  if (device.type == DeviceType::cpu) return cpu::limits();
  if (!cuda::available())
    unsupported("q", "tensor is on " + to_string(device) + " but this build has no usable CUDA backend (built with FLASHATTN_CUDA=OFF or no GPU present)");
  return cuda::limits();
}

AttentionParams validate_forward(const ForwardArgs& args) {
  if (!args.q.defined()) fail("q", "missing tensor (rank 0)");
  const BackendLimits limits = limits_for(args.q.device);
  Geometry g = check_inputs(args.q, args.k, args.v, args.maybe_varlen, args.options, limits);
  const bool is_fp8 = args.q.dtype == DType::float8_e4m3;
  std::vector<NamedExtent> outputs{{"out", is_fp8 ? check_fp8_out(args.out, args.q) : check_like(args.out, "out", args.q, "q")}};
  if (args.maybe_lse.defined()) outputs.push_back({"lse", check_lse(args.maybe_lse, "lse", g, args.q.device)});
  std::vector<NamedExtent> all = g.input_extents;
  all.insert(all.end(), outputs.begin(), outputs.end());
  check_no_overlap(outputs, all);

  AttentionParams p = make_params(g, args.q, args.k, args.v, args.options);
  p.dtype = args.out.dtype;  // = q's, or bfloat16/float16 for FP8 inputs
  p.out = args.out.data;
  const Strides3 os = strides_of(args.out, g.is_varlen);
  p.out_batch_stride = os.batch, p.out_row_stride = os.row, p.out_head_stride = os.head;
  if (args.maybe_lse.defined()) {
    p.maybe_lse = static_cast<float*>(args.maybe_lse.data);
    set_lse_strides(p, args.maybe_lse, g.is_varlen);
  }
  return p;
}

BackwardParams validate_backward(const BackwardArgs& args) {
  if (!args.q.defined()) fail("q", "missing tensor (rank 0)");
  for (const auto& [input, name] : {std::pair{&args.q, "q"}, std::pair{&args.k, "k"}, std::pair{&args.v, "v"}})
    if (input->defined() && input->dtype == DType::float8_e4m3)
      unsupported(name, std::string(dtype_name(DType::float8_e4m3)) + ": the backward pass does not support FP8");
  if (args.maybe_varlen && args.maybe_varlen->maybe_block_table.defined())
    unsupported("block_table", "a paged KV cache is forward only (no backward pass reads one, as in flash_attn)");
  const BackendLimits limits = limits_for(args.q.device);
  Geometry g = check_inputs(args.q, args.k, args.v, args.maybe_varlen, args.options, limits);
  std::vector<NamedExtent> all = g.input_extents;
  all.push_back({"out", check_like(args.out, "out", args.q, "q")});
  all.push_back({"dout", check_like(args.dout, "dout", args.q, "q")});
  all.push_back({"lse", check_lse(args.lse, "lse", g, args.q.device)});
  std::vector<NamedExtent> outputs{{"dq", check_like(args.dq, "dq", args.q, "q")},
                                   {"dk", check_like(args.dk, "dk", args.k, "k")},
                                   {"dv", check_like(args.dv, "dv", args.v, "v")}};
  if (args.maybe_workspace.defined()) {
    const Extent w = check_layout(args.maybe_workspace, "workspace", args.maybe_workspace.rank);
    check_device(args.maybe_workspace, "workspace", args.q.device);
    outputs.push_back({"workspace", w});
  }
  if (args.maybe_dbias.defined()) {
    if (!limits.supports_masks) unsupported("dbias", std::string("masks are not supported on the ") + limits.name + " backend yet");
    outputs.push_back({"dbias", check_dbias(args.maybe_dbias, args.options)});
  }
  all.insert(all.end(), outputs.begin(), outputs.end());
  check_no_overlap(outputs, all);

  BackwardParams p;
  static_cast<AttentionParams&>(p) = make_params(g, args.q, args.k, args.v, args.options);
  p.out = args.out.data;
  const Strides3 os = strides_of(args.out, g.is_varlen);
  p.out_batch_stride = os.batch, p.out_row_stride = os.row, p.out_head_stride = os.head;
  p.lse = static_cast<const float*>(args.lse.data);
  set_lse_strides(p, args.lse, g.is_varlen);
  p.dout = args.dout.data;
  p.dq = args.dq.data;
  p.dk = args.dk.data;
  p.dv = args.dv.data;
  const Strides3 dos = strides_of(args.dout, g.is_varlen), dqs = strides_of(args.dq, g.is_varlen),
                 dks = strides_of(args.dk, g.is_varlen), dvs = strides_of(args.dv, g.is_varlen);
  p.dout_batch_stride = dos.batch, p.dout_row_stride = dos.row, p.dout_head_stride = dos.head;
  p.dq_batch_stride = dqs.batch, p.dq_row_stride = dqs.row, p.dq_head_stride = dqs.head;
  p.dk_batch_stride = dks.batch, p.dk_row_stride = dks.row, p.dk_head_stride = dks.head;
  p.dv_batch_stride = dvs.batch, p.dv_row_stride = dvs.row, p.dv_head_stride = dvs.head;
  p.deterministic = args.options.deterministic;
  if (args.maybe_dbias.defined()) set_dbias_params(p, args.maybe_dbias);
  if (args.maybe_workspace.defined()) {
    p.maybe_workspace = args.maybe_workspace.data;
    p.workspace_bytes = static_cast<std::size_t>(args.maybe_workspace.numel()) * dtype_size(args.maybe_workspace.dtype);
  }
  return p;
}

MergeParams validate_merge(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                           const TensorView& lse_b, const TensorView& out, const TensorView& lse) {
  check_layout(out_a, "out_a", 4);
  const bool is_half = out_a.dtype == DType::float16 || out_a.dtype == DType::bfloat16;
  if (!(is_half || out_a.dtype == DType::float32))
    fail("out_a", "unsupported dtype: " + expected_got("float32, float16 or bfloat16", dtype_name(out_a.dtype)));
  const std::vector<std::int64_t> shape(out_a.shape.begin(), out_a.shape.begin() + 4);
  const std::vector<std::int64_t> lshape{shape[0], shape[2], shape[1]};
  const Extent eb = check_like(out_b, "out_b", out_a, "out_a");
  const Extent eo = check_like(out, "out", out_a, "out_a");
  const TensorView* lses[3] = {&lse_a, &lse_b, &lse};
  const char* lse_names[3] = {"lse_a", "lse_b", "lse"};
  Extent lse_extents[3];
  for (int i = 0; i < 3; ++i) {
    lse_extents[i] = check_layout(*lses[i], lse_names[i], 3);
    check_dtype(*lses[i], lse_names[i], DType::float32, "");
    if (lses[i]->device != out_a.device)
      fail(lse_names[i], "device mismatch: " + expected_got(to_string(out_a.device) + " (like out_a)", to_string(lses[i]->device)));
    check_shape(*lses[i], lse_names[i], lshape, " ([batch, heads, seqlen] of out_a)");
  }
  // In-place (out is out_a, lse is lse_a) is allowed: each element is read before it
  // is written by the same thread. Any other partial overlap is rejected.
  const Extent ea = check_layout(out_a, "out_a", 4);
  auto same = [](const Extent& x, const Extent& y) { return x.begin == y.begin && x.end == y.end; };
  std::vector<NamedExtent> inputs{{"out_a", ea}, {"out_b", eb}, {"lse_a", lse_extents[0]}, {"lse_b", lse_extents[1]}};
  std::vector<NamedExtent> outputs{{"out", eo}, {"lse", lse_extents[2]}};
  for (const auto& o : outputs)
    for (const auto& in : inputs) {
      if (o.extent.empty() || in.extent.empty()) continue;
      const bool in_place = (o.name == "out" && in.name == "out_a") || (o.name == "lse" && in.name == "lse_a") ||
                            (o.name == "out" && in.name == "out_b") || (o.name == "lse" && in.name == "lse_b");
      if (in_place && same(o.extent, in.extent) && (o.name == "out" ? (out.strides == (in.name == "out_a" ? out_a : out_b).strides)
                                                                   : (lse.strides == (in.name == "lse_a" ? lse_a : lse_b).strides)))
        continue;
      if (o.extent.overlaps(in.extent))
        fail(o.name, "output overlaps " + in.name + " in memory (only exact in-place aliasing is allowed)");
    }
  if (eo.overlaps(lse_extents[2]))
    fail("lse", "output overlaps out in memory");

  MergeParams p;
  p.dtype = out_a.dtype;
  p.batch = shape[0], p.seqlen = shape[1], p.heads = shape[2], p.head_dim = shape[3];
  p.out_a = out_a.data, p.out_b = out_b.data, p.out = out.data;
  p.lse_a = static_cast<const float*>(lse_a.data);
  p.lse_b = static_cast<const float*>(lse_b.data);
  p.lse = static_cast<float*>(lse.data);
  const TensorView* outs[3] = {&out_a, &out_b, &out};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      p.out_strides[i][j] = outs[i]->stride(j);
      p.lse_strides[i][j] = lses[i]->stride(j);
    }
  return p;
}

}  // namespace flashattn
