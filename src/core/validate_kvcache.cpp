// src/core/validate_kvcache.cpp — every check of forward_with_kvcache, before any
// write. The cache is an output when k_new/v_new are appended, so a bad argument
// must leave it (and out/LSE) bitwise unchanged.
#include "src/core/validate_kvcache.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "flashattn/error.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/core/checks.hpp"
#include "src/core/validate.hpp"

namespace flashattn {
namespace {

using namespace checks;

// A small int32 [batch] tensor on q's device (cache_seqlens, cache_batch_idx, cache_leftpad).
Extent check_index_vector(const TensorView& t, const std::string& name, std::int64_t batch, Device device) {
  const Extent e = check_layout(t, name, 1);
  check_dtype(t, name, DType::int32, "");
  check_device(t, name, device);
  check_shape(t, name, {batch}, " ([batch], like q)");
  return e;
}
// Host-visible entry b of an int32 vector; only called for CPU tensors.
std::int64_t host_entry(const TensorView& t, std::int64_t b) {
  return static_cast<const std::int32_t*>(t.data)[b * t.stride(0)];
}

void check_options(const AttentionOptions& options) {
  check_common_options(options);
  if (!(options.dropout_p == 0.0)) unsupported("dropout_p", "forward_with_kvcache has no dropout (only 0 is accepted)");
  if (options.algorithm != Algorithm::automatic)
    unsupported("algorithm", std::string("forward_with_kvcache has one algorithm (automatic), got ") + algorithm_name(options.algorithm));
  // No decode kernel (CPU or CUDA) reads them: refused rather than silently ignored.
  if (options.maybe_attn_mask.defined()) unsupported("attn_mask", "forward_with_kvcache takes no attn_mask");
  if (options.maybe_block_mask.has_value()) unsupported("block_mask", "forward_with_kvcache takes no block mask");
}

// An FP8 cache's descale (k_descale / v_descale): float32 [batch, heads_kv] with any
// strides (0 included), or size 1 on a dimension to broadcast it (per tensor, per head,
// per sequence). Its strides as the kernels index it: element (b, h) at b * s[0] + h * s[1].
void check_descale(const TensorView& t, const std::string& name, std::int64_t batch, std::int64_t heads_kv, Device device,
                   std::vector<NamedExtent>& inputs, std::int64_t (&strides)[2]) {
  inputs.push_back({name, check_layout(t, name, 2)});
  check_dtype(t, name, DType::float32, "");
  check_device(t, name, device);
  const bool batch_ok = t.size(0) == batch || t.size(0) == 1, heads_ok = t.size(1) == heads_kv || t.size(1) == 1;
  if (!batch_ok || !heads_ok)
    fail(name, "shape mismatch: " + expected_got("[" + std::to_string(batch) + ", " + std::to_string(heads_kv) +
                                                     "] ([batch, heads_kv]; size 1 broadcasts)",
                                                 shape_string(t)));
  strides[0] = t.size(0) == 1 ? 0 : t.stride(0);
  strides[1] = t.size(1) == 1 ? 0 : t.stride(1);
}

KVCacheLimits kvcache_limits_for(Device device) {
  if (device.type == DeviceType::cpu) return cpu::kvcache_limits();
  if (!cuda_available())
    unsupported("q", "tensor is on " + to_string(device) + " but this build has no usable CUDA backend (built with FLASHATTN_CUDA=OFF or no GPU present)");
  return cuda::kvcache_limits();
}

bool has_rotary_args(const KVCacheArgs& args) { return args.maybe_rotary_cos.defined() || args.maybe_rotary_sin.defined(); }

}  // namespace

KVCacheParams validate_kvcache(const KVCacheArgs& args) {
  if (!args.q.defined()) fail("q", "missing tensor (rank 0)");
  const Device device = args.q.device;
  const KVCacheLimits limits = kvcache_limits_for(device);
  std::vector<NamedExtent> inputs, outputs;

  // q and the caches.
  inputs.push_back({"q", check_layout(args.q, "q", 4)});
  const bool is_half = args.q.dtype == DType::float16 || args.q.dtype == DType::bfloat16;
  if (!is_half && !(args.q.dtype == DType::float32 && limits.supports_float32))
    fail("q", "unsupported dtype: " + expected_got(std::string(limits.supports_float32 ? "float32, " : "") + "float16 or bfloat16 on the " +
                                                       limits.name + " backend",
                                                   dtype_name(args.q.dtype)));
  const std::int64_t batch = args.q.size(0), seqlen_q = args.q.size(1), heads_q = args.q.size(2), head_dim = args.q.size(3);
  const Extent k_cache_extent = check_layout(args.k_cache, "k_cache", 4);
  const Extent v_cache_extent = check_layout(args.v_cache, "v_cache", 4);
  // An FP8 cache (float8_e4m3, both or neither) holds k / k_descale; q stays 16-bit.
  const bool is_fp8_cache = args.k_cache.dtype == DType::float8_e4m3;
  const DType cache_dtype = is_fp8_cache ? DType::float8_e4m3 : args.q.dtype;
  if (is_fp8_cache && !is_half)
    fail("q", "an FP8 (float8_e4m3fn) cache needs q in float16 or bfloat16, got " + std::string(dtype_name(args.q.dtype)));
  check_dtype(args.k_cache, "k_cache", cache_dtype, is_fp8_cache ? " (FP8 cache)" : " (like q, or float8_e4m3fn)");
  check_dtype(args.v_cache, "v_cache", cache_dtype, is_fp8_cache ? " (like k_cache)" : " (like q and k_cache)");
  check_device(args.k_cache, "k_cache", device);
  check_device(args.v_cache, "v_cache", device);
  const std::int64_t heads_kv = args.k_cache.size(2);
  if (args.k_cache.size(3) != head_dim) fail("k_cache", "head_dim mismatch: " + expected_got(std::to_string(head_dim) + " (like q)", args.k_cache.size(3)));
  check_shape(args.v_cache, "v_cache", {args.k_cache.size(0), args.k_cache.size(1), heads_kv, head_dim}, " (like k_cache)");
  if (heads_q <= 0) fail("q", "heads_q must be >= 1, got " + std::to_string(heads_q));
  if (heads_kv <= 0) fail("k_cache", "heads_kv must be >= 1, got " + std::to_string(heads_kv));
  if (heads_q % heads_kv != 0)
    fail("k_cache", "heads_q must be a multiple of heads_kv (GQA/MQA): heads_q = " + std::to_string(heads_q) +
                        ", heads_kv = " + std::to_string(heads_kv));
  check_options(args.options);
  if (head_dim <= 0) fail("q", "head_dim must be >= 1, got " + std::to_string(head_dim));
  if (head_dim > limits.max_head_dim || head_dim % limits.head_dim_multiple != 0)
    unsupported("q", "head_dim " + std::to_string(head_dim) + " is not supported by the " + limits.name +
                         " KV-cache path (a multiple of " + std::to_string(limits.head_dim_multiple) + " up to " +
                         std::to_string(limits.max_head_dim) + ")");

  // Paged or contiguous cache.
  const bool is_paged = args.maybe_block_table.defined();
  std::int64_t capacity = 0, page_size = 0, max_blocks = 0;
  const std::int64_t cache_rows = args.k_cache.size(0);
  if (is_paged) {
    if (args.maybe_cache_batch_idx.defined())
      fail("cache_batch_idx", "not supported with a paged cache (block_table already maps each sequence to its pages)");
    inputs.push_back({"block_table", check_layout(args.maybe_block_table, "block_table", 2)});
    check_dtype(args.maybe_block_table, "block_table", DType::int32, "");
    check_device(args.maybe_block_table, "block_table", device);
    if (args.maybe_block_table.size(0) != batch)
      fail("block_table", "shape mismatch: " + expected_got("[" + std::to_string(batch) + ", max_blocks_per_seq] (batch like q)", shape_string(args.maybe_block_table)));
    page_size = args.k_cache.size(1);
    if (page_size < 16 || page_size > 256 || page_size % 16 != 0)
      fail("k_cache", "page_size (dimension 1 of a paged cache) must be a multiple of 16 in [16, 256], got " + std::to_string(page_size));
    max_blocks = args.maybe_block_table.size(1);
    capacity = checked_mul(max_blocks, page_size, "block_table");
  } else {
    capacity = args.k_cache.size(1);
    if (args.maybe_cache_batch_idx.defined()) {
      inputs.push_back({"cache_batch_idx", check_index_vector(args.maybe_cache_batch_idx, "cache_batch_idx", batch, device)});
      if (device.type == DeviceType::cpu)
        for (std::int64_t b = 0; b < batch; ++b) {
          const std::int64_t index = host_entry(args.maybe_cache_batch_idx, b);
          if (index < 0 || index >= cache_rows)
            fail("cache_batch_idx", "entry " + std::to_string(b) + " " + expected_got("in [0, " + std::to_string(cache_rows) + ") (rows of k_cache)", index));
        }
    } else if (cache_rows < batch) {
      fail("k_cache", "batch_cache " + expected_got(">= " + std::to_string(batch) + " (batch of q, no cache_batch_idx)", cache_rows));
    }
  }

  // Cache positions are int32 in flash_attn's API (cache_seqlens); kernels index them so.
  if (capacity > 0x7fffffff)
    unsupported(is_paged ? "block_table" : "k_cache", "a cache of " + std::to_string(capacity) + " positions per sequence exceeds 2^31 - 1");

  // New keys/values.
  const bool has_append = args.maybe_k_new.defined() || args.maybe_v_new.defined();
  std::int64_t seqlen_new = 0;
  if (has_append) {
    if (!args.maybe_k_new.defined()) fail("k", "missing: k and v (new keys/values) are given together or not at all");
    if (!args.maybe_v_new.defined()) fail("v", "missing: k and v (new keys/values) are given together or not at all");
    inputs.push_back({"k", check_layout(args.maybe_k_new, "k", 4)});
    inputs.push_back({"v", check_layout(args.maybe_v_new, "v", 4)});
    // FP8 cache: new keys/values in q's dtype (quantised on append) or already e4m3 (copied).
    if (is_fp8_cache && args.maybe_k_new.dtype == DType::float8_e4m3) {
      check_dtype(args.maybe_v_new, "v", DType::float8_e4m3, " (like k)");
      if (has_rotary_args(args)) fail("rotary_cos", "rotary embedding rotates new keys in q's dtype, not float8_e4m3fn ones (quantise after rotating)");
    } else {
      check_dtype(args.maybe_k_new, "k", args.q.dtype, is_fp8_cache ? " (like q, or float8_e4m3fn like k_cache)" : " (like q)");
      check_dtype(args.maybe_v_new, "v", args.q.dtype, " (like q and k)");
    }
    check_device(args.maybe_k_new, "k", device);
    check_device(args.maybe_v_new, "v", device);
    seqlen_new = args.maybe_k_new.size(1);
    check_shape(args.maybe_k_new, "k", {batch, seqlen_new, heads_kv, head_dim}, " ([batch, seqlen_new, heads_kv, head_dim])");
    check_shape(args.maybe_v_new, "v", {batch, seqlen_new, heads_kv, head_dim}, " (like k)");
    if (!args.maybe_cache_seqlens.defined() && !args.maybe_uniform_cache_seqlen)
      fail("cache_seqlens", "required when appending k/v: it says where the new keys go");
  }

  // Sequence lengths (host-visible ones are range-checked against the capacity).
  if (args.maybe_cache_seqlens.defined() && args.maybe_uniform_cache_seqlen)
    fail("cache_seqlens", "give either a tensor or one uniform length, not both");
  std::vector<std::int64_t> host_lengths;  // cache_seqlens + seqlen_new, when known on the host
  const std::string capacity_text = std::to_string(capacity) + (is_paged ? " (max_blocks_per_seq * page_size)" : " (seqlen_cache)");
  auto check_length = [&](std::int64_t b, std::int64_t length) {
    if (length < 0) fail("cache_seqlens", "entry " + std::to_string(b) + " must be >= 0, got " + std::to_string(length));
    // Paged: the table's width is what runs out, so the message names block_table.
    if (length + seqlen_new > capacity)
      fail(is_paged ? "block_table" : "cache_seqlens", "entry " + std::to_string(b) + ": " + std::to_string(length) + " cached + " + std::to_string(seqlen_new) +
                                " new keys exceed the cache capacity " + capacity_text);
  };
  if (args.maybe_cache_seqlens.defined()) {
    inputs.push_back({"cache_seqlens", check_index_vector(args.maybe_cache_seqlens, "cache_seqlens", batch, device)});
    if (device.type == DeviceType::cpu)
      for (std::int64_t b = 0; b < batch; ++b) {
        check_length(b, host_entry(args.maybe_cache_seqlens, b));
        host_lengths.push_back(host_entry(args.maybe_cache_seqlens, b) + seqlen_new);
      }
  } else if (args.maybe_uniform_cache_seqlen) {
    check_length(0, *args.maybe_uniform_cache_seqlen);
    host_lengths.assign(static_cast<std::size_t>(batch), *args.maybe_uniform_cache_seqlen + seqlen_new);
  } else {
    host_lengths.assign(static_cast<std::size_t>(batch), capacity);
  }
  const bool lengths_known = static_cast<std::int64_t>(host_lengths.size()) == batch;

  std::vector<std::int64_t> host_leftpad(static_cast<std::size_t>(batch), 0);
  if (args.maybe_cache_leftpad.defined()) {
    inputs.push_back({"cache_leftpad", check_index_vector(args.maybe_cache_leftpad, "cache_leftpad", batch, device)});
    if (device.type == DeviceType::cpu)
      for (std::int64_t b = 0; b < batch; ++b) {
        const std::int64_t pad = host_entry(args.maybe_cache_leftpad, b);
        const std::int64_t end = lengths_known ? host_lengths[static_cast<std::size_t>(b)] : capacity;
        if (pad < 0 || pad > end)
          fail("cache_leftpad", "entry " + std::to_string(b) + " " + expected_got("in [0, " + std::to_string(end) + "] (the sequence's end)", pad));
        host_leftpad[static_cast<std::size_t>(b)] = pad;
      }
  }

  // Block ids: only the pages a sequence touches must be valid (unused table slots may hold anything).
  if (is_paged && device.type == DeviceType::cpu) {
    const auto* table = static_cast<const std::int32_t*>(args.maybe_block_table.data);
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t end = lengths_known ? host_lengths[static_cast<std::size_t>(b)] : capacity;
      for (std::int64_t page = host_leftpad[static_cast<std::size_t>(b)] / page_size; page < ceil_div(end, page_size); ++page) {
        const std::int64_t block = table[b * args.maybe_block_table.stride(0) + page];
        if (block < 0 || block >= cache_rows)
          fail("block_table", "entry [" + std::to_string(b) + ", " + std::to_string(page) + "] " +
                                  expected_got("a block id in [0, " + std::to_string(cache_rows) + ") (num_blocks of k_cache)", block));
      }
    }
  }

