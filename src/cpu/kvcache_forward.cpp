// src/cpu/kvcache_forward.cpp — forward_with_kvcache on the CPU: the correctness
// oracle of the CUDA decode kernels and a usable CPU inference path.
//
//   1. append: k_new/v_new rows go to cache positions cache_seqlen(b) + j (k rotated);
//   2. attend: one work item per (sequence, kv head) with the GQA group's query rows
//      packed together, so each gathered K/V tile serves every query head that reads
//      it; key tiles are gathered through the block table (or cache_batch_idx) into
//      per-thread float tiles, then the online-softmax flash loop of seeds 000/003;
//   FP8 cache (cache_dtype float8_e4m3): a cached key is k_descale(b, h) * decode(byte),
//   a value likewise with v_descale — exact in float; appended rows in q's dtype are
//   quantised with float8::quantize_e4m3 after the rotary (so the cache holds what a
//   16-bit cache would, quantised), e4m3 rows are copied;
//   3. splits: each of num_splits key chunks yields a normalised partial (O, LSE),
//      merged with online_softmax::merge_weights — the rule of the CUDA combine.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "flashattn/online_softmax.hpp"
#include "src/core/float8.hpp"
#include "src/core/kvcache_backend.hpp"
#include "src/core/numeric.hpp"
#include "src/cpu/flash.hpp"

namespace flashattn::cpu {
namespace {

constexpr std::int64_t kBlockN = 64;  // keys per gathered tile (performance-only)

// Rotates the first rotary_dim features of x (float) at `position`, in place.
void apply_rotary(const KVCacheParams& p, std::int64_t position, float* x) {
  const DType dtype = p.attention.dtype;
  const std::int64_t half = p.rotary_dim / 2;
  for (std::int64_t t = 0; t < half; ++t) {
    const float c = numeric::load_as_float(p.maybe_rotary_cos, dtype, position * p.rotary_cos_row_stride + t);
    const float s = numeric::load_as_float(p.maybe_rotary_sin, dtype, position * p.rotary_sin_row_stride + t);
    const std::int64_t i1 = p.is_rotary_interleaved ? 2 * t : t;
    const std::int64_t i2 = p.is_rotary_interleaved ? 2 * t + 1 : t + half;
    const float x1 = x[i1], x2 = x[i2];
    x[i1] = x1 * c - x2 * s;
    x[i2] = x1 * s + x2 * c;
  }
}

// Row (b, position, h) of an FP8 cache from a new row in q's dtype (`row`: its values,
// rotated and rounded to q's dtype where rotary applies).
void quantize_row(const float* row, std::int64_t head_dim, float descale, std::uint8_t* dst) {
  for (std::int64_t d = 0; d < head_dim; ++d) dst[d] = float8::quantize_e4m3(row[d], descale);
}

void append_new_keys(const KVCacheParams& p) {
  const AttentionParams& a = p.attention;
  const std::size_t element = dtype_size(p.cache_dtype);
  const bool is_quantized = p.is_fp8_cache() && p.new_dtype != DType::float8_e4m3;
  std::vector<float> row(static_cast<std::size_t>(a.head_dim));
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t j = 0; j < p.seqlen_new; ++j) {
      const std::int64_t position = p.cache_seqlen(b) + j;
      for (std::int64_t h = 0; h < a.heads_kv; ++h) {
        const std::int64_t k_src = b * p.k_new_batch_stride + j * p.k_new_row_stride + h * p.k_new_head_stride;
        const std::int64_t v_src = b * p.v_new_batch_stride + j * p.v_new_row_stride + h * p.v_new_head_stride;
        const std::int64_t k_dst = p.k_cache_offset(b, position, h);
        const std::int64_t v_dst = p.v_cache_offset(b, position, h);
        if (is_quantized) {
          for (std::int64_t d = 0; d < a.head_dim; ++d) row[static_cast<std::size_t>(d)] = numeric::load_as_float(p.maybe_k_new, a.dtype, k_src + d);
          if (p.has_rotary()) {
            apply_rotary(p, position, row.data());
            for (std::int64_t d = 0; d < a.head_dim; ++d) row[static_cast<std::size_t>(d)] = numeric::round_to(a.dtype, row[static_cast<std::size_t>(d)]);
          }
          quantize_row(row.data(), a.head_dim, p.k_descale(b, h), static_cast<std::uint8_t*>(p.k_cache) + k_dst);
          for (std::int64_t d = 0; d < a.head_dim; ++d) row[static_cast<std::size_t>(d)] = numeric::load_as_float(p.maybe_v_new, a.dtype, v_src + d);
          quantize_row(row.data(), a.head_dim, p.v_descale(b, h), static_cast<std::uint8_t*>(p.v_cache) + v_dst);
          continue;
        }
        if (p.has_rotary()) {  // 16-bit cache (e4m3 new rows take no rotary: validate_kvcache)
          for (std::int64_t d = 0; d < a.head_dim; ++d) row[static_cast<std::size_t>(d)] = numeric::load_as_float(p.maybe_k_new, a.dtype, k_src + d);
          apply_rotary(p, position, row.data());
          for (std::int64_t d = 0; d < a.head_dim; ++d) numeric::store_from_float(p.k_cache, a.dtype, k_dst + d, row[static_cast<std::size_t>(d)]);
        } else {
          std::memcpy(static_cast<char*>(p.k_cache) + k_dst * element, static_cast<const char*>(p.maybe_k_new) + k_src * element,
                      static_cast<std::size_t>(a.head_dim) * element);
        }
        std::memcpy(static_cast<char*>(p.v_cache) + v_dst * element, static_cast<const char*>(p.maybe_v_new) + v_src * element,
                    static_cast<std::size_t>(a.head_dim) * element);
      }
    }
}

// Feature d of cache element `index`, in float: a 16-bit value, or an FP8 one times its descale.
float load_cache(const void* cache, DType cache_dtype, DType dtype, std::int64_t index, float descale) {
  if (cache_dtype == DType::float8_e4m3) return descale * float8::decode_e4m3(static_cast<const std::uint8_t*>(cache)[index]);
  return numeric::load_as_float(cache, dtype, index);
}

// One work item: sequence b, kv head h_kv, its group's query rows packed as
// row r = i * group_size + g (query head h_kv * group_size + g, query position i).
// Acc accumulates P V: float first; the unnormalised sums reach seqlen_k * max|v| and
// can overflow where the answer is finite, so an item whose float result is not finite
// is redone with double (returns false without writing, when must_be_finite).
template <class Acc>
bool attend_work_item(const KVCacheParams& p, std::int64_t b, std::int64_t h_kv, bool must_be_finite) {
  const AttentionParams& a = p.attention;
  const std::int64_t d_count = a.head_dim, group = a.group_size, rows = a.seqlen_q * group;
  const auto d_size = static_cast<std::size_t>(d_count);
  const MaskRule mask = p.mask_of(b);
  const std::int64_t seqlen_k = mask.seqlen_k;
  const std::int64_t first_position = p.leftpad(b);  // key column j is cache position first_position + j
  std::vector<ScoreRule> score_rules(static_cast<std::size_t>(group));  // of query head h_kv * group + g
  for (std::int64_t g = 0; g < group; ++g) score_rules[static_cast<std::size_t>(g)] = a.score_of(b, h_kv * group + g, mask);

  std::vector<float> q(static_cast<std::size_t>(rows) * d_size);  // (rows, head_dim), rotated and rounded like the input
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = r / group, h = h_kv * group + r % group;
    float* qr = &q[static_cast<std::size_t>(r) * d_size];
    const std::int64_t base = a.q_offset(b, h) + i * a.q_row_stride;
    for (std::int64_t d = 0; d < d_count; ++d) qr[d] = numeric::load_as_float(a.q, a.dtype, base + d);
    if (p.has_rotary()) {
      apply_rotary(p, p.q_rotary_position(b, i), qr);
      for (std::int64_t d = 0; d < d_count; ++d) qr[d] = numeric::round_to(a.dtype, qr[d]);
    }
  }

