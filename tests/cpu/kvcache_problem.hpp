// tests/cpu/kvcache_problem.hpp — a random decoding problem for forward_with_kvcache
// (contiguous or paged cache, optional append + rotary), and its expected result:
// the float64 reference on the dense K/V gathered by the test itself, with the
// test's own rotary embedding. Shared by the CPU and CUDA KV-cache tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "flashattn/kvcache.hpp"
#include "src/core/validate.hpp"
#include "src/cpu/reference.hpp"
#include "tests/support/host_tensor.hpp"

namespace flashattn::testing {

struct DecodeShape {
  DType dtype = DType::float16;
  std::int64_t batch = 2;
  std::int64_t seqlen_q = 1;
  std::int64_t heads_q = 4;
  std::int64_t heads_kv = 2;
  std::int64_t head_dim = 32;
  std::int64_t capacity = 100;  // per-sequence cache positions
  std::int64_t page_size = 0;   // 0 = contiguous cache
  std::int64_t seqlen_new = 0;  // appended keys (0 = no k/v)
  std::vector<std::int32_t> cache_seqlens;  // per sequence; empty = random in [0, capacity - seqlen_new]
  bool uniform_seqlen = false;              // pass cache_seqlens[0] as one int
  std::vector<std::int32_t> leftpad;        // empty = none
  bool permute_batch = false;               // cache_batch_idx = a permutation of a larger cache
  std::int64_t rotary_dim = 0;              // 0 = no rotary
  bool rotary_interleaved = true;
  bool causal = false;
  std::int64_t window_left = -1, window_right = -1;
  double softcap = 0.0;
  // ALiBi slopes (AttentionOptions::maybe_alibi_slopes): none, one per query head
  // ([heads_q]; query head 1 gets slope 0, so one GQA group mixes biased and unbiased
  // rows), or one per (sequence, query head) ([batch, heads_q]).
  enum class Alibi { none, per_head, per_batch_head };
  Alibi alibi = Alibi::none;
  int num_splits = 1;