  // Rotary embedding.
  const bool has_rotary = args.maybe_rotary_cos.defined() || args.maybe_rotary_sin.defined();
  std::int64_t rotary_dim = 0;
  if (has_rotary) {
    if (!args.maybe_rotary_cos.defined()) fail("rotary_cos", "missing: rotary_cos and rotary_sin are given together or not at all");
    if (!args.maybe_rotary_sin.defined()) fail("rotary_sin", "missing: rotary_cos and rotary_sin are given together or not at all");
    if (!has_append) fail("rotary_cos", "rotary embedding needs the new keys k/v to rotate (flash_attn semantics)");
    inputs.push_back({"rotary_cos", check_layout(args.maybe_rotary_cos, "rotary_cos", 2)});
    inputs.push_back({"rotary_sin", check_layout(args.maybe_rotary_sin, "rotary_sin", 2)});
    check_dtype(args.maybe_rotary_cos, "rotary_cos", args.q.dtype, " (like q)");
    check_dtype(args.maybe_rotary_sin, "rotary_sin", args.q.dtype, " (like q)");
    check_device(args.maybe_rotary_cos, "rotary_cos", device);
    check_device(args.maybe_rotary_sin, "rotary_sin", device);
    rotary_dim = 2 * args.maybe_rotary_cos.size(1);
    if (rotary_dim < 2 || rotary_dim > head_dim)
      fail("rotary_cos", "rotary_dim (2 * dimension 1) " + expected_got("in [2, " + std::to_string(head_dim) + "] (head_dim)", rotary_dim));
    check_shape(args.maybe_rotary_sin, "rotary_sin", {args.maybe_rotary_cos.size(0), args.maybe_rotary_cos.size(1)}, " (like rotary_cos)");
    // Positions reach cache_seqlens + max(seqlen_new, query rows at distinct positions) - 1.
    const bool per_row = args.options.causal || args.options.window_left >= 0 || args.options.window_right >= 0;
    const std::int64_t needed = capacity + std::max<std::int64_t>(0, (per_row ? seqlen_q : 1) - seqlen_new);
    if (args.maybe_rotary_cos.size(0) < needed)
      fail("rotary_cos", "seqlen_ro (dimension 0) " + expected_got(">= " + std::to_string(needed) + " (the cache capacity, covering every rotated position)",
                                                                    args.maybe_rotary_cos.size(0)));
  }