  const float k_descale = p.k_descale(b, h_kv), v_descale = p.v_descale(b, h_kv);  // FP8 cache only
  std::vector<float> k_tile(static_cast<std::size_t>(kBlockN) * d_size), v_tile(k_tile.size());  // (kBlockN, head_dim)
  std::vector<Acc> acc(static_cast<std::size_t>(rows) * d_size);                               // (rows, head_dim), unnormalised
  std::vector<Acc> merged(acc.size(), Acc(0));                                                 // (rows, head_dim), normalised
  std::vector<float> merged_lse(static_cast<std::size_t>(rows), online_softmax::negative_infinity<float>());
  std::vector<online_softmax::State<float>> state(static_cast<std::size_t>(rows));
  std::vector<float> scores(static_cast<std::size_t>(kBlockN));

  const std::int64_t key_blocks = ceil_div(seqlen_k, kBlockN);
  const std::int64_t blocks_per_split = ceil_div(key_blocks, p.num_splits);
  for (int split = 0; split < p.num_splits; ++split) {
    const std::int64_t split_begin = std::min(seqlen_k, split * blocks_per_split * kBlockN);
    const std::int64_t split_end = std::min(seqlen_k, (split + 1) * blocks_per_split * kBlockN);
    std::fill(acc.begin(), acc.end(), Acc(0));
    std::fill(state.begin(), state.end(), online_softmax::State<float>{});
    // Columns any packed row may see (rows of one position i share a mask).
    const MaskRule::ColumnRange seen = mask.columns_of_rows(0, a.seqlen_q);
    const std::int64_t begin = std::max(split_begin, seen.begin), end = std::min(split_end, seen.end);
    for (std::int64_t tile = begin; tile < end; tile += kBlockN) {
      const std::int64_t n = std::min(kBlockN, end - tile);
      for (std::int64_t c = 0; c < n; ++c) {  // gather through the page table / batch index
        const std::int64_t position = first_position + tile + c;
        const std::int64_t k_base = p.k_cache_offset(b, position, h_kv), v_base = p.v_cache_offset(b, position, h_kv);
        for (std::int64_t d = 0; d < d_count; ++d) {
          k_tile[static_cast<std::size_t>(c) * d_size + static_cast<std::size_t>(d)] = load_cache(a.k, p.cache_dtype, a.dtype, k_base + d, k_descale);
          v_tile[static_cast<std::size_t>(c) * d_size + static_cast<std::size_t>(d)] = load_cache(a.v, p.cache_dtype, a.dtype, v_base + d, v_descale);
        }
      }
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t i = r / group;
        const float* qr = &q[static_cast<std::size_t>(r) * d_size];
        // S = q K^T (log2 units), masked columns -inf.
        float block_max = online_softmax::negative_infinity<float>();
        for (std::int64_t c = 0; c < n; ++c) {
          float s = online_softmax::negative_infinity<float>();
          if (mask.allowed(i, tile + c)) {
            const float* kc = &k_tile[static_cast<std::size_t>(c) * d_size];
            float dot = 0.0f;
            for (std::int64_t d = 0; d < d_count; ++d) dot += qr[d] * kc[d];
            s = score_rules[static_cast<std::size_t>(r % group)].log2_score(dot, i, tile + c);
          }
          scores[static_cast<std::size_t>(c)] = s;
          block_max = std::max(block_max, s);
        }
        // Online softmax: rescale the accumulator to the new max, add P V.
        auto& st = state[static_cast<std::size_t>(r)];
        const float factor = st.raise_max(block_max);
        Acc* o = &acc[static_cast<std::size_t>(r) * d_size];
        for (std::int64_t d = 0; d < d_count; ++d) o[d] *= factor;
        const float base = st.base();
        float sum = 0.0f;
        for (std::int64_t c = 0; c < n; ++c) {
          const float prob = online_softmax::exp2_of(scores[static_cast<std::size_t>(c)] - base);
          if (prob == 0.0f) continue;  // masked (a hidden key's NaN value never meets 0 * NaN)
          sum += prob;
          const float* vc = &v_tile[static_cast<std::size_t>(c) * d_size];
          for (std::int64_t d = 0; d < d_count; ++d) o[d] += static_cast<Acc>(prob) * vc[d];
        }
        st.add(sum);
      }
    }
    // Merge this split's normalised (O, LSE) into the running result.
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto& st = state[static_cast<std::size_t>(r)];
      const float inverse = st.inverse_sum();
      Acc* o = &acc[static_cast<std::size_t>(r) * d_size];
      Acc* m = &merged[static_cast<std::size_t>(r) * d_size];
      float& lse = merged_lse[static_cast<std::size_t>(r)];
      const auto w = online_softmax::merge_weights(lse, st.lse());
      // A zero weight skips its part (an empty part's output is 0 anyway); a NaN weight
      // (a NaN row) must propagate, so the test is == 0, not > 0.
      for (std::int64_t d = 0; d < d_count; ++d)
        m[d] = (w.weight_a == 0.0f ? Acc(0) : w.weight_a * m[d]) + (w.weight_b == 0.0f ? Acc(0) : w.weight_b * o[d] * inverse);
      lse = w.lse;
    }
  }

  if (must_be_finite)
    for (std::size_t e = 0; e < merged.size(); ++e)
      if (!std::isfinite(static_cast<float>(merged[e]))) return false;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = r / group, h = h_kv * group + r % group;
    const std::int64_t base = a.out_offset(b, h) + i * a.out_row_stride;
    const Acc* m = &merged[static_cast<std::size_t>(r) * d_size];
    for (std::int64_t d = 0; d < d_count; ++d) numeric::store_from_float(a.out, a.dtype, base + d, static_cast<float>(m[d]));
    if (a.maybe_lse) a.maybe_lse[a.lse_offset(b, h) + i * a.lse_row_stride] = merged_lse[static_cast<std::size_t>(r)];
  }
  return true;
}

}  // namespace

KVCacheLimits kvcache_limits() noexcept { return KVCacheLimits{"cpu", true, 1024, 1}; }

void forward_with_kvcache(const KVCacheParams& params, int num_threads) {
  if (params.has_append()) append_new_keys(params);  // before attending: the new keys are part of the cache
  const AttentionParams& a = params.attention;
  const std::int64_t items = a.batch * a.heads_kv;
#pragma omp parallel for schedule(dynamic, 1) num_threads(thread_count(num_threads))
  for (std::int64_t item = 0; item < items; ++item) {
    const std::int64_t b = item / a.heads_kv, h_kv = item % a.heads_kv;
    if (!attend_work_item<float>(params, b, h_kv, true)) attend_work_item<double>(params, b, h_kv, false);
  }
}

}  // namespace flashattn::cpu