  std::string describe() const {
    std::string s = std::string(dtype_name(dtype)) + " b" + std::to_string(batch) + " q" + std::to_string(seqlen_q) + " h" +
                    std::to_string(heads_q) + "/" + std::to_string(heads_kv) + " d" + std::to_string(head_dim) + " cap" +
                    std::to_string(capacity) + (page_size ? " page" + std::to_string(page_size) : std::string(" contiguous"));
    if (seqlen_new) s += " new" + std::to_string(seqlen_new);
    if (rotary_dim) s += " rotary" + std::to_string(rotary_dim) + (rotary_interleaved ? "i" : "n");
    if (causal) s += " causal";
    if (window_left >= 0 || window_right >= 0) s += " window(" + std::to_string(window_left) + "," + std::to_string(window_right) + ")";
    if (softcap > 0) s += " softcap";
    if (!leftpad.empty()) s += " leftpad";
    if (permute_batch) s += " batch_idx";
    if (alibi != Alibi::none) s += alibi == Alibi::per_head ? " alibi(head)" : " alibi(batch,head)";
    s += " splits" + std::to_string(num_splits);
    return s;
  }
};

inline void PrintTo(const DecodeShape& shape, std::ostream* os) { *os << shape.describe(); }

// Host buffers of one problem. The cache is canary-filled, then only the positions
// [0, cache_seqlens[b]) of each sequence get random values: anything read outside the
// valid range would be a NaN in the output.
class DecodeProblem {
 public:
  explicit DecodeProblem(DecodeShape shape, std::uint64_t seed = 1) : shape_(std::move(shape)) {
    auto& s = shape_;
    std::mt19937_64 rng(seed);
    if (s.cache_seqlens.empty()) {
      std::uniform_int_distribution<std::int64_t> length(0, s.capacity - s.seqlen_new);
      for (std::int64_t b = 0; b < s.batch; ++b) s.cache_seqlens.push_back(static_cast<std::int32_t>(length(rng)));
    }
    if (s.uniform_seqlen) std::fill(s.cache_seqlens.begin(), s.cache_seqlens.end(), s.cache_seqlens.empty() ? 0 : s.cache_seqlens[0]);
    q = HostTensor(s.dtype, {s.batch, s.seqlen_q, s.heads_q, s.head_dim});
    q.fill_random(seed * 11 + 1);
    if (s.page_size > 0) {
      pages_per_seq = (s.capacity + s.page_size - 1) / s.page_size;
      const std::int64_t blocks = s.batch * pages_per_seq + 3;  // spare blocks stay canary
      k_cache = HostTensor(s.dtype, {blocks, s.page_size, s.heads_kv, s.head_dim});
      block_table = HostTensor(DType::int32, {s.batch, pages_per_seq});
      std::vector<std::int32_t> ids(static_cast<std::size_t>(blocks));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      auto* table = static_cast<std::int32_t*>(block_table.data());
      for (std::int64_t i = 0; i < s.batch * pages_per_seq; ++i) table[i] = ids[static_cast<std::size_t>(i)];
    } else {
      const std::int64_t rows = s.permute_batch ? s.batch + 2 : s.batch;
      k_cache = HostTensor(s.dtype, {rows, s.capacity, s.heads_kv, s.head_dim});
      if (s.permute_batch) {
        cache_batch_idx = HostTensor(DType::int32, {s.batch});
        std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        for (std::int64_t b = 0; b < s.batch; ++b) static_cast<std::int32_t*>(cache_batch_idx.data())[b] = ids[static_cast<std::size_t>(b)];
      }
    }
    v_cache = HostTensor(s.dtype, k_cache.shape());
    k_cache.fill_canary();
    v_cache.fill_canary();
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t pos = 0; pos < s.cache_seqlens[static_cast<std::size_t>(b)]; ++pos)
        for (std::int64_t h = 0; h < s.heads_kv; ++h)
          for (std::int64_t d = 0; d < s.head_dim; ++d) {
            k_cache.set(cache_index(b, pos, h) + d, normal(rng));
            v_cache.set(cache_index(b, pos, h) + d, normal(rng));
          }
    cache_seqlens = HostTensor(DType::int32, {s.batch});
    std::copy(s.cache_seqlens.begin(), s.cache_seqlens.end(), static_cast<std::int32_t*>(cache_seqlens.data()));
    if (!s.leftpad.empty()) {
      cache_leftpad = HostTensor(DType::int32, {s.batch});
      std::copy(s.leftpad.begin(), s.leftpad.end(), static_cast<std::int32_t*>(cache_leftpad.data()));
    }
    if (s.seqlen_new > 0) {
      k_new = HostTensor(s.dtype, {s.batch, s.seqlen_new, s.heads_kv, s.head_dim});
      v_new = HostTensor(s.dtype, k_new.shape());
      k_new.fill_random(seed * 11 + 2);
      v_new.fill_random(seed * 11 + 3);
    }
    if (s.rotary_dim > 0) {
      const std::int64_t seqlen_ro = (s.page_size > 0 ? pages_per_seq * s.page_size : s.capacity) + s.seqlen_q;
      rotary_cos = HostTensor(s.dtype, {seqlen_ro, s.rotary_dim / 2});
      rotary_sin = HostTensor(s.dtype, {seqlen_ro, s.rotary_dim / 2});
      for (std::int64_t pos = 0; pos < seqlen_ro; ++pos)
        for (std::int64_t t = 0; t < s.rotary_dim / 2; ++t) {
          const double angle = static_cast<double>(pos) * std::pow(10000.0, -2.0 * static_cast<double>(t) / static_cast<double>(s.rotary_dim));
          rotary_cos.set(pos * (s.rotary_dim / 2) + t, static_cast<float>(std::cos(angle)));
          rotary_sin.set(pos * (s.rotary_dim / 2) + t, static_cast<float>(std::sin(angle)));
        }
    }
    if (s.alibi != DecodeShape::Alibi::none) {
      // Distinct slopes in [0.005, 0.3]: a bias of a few units over tens to hundreds of
      // keys, so both the scores and the distances shape the output. Own generator: the
      // other tensors stay those of the same problem without ALiBi.
      const bool per_batch = s.alibi == DecodeShape::Alibi::per_batch_head;
      alibi_slopes = per_batch ? HostTensor(DType::float32, {s.batch, s.heads_q}) : HostTensor(DType::float32, {s.heads_q});
      std::mt19937_64 alibi_rng(seed * 11 + 5);
      std::uniform_real_distribution<float> slope(0.005f, 0.3f);
      for (std::int64_t i = 0; i < alibi_slopes.numel(); ++i) alibi_slopes.set(i, !per_batch && i == 1 ? 0.0f : slope(alibi_rng));
    }
    out = HostTensor(s.dtype, q.shape());
    lse = HostTensor(DType::float32, {s.batch, s.heads_q, s.seqlen_q});
    out.fill_canary();
    lse.fill_canary();
  }