  // Outputs.
  outputs.push_back({"out", check_layout(args.out, "out", 4)});
  check_dtype(args.out, "out", args.q.dtype, " (like q)");
  check_device(args.out, "out", device);
  check_shape(args.out, "out", {batch, seqlen_q, heads_q, head_dim}, " (like q)");
  if (args.maybe_lse.defined()) {
    outputs.push_back({"lse", check_layout(args.maybe_lse, "lse", 3)});
    check_dtype(args.maybe_lse, "lse", DType::float32, "");
    check_device(args.maybe_lse, "lse", device);
    check_shape(args.maybe_lse, "lse", {batch, heads_q, seqlen_q}, " ([batch, heads_q, seqlen_q])");
  }
  if (args.maybe_workspace.defined()) {
    outputs.push_back({"workspace", check_layout(args.maybe_workspace, "workspace", args.maybe_workspace.rank)});
    check_device(args.maybe_workspace, "workspace", device);
  }
  check_variant_tensors(args.options, batch, heads_q, device, inputs);
  std::int64_t k_descale_strides[2] = {0, 0}, v_descale_strides[2] = {0, 0};
  if (args.options.maybe_q_descale.defined())
    fail("q_descale", "not used by forward_with_kvcache: q stays float16/bfloat16 (only an FP8 cache takes k_descale/v_descale)");
  if (!is_fp8_cache) {
    if (args.options.maybe_k_descale.defined()) fail("k_descale", "only an FP8 (float8_e4m3fn) cache takes a descale; k_cache is " + std::string(dtype_name(args.k_cache.dtype)));
    if (args.options.maybe_v_descale.defined()) fail("v_descale", "only an FP8 (float8_e4m3fn) cache takes a descale; v_cache is " + std::string(dtype_name(args.v_cache.dtype)));
  } else {
    if (args.options.maybe_k_descale.defined())
      check_descale(args.options.maybe_k_descale, "k_descale", batch, heads_kv, device, inputs, k_descale_strides);
    if (args.options.maybe_v_descale.defined())
      check_descale(args.options.maybe_v_descale, "v_descale", batch, heads_kv, device, inputs, v_descale_strides);
  }
  if (args.num_splits < 0 || args.num_splits > kMaxKVCacheSplits)
    fail("num_splits", expected_got("0 (heuristic) or 1.." + std::to_string(kMaxKVCacheSplits), args.num_splits));

