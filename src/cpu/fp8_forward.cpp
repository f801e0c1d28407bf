// src/cpu/fp8_forward.cpp — the CPU path of FP8 (float8_e4m3) attention: q, k and v
// dequantised once (stored value times its (batch, kv head) descale, one float32
// rounding) into dense float32 scratch, then the float32 algorithms run unchanged
// (every feature: masks, dropout, ALiBi, paged K/V), and the float32 output is rounded
// once into out's dtype (bfloat16 or float16). The scratch is O(q + k + v) floats.
#include <cstdint>
#include <vector>

#include "src/core/backend.hpp"
#include "src/core/numeric.hpp"
#include "src/core/params.hpp"
#include "src/cpu/flash.hpp"
#include "src/cpu/reference.hpp"

namespace flashattn::cpu {
namespace {

float descale_at(const float* maybe_descale, const std::int64_t strides[2], std::int64_t b, std::int64_t kv_head) {
  return maybe_descale ? maybe_descale[b * strides[0] + kv_head * strides[1]] : 1.0f;
}

// One dense float32 tensor [rows, heads, head_dim] (rows in dense_q_row/dense_k_row
// order) and the strides that address it through AttentionParams.
struct DenseFloat {
  std::vector<float> data;
  std::int64_t batch_stride = 0, row_stride = 0, head_stride = 0;

  DenseFloat(std::int64_t rows, std::int64_t heads, std::int64_t head_dim, std::int64_t seqlen, bool is_varlen)
      : data(static_cast<std::size_t>(rows * heads * head_dim), 0.0f),
        batch_stride(is_varlen ? 0 : seqlen * heads * head_dim),
        row_stride(heads * head_dim),
        head_stride(head_dim) {}
  float* row(std::int64_t dense_row, std::int64_t head) { return data.data() + dense_row * row_stride + head * head_stride; }
};

void dequantise_row(const void* base, std::int64_t offset, std::int64_t head_dim, float descale, float* dst) {
  const auto* codes = static_cast<const std::uint8_t*>(base) + offset;
  for (std::int64_t d = 0; d < head_dim; ++d) dst[d] = numeric::float8_e4m3_to_float(codes[d]) * descale;
}

}  // namespace

void fp8_forward(const AttentionParams& params, Algorithm algorithm, int num_threads) {
  const std::int64_t d = params.head_dim;
  const bool is_varlen = params.is_varlen();
  DenseFloat q(params.total_q, params.heads_q, d, params.seqlen_q, is_varlen);
  DenseFloat out(params.total_q, params.heads_q, d, params.seqlen_q, is_varlen);
  // Paged K/V are gathered into packed varlen rows here (k_start(b) + j), as gather_paged_kv does.
  DenseFloat k(params.total_k, params.heads_kv, d, params.seqlen_k, is_varlen);
  DenseFloat v(params.total_k, params.heads_kv, d, params.seqlen_k, is_varlen);
  for (std::int64_t b = 0; b < params.batch; ++b) {
    for (std::int64_t h = 0; h < params.heads_q; ++h) {
      const float descale = descale_at(params.maybe_q_descale, params.q_descale_strides, b, h / params.group_size);
      for (std::int64_t i = 0; i < params.seqlen_q_of(b); ++i)
        dequantise_row(params.q, params.q_offset(b, h) + i * params.q_row_stride, d, descale, q.row(dense_q_row(params, b, i), h));
    }
    for (std::int64_t h = 0; h < params.heads_kv; ++h) {
      const float k_descale = descale_at(params.maybe_k_descale, params.k_descale_strides, b, h);
      const float v_descale = descale_at(params.maybe_v_descale, params.v_descale_strides, b, h);
      for (std::int64_t j = 0; j < params.seqlen_k_of(b); ++j) {
        std::int64_t k_source, v_source;
        if (params.is_paged()) {
          const std::int64_t block = params.page_block(b, j / params.page_size), in_page = j % params.page_size;
          k_source = block * params.k_batch_stride + in_page * params.k_row_stride + h * params.k_head_stride;
          v_source = block * params.v_batch_stride + in_page * params.v_row_stride + h * params.v_head_stride;
        } else {
          k_source = params.k_offset(b, h) + j * params.k_row_stride;
          v_source = params.v_offset(b, h) + j * params.v_row_stride;
        }
        const std::int64_t row = dense_k_row(params, b, j);
        dequantise_row(params.k, k_source, d, k_descale, k.row(row, h));
        dequantise_row(params.v, v_source, d, v_descale, v.row(row, h));
      }
    }
  }

  AttentionParams dense = params;
  dense.dtype = dense.input_dtype = DType::float32;
  dense.maybe_q_descale = dense.maybe_k_descale = dense.maybe_v_descale = nullptr;
  dense.maybe_block_table = nullptr;
  dense.q = q.data.data(), dense.k = k.data.data(), dense.v = v.data.data(), dense.out = out.data.data();
  dense.q_batch_stride = q.batch_stride, dense.q_row_stride = q.row_stride, dense.q_head_stride = q.head_stride;
  dense.k_batch_stride = k.batch_stride, dense.k_row_stride = k.row_stride, dense.k_head_stride = k.head_stride;
  dense.v_batch_stride = v.batch_stride, dense.v_row_stride = v.row_stride, dense.v_head_stride = v.head_stride;
  dense.out_batch_stride = out.batch_stride, dense.out_row_stride = out.row_stride, dense.out_head_stride = out.head_stride;
  forward(dense, algorithm, num_threads);  // writes the LSE in place

  // Only the rows the algorithms wrote (varlen rows no sequence owns stay untouched).
  for (std::int64_t b = 0; b < params.batch; ++b)
    for (std::int64_t h = 0; h < params.heads_q; ++h)
      for (std::int64_t i = 0; i < params.seqlen_q_of(b); ++i) {
        const float* source = out.row(dense_q_row(params, b, i), h);
        const std::int64_t destination = params.out_offset(b, h) + i * params.out_row_stride;
        for (std::int64_t c = 0; c < d; ++c) numeric::store_from_float(params.out, params.dtype, destination + c, source[c]);
      }
}

}  // namespace flashattn::cpu