  const DecodeShape& shape() const { return shape_; }

  // Element offset of (sequence b, cache position, kv head h) in the cache buffers.
  std::int64_t cache_index(std::int64_t b, std::int64_t position, std::int64_t h) const {
    const auto& s = shape_;
    std::int64_t row;
    if (s.page_size > 0) {
      const std::int64_t block = static_cast<const std::int32_t*>(block_table.data())[b * pages_per_seq + position / s.page_size];
      row = block * s.page_size + position % s.page_size;
    } else {
      const std::int64_t cache_b = s.permute_batch ? static_cast<const std::int32_t*>(cache_batch_idx.data())[b] : b;
      row = cache_b * s.capacity + position;
    }
    return (row * s.heads_kv + h) * s.head_dim;
  }

  KVCacheArgs args() {
    const auto& s = shape_;
    KVCacheArgs a;
    a.q = q.view();
    a.k_cache = k_cache.view();
    a.v_cache = v_cache.view();
    if (s.seqlen_new > 0) a.maybe_k_new = k_new.view(), a.maybe_v_new = v_new.view();
    if (s.uniform_seqlen) {
      a.maybe_uniform_cache_seqlen = s.cache_seqlens.empty() ? 0 : s.cache_seqlens[0];
    } else {
      a.maybe_cache_seqlens = cache_seqlens.view();
    }
    if (s.permute_batch) a.maybe_cache_batch_idx = cache_batch_idx.view();
    if (!s.leftpad.empty()) a.maybe_cache_leftpad = cache_leftpad.view();
    if (s.page_size > 0) a.maybe_block_table = block_table.view();
    if (s.rotary_dim > 0) {
      a.maybe_rotary_cos = rotary_cos.view();
      a.maybe_rotary_sin = rotary_sin.view();
      a.rotary_interleaved = s.rotary_interleaved;
    }
    a.out = out.view();
    a.maybe_lse = lse.view();
    a.num_splits = s.num_splits;
    a.options.causal = s.causal;
    a.options.window_left = s.window_left;
    a.options.window_right = s.window_right;
    a.options.softcap = s.softcap;
    if (s.alibi != DecodeShape::Alibi::none) a.options.maybe_alibi_slopes = alibi_slopes.view();
    return a;
  }

  // The test's own rotary embedding, in float64: pairs (2t, 2t+1) or (t, t + dim/2).
  std::vector<double> rotate(std::vector<double> x, std::int64_t position) const {
    const auto& s = shape_;
    const std::int64_t half = s.rotary_dim / 2;
    for (std::int64_t t = 0; t < half; ++t) {
      const double c = rotary_cos.get(position * half + t), sn = rotary_sin.get(position * half + t);
      const std::size_t i1 = static_cast<std::size_t>(s.rotary_interleaved ? 2 * t : t);
      const std::size_t i2 = static_cast<std::size_t>(s.rotary_interleaved ? 2 * t + 1 : t + half);
      const double x1 = x[i1], x2 = x[i2];
      x[i1] = x1 * c - x2 * sn;
      x[i2] = x1 * sn + x2 * c;
    }
    return x;
  }