  // No output may share bytes with another tensor. The two caches are written when
  // appending but may interleave (e.g. views of one [.., 2, ..] buffer), so they are
  // checked against everything else, not against each other.
  std::vector<NamedExtent> cache_extents{{"k_cache", k_cache_extent}, {"v_cache", v_cache_extent}};
  std::vector<NamedExtent> checked = outputs;
  if (has_append) checked.insert(checked.end(), cache_extents.begin(), cache_extents.end());
  std::vector<NamedExtent> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  all.insert(all.end(), cache_extents.begin(), cache_extents.end());
  for (const auto& o : checked) {
    if (o.extent.empty()) continue;
    for (const auto& other : all) {
      if (other.name == o.name || other.extent.empty()) continue;
      const bool both_caches = (o.name == "k_cache" || o.name == "v_cache") && (other.name == "k_cache" || other.name == "v_cache");
      if (both_caches) continue;
      if (o.extent.overlaps(other.extent)) fail(o.name, "output overlaps " + other.name + " in memory");
    }
  }

  // The parameter struct.
  KVCacheParams p;
  AttentionParams& a = p.attention;
  a.dtype = args.q.dtype;
  a.input_dtype = args.q.dtype;
  p.cache_dtype = cache_dtype;
  if (is_fp8_cache) {
    if (args.options.maybe_k_descale.defined()) {
      a.maybe_k_descale = static_cast<const float*>(args.options.maybe_k_descale.data);
      a.k_descale_strides[0] = k_descale_strides[0], a.k_descale_strides[1] = k_descale_strides[1];
    }
    if (args.options.maybe_v_descale.defined()) {
      a.maybe_v_descale = static_cast<const float*>(args.options.maybe_v_descale.data);
      a.v_descale_strides[0] = v_descale_strides[0], a.v_descale_strides[1] = v_descale_strides[1];
    }
  }
  a.device = device;
  a.q = args.q.data;
  a.k = args.k_cache.data;
  a.v = args.v_cache.data;
  a.out = args.out.data;
  a.batch = batch, a.seqlen_q = seqlen_q, a.seqlen_k = capacity;
  a.heads_q = heads_q, a.heads_kv = heads_kv, a.head_dim = head_dim, a.group_size = heads_q / heads_kv;
  a.q_batch_stride = args.q.stride(0), a.q_row_stride = args.q.stride(1), a.q_head_stride = args.q.stride(2);
  a.k_batch_stride = args.k_cache.stride(0), a.k_row_stride = args.k_cache.stride(1), a.k_head_stride = args.k_cache.stride(2);
  a.v_batch_stride = args.v_cache.stride(0), a.v_row_stride = args.v_cache.stride(1), a.v_head_stride = args.v_cache.stride(2);
  a.out_batch_stride = args.out.stride(0), a.out_row_stride = args.out.stride(1), a.out_head_stride = args.out.stride(2);
  if (args.maybe_lse.defined()) {
    a.maybe_lse = static_cast<float*>(args.maybe_lse.data);
    a.lse_batch_stride = args.maybe_lse.stride(0), a.lse_head_stride = args.maybe_lse.stride(1), a.lse_row_stride = args.maybe_lse.stride(2);
  }
  a.total_q = checked_mul(batch, seqlen_q, "q");
  a.total_k = checked_mul(batch, capacity, "k_cache");
  const double scale = args.options.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim)));
  a.softmax_scale = static_cast<float>(scale);
  a.softmax_scale_log2 = static_cast<float>(scale * online_softmax::kLog2e);
  a.softcap = static_cast<float>(args.options.softcap);
  a.is_causal = args.options.causal;
  // A window at least as wide as the whole problem is unbounded (keeps index arithmetic far from overflow).
  const std::int64_t span = seqlen_q + capacity + seqlen_new;
  a.window_left = args.options.window_left >= span ? -1 : args.options.window_left;
  a.window_right = args.options.causal ? 0 : (args.options.window_right >= span ? -1 : args.options.window_right);
  set_variant_params(a, args.options);  // ALiBi (dropout was refused above)

  p.k_cache = args.k_cache.data;
  p.v_cache = args.v_cache.data;
  p.capacity = capacity;
  p.cache_batch = cache_rows;
  if (args.maybe_cache_seqlens.defined()) {
    if (args.maybe_cache_seqlens.stride(0) != 1 && batch > 1) fail("cache_seqlens", "must be contiguous: stride " + expected_got(1, args.maybe_cache_seqlens.stride(0)));
    p.maybe_cache_seqlens = static_cast<const std::int32_t*>(args.maybe_cache_seqlens.data);
  } else {
    p.uniform_cache_seqlen = args.maybe_uniform_cache_seqlen.value_or(capacity);
  }
  if (args.maybe_cache_batch_idx.defined()) {
    if (args.maybe_cache_batch_idx.stride(0) != 1 && batch > 1) fail("cache_batch_idx", "must be contiguous: stride " + expected_got(1, args.maybe_cache_batch_idx.stride(0)));
    p.maybe_cache_batch_idx = static_cast<const std::int32_t*>(args.maybe_cache_batch_idx.data);
  }
  if (args.maybe_cache_leftpad.defined()) {
    if (args.maybe_cache_leftpad.stride(0) != 1 && batch > 1) fail("cache_leftpad", "must be contiguous: stride " + expected_got(1, args.maybe_cache_leftpad.stride(0)));
    p.maybe_cache_leftpad = static_cast<const std::int32_t*>(args.maybe_cache_leftpad.data);
  }
  if (is_paged) {
    p.maybe_block_table = static_cast<const std::int32_t*>(args.maybe_block_table.data);
    p.block_table_stride = args.maybe_block_table.stride(0);
    p.page_size = page_size;
    p.num_blocks = cache_rows;
  }
  if (has_append) {
    p.maybe_k_new = args.maybe_k_new.data;
    p.maybe_v_new = args.maybe_v_new.data;
    p.seqlen_new = seqlen_new;
    p.new_dtype = args.maybe_k_new.dtype;
    p.k_new_batch_stride = args.maybe_k_new.stride(0), p.k_new_row_stride = args.maybe_k_new.stride(1), p.k_new_head_stride = args.maybe_k_new.stride(2);
    p.v_new_batch_stride = args.maybe_v_new.stride(0), p.v_new_row_stride = args.maybe_v_new.stride(1), p.v_new_head_stride = args.maybe_v_new.stride(2);
  }
  if (has_rotary) {
    p.maybe_rotary_cos = args.maybe_rotary_cos.data;
    p.maybe_rotary_sin = args.maybe_rotary_sin.data;
    p.rotary_dim = rotary_dim;
    p.rotary_cos_row_stride = args.maybe_rotary_cos.stride(0);
    p.rotary_sin_row_stride = args.maybe_rotary_sin.stride(0);
    p.is_rotary_interleaved = args.rotary_interleaved;
  }
  if (args.maybe_workspace.defined()) {
    p.maybe_workspace = args.maybe_workspace.data;
    p.workspace_bytes = static_cast<std::size_t>(args.maybe_workspace.numel()) * dtype_size(args.maybe_workspace.dtype);
  }
  // The split count: explicit, or the heuristic on the backend's geometry (the CPU
  // parallelises over (batch, kv head) and gains nothing from splitting).
  if (args.num_splits > 0) {
    p.num_splits = args.num_splits;
  } else if (device.type == DeviceType::cpu) {
    p.num_splits = 1;
  } else {
    p.num_splits = choose_num_splits(cuda::kvcache_split_problem(p));
  }
  return p;
}

}  // namespace flashattn