  // The new key row j of (b, h) as it must land in the cache (rotated, rounded).
  std::vector<double> expected_new_key(std::int64_t b, std::int64_t j, std::int64_t h) const {
    const auto& s = shape_;
    std::vector<double> x(static_cast<std::size_t>(s.head_dim));
    for (std::int64_t d = 0; d < s.head_dim; ++d) x[static_cast<std::size_t>(d)] = k_new.get(((b * s.seqlen_new + j) * s.heads_kv + h) * s.head_dim + d);
    if (s.rotary_dim > 0) x = rotate(x, s.cache_seqlens[static_cast<std::size_t>(b)] + j);
    for (auto& value : x) value = numeric::round_to(s.dtype, static_cast<float>(value));
    return x;
  }

  // The same attention as plain varlen attention over dense buffers built here:
  // q (rotated like flash_attn), and per sequence the keys [leftpad, L + new).
  struct Dense {
    HostTensor q, k, v, out, lse, cu_q, cu_k, alibi_slopes;
    ForwardArgs args;
  };
  Dense dense() const {
    const auto& s = shape_;
    Dense d;
    std::vector<std::int32_t> lengths;
    for (std::int64_t b = 0; b < s.batch; ++b) {
      const std::int64_t pad = s.leftpad.empty() ? 0 : s.leftpad[static_cast<std::size_t>(b)];
      lengths.push_back(static_cast<std::int32_t>(s.cache_seqlens[static_cast<std::size_t>(b)] + s.seqlen_new - pad));
    }
    const std::int64_t total_k = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
    d.q = HostTensor(s.dtype, {s.batch * s.seqlen_q, s.heads_q, s.head_dim});
    d.k = HostTensor(s.dtype, {total_k, s.heads_kv, s.head_dim});
    d.v = HostTensor(s.dtype, {total_k, s.heads_kv, s.head_dim});
    d.out = HostTensor(s.dtype, d.q.shape());
    d.lse = HostTensor(DType::float32, {s.heads_q, s.batch * s.seqlen_q});
    d.cu_q = HostTensor(DType::int32, {s.batch + 1});
    d.cu_k = HostTensor(DType::int32, {s.batch + 1});
    auto* cu_q = static_cast<std::int32_t*>(d.cu_q.data());
    auto* cu_k = static_cast<std::int32_t*>(d.cu_k.data());
    cu_q[0] = cu_k[0] = 0;
    const bool per_row = s.causal || s.window_left >= 0 || s.window_right >= 0;
    for (std::int64_t b = 0; b < s.batch; ++b) {
      cu_q[b + 1] = static_cast<std::int32_t>((b + 1) * s.seqlen_q);
      cu_k[b + 1] = cu_k[b] + lengths[static_cast<std::size_t>(b)];
      const std::int64_t cached = s.cache_seqlens[static_cast<std::size_t>(b)];
      for (std::int64_t i = 0; i < s.seqlen_q; ++i)
        for (std::int64_t h = 0; h < s.heads_q; ++h) {
          std::vector<double> x(static_cast<std::size_t>(s.head_dim));
          for (std::int64_t e = 0; e < s.head_dim; ++e) x[static_cast<std::size_t>(e)] = q.get(((b * s.seqlen_q + i) * s.heads_q + h) * s.head_dim + e);
          if (s.rotary_dim > 0) x = rotate(x, cached + (per_row ? i : 0));
          for (std::int64_t e = 0; e < s.head_dim; ++e)
            d.q.set(((b * s.seqlen_q + i) * s.heads_q + h) * s.head_dim + e, static_cast<float>(x[static_cast<std::size_t>(e)]));
        }
      const std::int64_t pad = s.leftpad.empty() ? 0 : s.leftpad[static_cast<std::size_t>(b)];
      for (std::int64_t j = 0; j < lengths[static_cast<std::size_t>(b)]; ++j) {
        const std::int64_t position = pad + j, row = cu_k[b] + j;
        for (std::int64_t h = 0; h < s.heads_kv; ++h) {
          const std::int64_t dst = (row * s.heads_kv + h) * s.head_dim;
          if (position < cached) {
            for (std::int64_t e = 0; e < s.head_dim; ++e) {
              d.k.set(dst + e, k_cache_initial.get(cache_index(b, position, h) + e));
              d.v.set(dst + e, v_cache_initial.get(cache_index(b, position, h) + e));
            }
          } else {
            const auto key = expected_new_key(b, position - cached, h);
            for (std::int64_t e = 0; e < s.head_dim; ++e) {
              d.k.set(dst + e, static_cast<float>(key[static_cast<std::size_t>(e)]));
              d.v.set(dst + e, v_new.get(((b * s.seqlen_new + position - cached) * s.heads_kv + h) * s.head_dim + e));
            }
          }
        }
      }
    }
    d.args.q = d.q.view();
    d.args.k = d.k.view();
    d.args.v = d.v.view();
    d.args.out = d.out.view();
    d.args.maybe_lse = d.lse.view();
    VarlenArgs varlen;
    varlen.cu_seqlens_q = d.cu_q.view();
    varlen.cu_seqlens_k = d.cu_k.view();
    varlen.max_seqlen_q = s.seqlen_q;
    varlen.max_seqlen_k = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
    d.args.maybe_varlen = varlen;
    d.args.options.causal = s.causal;
    d.args.options.window_left = s.window_left;
    d.args.options.window_right = s.window_right;
    d.args.options.softcap = s.softcap;
    if (s.alibi != DecodeShape::Alibi::none) {
      d.alibi_slopes = alibi_slopes;  // the same slopes, same layout
      d.args.options.maybe_alibi_slopes = d.alibi_slopes.view();
    }
    return d;
  }

  // Call before running: keeps the cache contents for the dense problem and the
  // bitwise check of the append.
  void snapshot() {
    k_cache_initial = k_cache;
    v_cache_initial = v_cache;
  }

  HostTensor q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos,
      rotary_sin, alibi_slopes, out, lse;
  HostTensor k_cache_initial, v_cache_initial;
  std::int64_t pages_per_seq = 0;

 private:
  DecodeShape shape_;
};

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  return worst;
}

inline double floor_of(DType dtype) { return dtype == DType::float32 ? 1e-6 : (dtype == DType::float16 ? 1e-4 : 5e-4); }

// out/lse of the problem (host buffers) in ReferenceResult's dense layout.
inline void gather(const DecodeProblem& p, std::vector<double>& out, std::vector<double>& lse) {
  const auto& s = p.shape();
  out.clear();
  lse.clear();
  for (std::int64_t row = 0; row < s.batch * s.seqlen_q; ++row)
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      for (std::int64_t e = 0; e < s.head_dim; ++e) out.push_back(p.out.get((row * s.heads_q + h) * s.head_dim + e));
      const std::int64_t b = row / s.seqlen_q, i = row % s.seqlen_q;
      lse.push_back(p.lse.get((b * s.heads_q + h) * s.seqlen_q + i));
    }
}

// STYLE.md's rule on out and LSE against the float64 reference of the dense problem.
inline void expect_matches_reference(const DecodeProblem& p, const std::string& label) {
  DecodeProblem::Dense d = p.dense();
  const AttentionParams params = validate_forward(d.args);
  const cpu::ReferenceResult ref = cpu::reference_forward(params);
  const cpu::ReferenceResult low = cpu::naive_forward_in_precision(params, params.dtype);
  std::vector<double> out, lse;
  gather(p, out, lse);
  const double floor = floor_of(params.dtype);
  const double out_tolerance = 2.0 * max_abs_diff(low.out, ref.out) + floor, lse_tolerance = 2.0 * max_abs_diff(low.lse, ref.lse) + floor;
  // On failure, the first rows past the tolerance by (sequence, position, query head,
  // its kv head, its ALiBi slope), so a wrong head or mask row shows as such.
  const auto& s = p.shape();
  std::string rows;
  int listed = 0;
  for (std::int64_t row = 0; row < s.batch * s.seqlen_q && listed < 8; ++row)
    for (std::int64_t h = 0; h < s.heads_q && listed < 8; ++h) {
      const std::size_t first = static_cast<std::size_t>((row * s.heads_q + h) * s.head_dim), r = static_cast<std::size_t>(row * s.heads_q + h);
      const std::vector<double> row_out(out.begin() + first, out.begin() + first + s.head_dim),
          row_ref(ref.out.begin() + first, ref.out.begin() + first + s.head_dim);
      const double out_error = max_abs_diff(row_out, row_ref), lse_error = max_abs_diff({lse[r]}, {ref.lse[r]});
      if (out_error <= out_tolerance && lse_error <= lse_tolerance) continue;
      const std::int64_t b = row / s.seqlen_q;
      std::string slope = "none";
      if (p.alibi_slopes.numel() > 0) slope = std::to_string(p.alibi_slopes.get(p.alibi_slopes.shape().size() == 2 ? b * s.heads_q + h : h));
      rows += "\n  sequence " + std::to_string(b) + " position " + std::to_string(row % s.seqlen_q) + " head " + std::to_string(h) +
              " (kv head " + std::to_string(h / (s.heads_q / s.heads_kv)) + ", slope " + slope + "): out error " + std::to_string(out_error) +
              ", lse " + std::to_string(lse[r]) + " vs " + std::to_string(ref.lse[r]);
      ++listed;
    }
  EXPECT_LE(max_abs_diff(out, ref.out), out_tolerance) << label << " (out)" << rows;
  EXPECT_LE(max_abs_diff(lse, ref.lse), lse_tolerance) << label << " (lse)" << rows;
}

// The append wrote exactly the expected slots: new rows (rotated) at L_b + j, every
// other byte of both caches unchanged.
inline void expect_append_exact(const DecodeProblem& p, const std::string& label) {
  const auto& s = p.shape();
  HostTensor k_expected = p.k_cache_initial, v_expected = p.v_cache_initial;
  double worst_rotated = 0.0;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t j = 0; j < s.seqlen_new; ++j)
      for (std::int64_t h = 0; h < s.heads_kv; ++h) {
        const std::int64_t position = s.cache_seqlens[static_cast<std::size_t>(b)] + j;
        const std::int64_t base = p.cache_index(b, position, h);
        const auto key = p.expected_new_key(b, j, h);
        const std::size_t element = dtype_size(s.dtype);
        for (std::int64_t e = 0; e < s.head_dim; ++e) {
          // The rotation is float32 in the library, float64 here: one rounding apart at most.
          worst_rotated = std::max(worst_rotated, std::abs(p.k_cache.get(base + e) - key[static_cast<std::size_t>(e)]) /
                                                      (std::abs(key[static_cast<std::size_t>(e)]) + 1e-3));
          std::memcpy(static_cast<char*>(k_expected.data()) + (base + e) * static_cast<std::int64_t>(element),
                      static_cast<const char*>(p.k_cache.data()) + (base + e) * static_cast<std::int64_t>(element), element);
          v_expected.set(base + e, p.v_new.get(((b * s.seqlen_new + j) * s.heads_kv + h) * s.head_dim + e));
        }
      }
  const double ulp = s.dtype == DType::bfloat16 ? 1.0 / 128 : (s.dtype == DType::float16 ? 1.0 / 1024 : 1e-5);  // float32: a few roundings under cancellation
  EXPECT_LE(worst_rotated, ulp) << label << " (appended keys)";
  EXPECT_TRUE(p.k_cache.bitwise_equal(k_expected)) << label << " (k_cache outside the appended slots)";
  EXPECT_TRUE(p.v_cache.bitwise_equal(v_expected)) << label << " (v_cache: appended values bitwise, nothing else)";
}

}  // namespace flashattn::testing
