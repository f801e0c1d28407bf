// src/cuda/common/mask_fragment.cuh — the mask hook on an accumulator fragment: the
// element pass of a *partial* tile of a list-driven kernel (src/core/mask_tables.hpp),
// and the dBias accumulation of the backward. Layouts as fragment.cuh: plain (rows =
// queries; row0 = the query row of half 0, col0 = the block's first key) or transposed
// (rows = keys; row0 = key_row0, col0 = the first query of the block).
//
// One element is allowed iff it lies inside the sequences, the interval rule
// (MaskRule: causal, window) allows it, the block mask allows it (block code, then
// ElementRule), and a boolean attn_mask allows it; a float attn_mask adds its bias
// (natural-log units, -inf = masked) times `bias_factor` — the unit of the kernel's
// scores: log2(e) when they are log2 scores, 1 / softmax_scale when they are raw q·k
// that the kernel scales by softmax_scale·log2(e) in the exponent.
// Masked elements become -inf (P = 0 exactly, never 0·NaN). Per element, a few loads:
// meant for partial tiles only, which the lists keep few.
//
// Two forms of the element pass of a listed partial tile:
//  - apply_fragment_mask (fast): when the tile has a tile code (src/core/mask_tables.hpp: one
//    block code under the whole tile, no dense attn_mask, sorted documents), the rule is
//    per fragment row one or two spans of allowed columns (allowed_key_spans /
//    allowed_query_spans) and at most one partial block's bits. The thread loads its two
//    rows' inputs once (document span, prefix, bit words) and tests each element with
//    register arithmetic on 32-bit tile-local columns.
//  - apply_mask (general, kGeneralTile): mask_offset per element.
// Both give the same -inf pattern; a bias only exists on the general path.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "flashattn/mask.hpp"
#include "src/core/mask_tables.hpp"
#include "src/core/params.hpp"

namespace flashattn::cuda::fragment {

// A float attn_mask element (float32, float16 or bfloat16) as float.
__device__ __forceinline__ float load_bias(const void* base, DType dtype, std::int64_t offset) {
  if (dtype == DType::float32) return static_cast<const float*>(base)[offset];
  if (dtype == DType::float16) return __half2float(static_cast<const __half*>(base)[offset]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[offset]);
}

// ElementRule::allowed (flashattn/block_mask.hpp) for a (row, col) inside the sequences,
// with every load unconditional (a bad partial id reads block 0 and is denied): no
// data-dependent branch stands between the loads of the elements of a fragment.
__device__ __forceinline__ bool rule_allows(const ElementRule& rule, std::int64_t b, std::int64_t row, std::int64_t col,
                                            std::int32_t partial_id) {
  bool allowed = true;
  if (rule.has_band) {
    const bool in_prefix =
        rule.maybe_prefix_lengths != nullptr ? col < rule.maybe_prefix_lengths[b * rule.prefix_batch_stride] : false;
    allowed = rule.in_band(row, col) | in_prefix;
  }
  if (rule.maybe_q_document_ids != nullptr) {
    const std::int32_t q_document = rule.maybe_q_document_ids[b * rule.q_document_batch_stride + row];
    const std::int32_t k_document = rule.maybe_k_document_ids[b * rule.k_document_batch_stride + col];
    allowed = allowed & (q_document == k_document);
  }
  if (rule.has_bits()) {
    const bool is_id_valid = partial_id >= 0 && partial_id < rule.partial_block_count;
    if (rule.partial_block_count == 0) return false;  // no bits to read: every partial element denied
    const std::int64_t id = is_id_valid ? partial_id : 0;
    const std::int64_t r = row & (rule.block_m - 1), c = col & (rule.block_n - 1);  // powers of two
    const std::uint32_t word = rule.maybe_partial_bits[(id * rule.block_m + r) * rule.words_per_row + (c >> 5)];
    allowed = allowed & is_id_valid & (((word >> (c & 31)) & 1u) != 0);
  }
  return allowed;
}

// The natural-log offset of (b, h, row, col): -inf when masked, else the bias (0 without
// one). Branch-free in the data: the indices are clamped into the sequences so every
// load is in range and an unrolled caller issues the loads of all its elements before
// the first use (short-circuited per element, they ran one after another: a partial tile
// cost ~15x a full one on H100).
__device__ __forceinline__ float mask_offset(const AttentionParams& params, const MaskRule& mask, std::int64_t b,
                                             std::int64_t h, std::int64_t row, std::int64_t col) {
  const bool is_inside = row < mask.seqlen_q && col < mask.seqlen_k;
  const std::int64_t r = is_inside ? row : 0, c = is_inside ? col : 0;
  bool allowed = is_inside & mask.allowed(row, col);
  const DeviceMask& device_mask = params.device_mask;
  if (device_mask.maybe_block_codes != nullptr) {
    const std::int32_t code = device_mask.block_code(params.block_mask, b, h, r, c);
    const bool rule_ok = rule_allows(params.block_mask.rule, b, r, c, code);
    allowed = allowed & (code != DeviceMask::kEmptyBlock) & ((code == DeviceMask::kFullBlock) | rule_ok);
  }
  float offset = 0.0f;
  if (params.has_attn_mask()) {
    const std::int64_t index = params.attn_mask_offset(b, h, r, c);
    if (!params.attn_mask_is_bias) {
      const std::uint8_t keep = static_cast<const std::uint8_t*>(params.maybe_attn_mask)[index];
      allowed = allowed & (keep != 0);
    } else {
      offset = load_bias(params.maybe_attn_mask, params.attn_mask_dtype, index);
    }
  }
  return allowed ? offset : -INFINITY;
}

// The fast element pass (see the header) of one fragment row of a 16 x 8·kNTiles
// fragment for this thread: its elements (j, e) sit at fragment column
// col0 + 8 j + 2 quad + e (fragment.cuh), tested in the thread's column units c = 8 j + e.
template <int kNTiles>
struct RowMask {
  static constexpr int kWords = (kNTiles + 3) / 4;  // bit words, 4 n8 tiles each
  std::int32_t begin[2];       // [span]: first allowed c
  std::uint32_t width[2];      // [span]: allowed c in [begin, begin + width)
  std::uint32_t bits[kWords];  // bit 8 (j % 4) + e of word j / 4 = the partial bit of (j, e); all ones without bits

  __device__ __forceinline__ bool allows(int j, int e) const {
    const int c = 8 * j + e;
    const bool in_spans = (static_cast<std::uint32_t>(c - begin[0]) < width[0]) |
                          (static_cast<std::uint32_t>(c - begin[1]) < width[1]);
    return in_spans & (((bits[j / 4] >> (8 * (j % 4) + e)) & 1u) != 0);
  }
};

// RowMask of fragment row `row` — a query (plain: col0 = the fragment's first key) or a
// key (kTransposed: col0 = the first query) — of a tile with tile code `tile_code` (not
// kGeneralTile; the fragment's columns lie inside one mask block, as the whole tile does).
// A few independent loads (prefix, document span, the bit words), then register math.
template <int kNTiles, bool kTransposed>
__device__ __forceinline__ RowMask<kNTiles> make_row_mask(const AttentionParams& params, const MaskRule& mask,
                                                          std::int32_t tile_code, std::int64_t b, std::int64_t row,
                                                          std::int64_t col0) {
  constexpr int kColumns = 8 * kNTiles;
  constexpr int kWords = RowMask<kNTiles>::kWords;
  const int quad = static_cast<int>(threadIdx.x % 4);
  const DeviceMask& device_mask = params.device_mask;
  const BlockMaskView& view = params.block_mask;
  const ElementRule& rule = view.rule;
  const bool is_rule_applied = tile_code != DeviceMask::kFullBlock;
  const std::int64_t prefix_length = is_rule_applied ? rule.prefix_length(b) : 0;
  DocumentSpan documents;
  if (is_rule_applied && rule.maybe_q_document_ids != nullptr) {
    const std::int32_t* spans = kTransposed ? device_mask.maybe_document_query_spans : device_mask.maybe_document_key_spans;
    const std::int64_t stride = kTransposed ? device_mask.document_batch_stride_k : device_mask.document_batch_stride_q;
    const std::int64_t row_count = kTransposed ? mask.seqlen_k : mask.seqlen_q;
    const std::int64_t safe_row = row < row_count ? row : 0;  // a row past the end is denied by its spans
    const int2 span = reinterpret_cast<const int2*>(spans)[b * stride + safe_row];
    documents = {span.x, span.y};
  }
  std::uint32_t words[kWords + 1];
#pragma unroll
  for (int k = 0; k <= kWords; ++k) words[k] = ~0u;
  // The thread's first column inside the mask block: its bits start at bit `shift` of word `first_word`.
  const std::int64_t block_columns = kTransposed ? view.block_m : view.block_n;
  const std::int64_t column_in_block = (col0 & (block_columns - 1)) + 2 * quad;
  const int shift = static_cast<int>(column_in_block & 31);
  if (is_rule_applied && rule.has_bits() && tile_code >= 0 && tile_code < rule.partial_block_count) {
    const std::uint32_t* table = kTransposed ? device_mask.maybe_partial_bits_by_key : rule.maybe_partial_bits;
    const std::int64_t block_rows = kTransposed ? view.block_n : view.block_m;
    const std::int64_t words_per_row = kTransposed ? device_mask.words_per_key : rule.words_per_row;
    const std::uint32_t* row_words = table + (tile_code * block_rows + (row & (block_rows - 1))) * words_per_row;
    const std::int64_t first_word = column_in_block >> 5;
#pragma unroll
    for (int k = 0; k <= kWords; ++k) {
      // Past the row's last word only for bits no element of the tile reads: clamp.
      const std::int64_t word = first_word + k < words_per_row ? first_word + k : words_per_row - 1;
      words[k] = row_words[word];
    }
  }
  const AllowedSpans spans = kTransposed ? allowed_query_spans(mask, rule, tile_code, row, prefix_length, documents)
                                         : allowed_key_spans(mask, rule, tile_code, row, prefix_length, documents);
  RowMask<kNTiles> row_mask;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const std::int64_t first = MaskRule::clamp(spans.begin[k] - col0, 0, kColumns);
    const std::int64_t end = MaskRule::clamp(spans.end[k] - col0, first, kColumns);
    row_mask.begin[k] = static_cast<std::int32_t>(first) - 2 * quad;
    row_mask.width[k] = static_cast<std::uint32_t>(end - first);
  }
#pragma unroll
  for (int k = 0; k < kWords; ++k) row_mask.bits[k] = __funnelshift_r(words[k], words[k + 1], shift);
  return row_mask;
}

// The fast element pass of a 16 x 8·kNTiles fragment (row0: the fragment row of half 0,
// col0 its first column; layouts as apply_mask) as bits: bit i % 32 of allowed[i / 32]
// is set iff element i (= 4 j + 2 half + e) is allowed. One fragment row at a time (half
// the registers of both at once); a kernel short of registers computes the bits while
// its products are in flight and holds only these words until it applies them.
template <int kNTiles>
inline constexpr int kAllowedWords = (4 * kNTiles + 31) / 32;
template <int kNTiles, bool kTransposed = false>
__device__ __forceinline__ void fragment_allowed_bits(std::uint32_t (&allowed)[kAllowedWords<kNTiles>],
                                                      const AttentionParams& params, const MaskRule& mask,
                                                      std::int32_t tile_code, std::int64_t b, std::int64_t row0,
                                                      std::int64_t col0) {
#pragma unroll
  for (int w = 0; w < kAllowedWords<kNTiles>; ++w) allowed[w] = 0u;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const RowMask<kNTiles> row_mask = make_row_mask<kNTiles, kTransposed>(params, mask, tile_code, b, row0 + 8 * half, col0);
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int index = 4 * j + 2 * half + e;
        allowed[index / 32] |= (row_mask.allows(j, e) ? 1u : 0u) << (index % 32);
      }
  }
}
// fragment_allowed_bits as a real call, for kernels at their register limit (the Hopper
// dK/dV kernel: inlined anywhere in its step loop, the pass spilled loop state in every
// step, masks or not): the call's register saving is paid on fast partial tiles only.
template <int kNTiles>
struct AllowedBits {
  std::uint32_t words[kAllowedWords<kNTiles>];
};
template <int kNTiles, bool kTransposed = false>
__device__ __noinline__ AllowedBits<kNTiles> fragment_allowed_bits_call(const AttentionParams& params, const MaskRule mask,
                                                                        std::int32_t tile_code, std::int64_t b,
                                                                        std::int64_t row0, std::int64_t col0) {
  AllowedBits<kNTiles> allowed;
  fragment_allowed_bits<kNTiles, kTransposed>(allowed.words, params, mask, tile_code, b, row0, col0);
  return allowed;
}
template <int kNTiles, bool kTransposed = false>
__device__ __forceinline__ void fragment_allowed_bits_outlined(std::uint32_t (&allowed)[kAllowedWords<kNTiles>],
                                                               const AttentionParams& params, const MaskRule& mask,
                                                               std::int32_t tile_code, std::int64_t b, std::int64_t row0,
                                                               std::int64_t col0) {
  const AllowedBits<kNTiles> words = fragment_allowed_bits_call<kNTiles, kTransposed>(params, mask, tile_code, b, row0, col0);
#pragma unroll
  for (int w = 0; w < kAllowedWords<kNTiles>; ++w) allowed[w] = words.words[w];
}

// Elements whose bit is clear become masked_value (-inf on scores, 0 on probabilities);
// allowed ones are kept (no bias on this path).
template <int kNTiles>
__device__ __forceinline__ void apply_allowed_bits(float (&s)[4 * kNTiles], const std::uint32_t (&allowed)[kAllowedWords<kNTiles>],
                                                   float masked_value = -INFINITY) {
#pragma unroll
  for (int i = 0; i < 4 * kNTiles; ++i)
    if (((allowed[i / 32] >> (i % 32)) & 1u) == 0) s[i] = masked_value;
}
// The fast element pass applied directly, one fragment row at a time (as
// fragment_allowed_bits, without the bit words).
template <int kNTiles, bool kTransposed = false>
__device__ __forceinline__ void apply_fragment_mask(float (&s)[4 * kNTiles], const AttentionParams& params,
                                                    const MaskRule& mask, std::int32_t tile_code, std::int64_t b,
                                                    std::int64_t row0, std::int64_t col0,
                                                    float masked_value = -INFINITY) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const RowMask<kNTiles> row_mask = make_row_mask<kNTiles, kTransposed>(params, mask, tile_code, b, row0 + 8 * half, col0);
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (!row_mask.allows(j, e)) s[4 * j + 2 * half + e] = masked_value;
  }
}

// The row-interval pass (the Hopper forward by default; FLASHATTN_CUDA_MASKS_ROW_INTERVALS=0 turns it off):
// the fast pass above for a listed partial tile whose code is a partial block id of a
// block mask *without bits* (document ids, band, prefix). There the allowed keys of a
// query row do not depend on the block (allowed_key_spans gives the same spans for every
// id >= 0) and are one interval for document-causal, sliding-window and prefix-LM rows
// (a prefix and a band apart, as a prefix with a window far from it, are two: such a row
// keeps the fast pass). So a kernel loads the row's inputs (prefix, document span) once
// per query tile and keeps one interval per row across its key loop (the Hopper forward:
// in shared memory, 8 bytes a row); a partial block then costs a few integer operations per row
// (RowKeyInterval::allowed_elements) and one bit test per element, instead of the loads,
// the 64-bit span arithmetic and the two span tests per element of make_row_mask. Masks
// with bits, tiles of code kFullBlock (partial by the interval rule or the sequence end)
// and kGeneralTile keep their passes.
struct RowKeyInterval {
  // Allowed keys [begin, end) of the row: absolute key columns in [0, seqlen_k]; empty
  // when end <= begin. begin = kNone: the row's keys are not one interval.
  static constexpr std::int32_t kNone = INT32_MIN;
  std::int32_t begin;
  std::int32_t end;

  // How many of the thread's columns c = 8 j + e (j < kNTiles, e < 2) of a block lie below
  // local column x (= key - n0 - 2 quad): the thread's columns increase with k = 2 j + e,
  // so those below x are the k < count.
  template <int kNTiles>
  static __device__ __forceinline__ std::uint32_t columns_below(std::int32_t x) {
    const std::int32_t rest = x & 7;  // x = 8 floor(x / 8) + rest, also for x < 0
    const std::int32_t count = 2 * (x >> 3) + (rest < 2 ? rest : 2);
    return static_cast<std::uint32_t>(count < 0 ? 0 : (count > 2 * kNTiles ? 2 * kNTiles : count));
  }
  // Bits 0 .. count - 1 set (count <= 32): one funnel shift, clamped at 32.
  static __device__ __forceinline__ std::uint32_t low_bits(std::uint32_t count) {
    return __funnelshift_lc(~0u, 0u, count);
  }
  // Bit k = 2 j + e is set iff the thread's element (j, e) of the block whose first column
  // for this thread is `thread_col0` (= n0 + 2 quad) is allowed.
  template <int kNTiles>
  __device__ __forceinline__ std::uint32_t allowed_elements(std::int32_t thread_col0) const {
    static_assert(2 * kNTiles <= 32, "one 32-bit word per fragment row");
    return low_bits(columns_below<kNTiles>(end - thread_col0)) & ~low_bits(columns_below<kNTiles>(begin - thread_col0));
  }
};

// The RowKeyInterval of query row `row` (any row: one past the end is denied) of batch b,
// for partial tiles of a block mask without bits (see above); begin = kNone when the row's
// allowed keys are two disjoint spans. Its loads (the prefix, the row's document span)
// are made once per query tile.
__device__ __forceinline__ RowKeyInterval row_key_interval(const AttentionParams& params, const MaskRule& mask,
                                                           std::int64_t b, std::int64_t row) {
  const DeviceMask& device_mask = params.device_mask;
  const ElementRule& rule = params.block_mask.rule;
  const std::int64_t prefix_length = rule.prefix_length(b);
  DocumentSpan documents;
  if (rule.maybe_q_document_ids != nullptr) {
    // Unsorted ids have no spans (their tiles are kGeneralTile): nothing to read.
    if (device_mask.maybe_document_key_spans == nullptr) return {RowKeyInterval::kNone, 0};
    const std::int64_t safe_row = row >= 0 && row < mask.seqlen_q ? row : 0;  // denied by allowed_key_spans
    const int2 span =
        reinterpret_cast<const int2*>(device_mask.maybe_document_key_spans)[b * device_mask.document_batch_stride_q + safe_row];
    documents = {span.x, span.y};
  }
  // Any partial id: without bits the spans do not depend on it.
  constexpr std::int32_t kAnyPartialId = 0;
  const AllowedSpans spans = allowed_key_spans(mask, rule, kAnyPartialId, row, prefix_length, documents);
  const OneInterval interval = one_interval_of(spans);
  if (!interval.is_one) return {RowKeyInterval::kNone, 0};
  // Inside [0, seqlen_k] already (allowed_key_spans); clamped so that 32 bits hold them.
  const std::int64_t begin = MaskRule::clamp(interval.begin, 0, mask.seqlen_k);
  const std::int64_t end = MaskRule::clamp(interval.end, begin, mask.seqlen_k);
  return {static_cast<std::int32_t>(begin), static_cast<std::int32_t>(end)};
}

// The row-interval pass of a 16 x 8·kNTiles fragment (layout as apply_fragment_mask) of
// the block starting at key n0, from its two fragment rows' intervals (neither kNone).
template <int kNTiles>
__device__ __forceinline__ void apply_row_key_intervals(float (&s)[4 * kNTiles], const RowKeyInterval (&rows)[2],
                                                        std::int32_t n0, float masked_value = -INFINITY) {
  const std::int32_t thread_col0 = n0 + 2 * static_cast<std::int32_t>(threadIdx.x % 4);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const std::uint32_t allowed = rows[half].allowed_elements<kNTiles>(thread_col0);
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (((allowed >> (2 * j + e)) & 1u) == 0) s[4 * j + 2 * half + e] = masked_value;
  }
}

// The key-interval pass (the Hopper backward by default; FLASHATTN_CUDA_MASKS_BWD_ROW_INTERVALS=0 off):
// the row-interval pass transposed, for a dK/dV kernel whose fragment rows are keys. A
// key's allowed queries in a partial block of a block mask without bits are always one
// interval (key_query_interval, mask_tables.hpp), and a CTA of such a kernel owns its
// key rows for its whole life: it makes each row's interval once (its loads: the prefix,
// the key's document span) and a partial query tile costs a few integer operations per
// row (RowKeyInterval::allowed_elements over the query columns) and one bit test per
// element. The interval as a RowKeyInterval whose columns are queries; never kNone (a
// key row past the end, or documents without spans — whose tiles are all kGeneralTile —
// get an empty one).
__device__ __forceinline__ RowKeyInterval key_row_query_interval(const AttentionParams& params, const MaskRule& mask,
                                                                 std::int64_t b, std::int64_t key) {
  const DeviceMask& device_mask = params.device_mask;
  const ElementRule& rule = params.block_mask.rule;
  const std::int64_t prefix_length = rule.prefix_length(b);
  DocumentSpan documents;
  if (rule.maybe_q_document_ids != nullptr) {
    if (device_mask.maybe_document_query_spans == nullptr) return {0, 0};
    const std::int64_t safe_key = key >= 0 && key < mask.seqlen_k ? key : 0;  // denied by allowed_query_spans
    const int2 span = reinterpret_cast<const int2*>(
        device_mask.maybe_document_query_spans)[b * device_mask.document_batch_stride_k + safe_key];
    documents = {span.x, span.y};
  }
  const OneInterval interval = flashattn::key_query_interval(mask, rule, key, prefix_length, documents);
  // Inside [0, seqlen_q] already (allowed_query_spans); clamped so that 32 bits hold them.
  const std::int64_t begin = MaskRule::clamp(interval.begin, 0, mask.seqlen_q);
  const std::int64_t end = MaskRule::clamp(interval.end, begin, mask.seqlen_q);
  return {static_cast<std::int32_t>(begin), static_cast<std::int32_t>(end)};
}

// Bits 2 j + e of a fragment row's element word (j < 8) moved to bits 4 j + e: the
// pairs of one row spread apart so that the other row's pairs fit between them
// (fragment_allowed_bits' element order 4 j + 2 half + e). Three steps of the Morton
// spread (the fourth would split the pairs).
__device__ __forceinline__ std::uint32_t spread_element_pairs(std::uint32_t pairs) {
  std::uint32_t x = pairs & 0xFFFFu;
  x = (x | (x << 8)) & 0x00FF00FFu;
  x = (x | (x << 4)) & 0x0F0F0F0Fu;
  x = (x | (x << 2)) & 0x33333333u;
  return x;
}

// The key-interval pass of a transposed 16 x 8·kNTiles fragment (rows = keys row0, row0
// + 8; columns = queries from col0) as fragment_allowed_bits' words, from its two rows'
// intervals: per row one allowed_elements, then the rows' words interleaved.
template <int kNTiles>
__device__ __forceinline__ void allowed_bits_of_key_intervals(std::uint32_t (&allowed)[kAllowedWords<kNTiles>],
                                                              const RowKeyInterval (&rows)[2], std::int32_t col0) {
  static_assert(kNTiles % 8 == 0, "whole words: 8 n8 tiles of both rows each");
  const std::int32_t thread_col0 = col0 + 2 * static_cast<std::int32_t>(threadIdx.x % 4);
  const std::uint32_t row_elements[2] = {rows[0].allowed_elements<kNTiles>(thread_col0),
                                         rows[1].allowed_elements<kNTiles>(thread_col0)};
#pragma unroll
  for (int w = 0; w < kAllowedWords<kNTiles>; ++w)
    allowed[w] = spread_element_pairs(row_elements[0] >> (16 * w)) | (spread_element_pairs(row_elements[1] >> (16 * w)) << 2);
}

// Calls f(index, query row, key column) for each element of a 16 x 8·kNTiles fragment.
template <int kNTiles, bool kTransposed, class F>
__device__ __forceinline__ void for_each_position(std::int64_t row0, std::int64_t col0, F&& f) {
  const int quad = static_cast<int>(threadIdx.x % 4);
#pragma unroll
  for (int j = 0; j < kNTiles; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const std::int64_t fragment_row = row0 + 8 * half;
        const std::int64_t fragment_col = col0 + 8 * j + 2 * quad + e;
        if constexpr (kTransposed) f(4 * j + 2 * half + e, fragment_col, fragment_row);
        else f(4 * j + 2 * half + e, fragment_row, fragment_col);
      }
}

// The element pass of a partial tile (see the header).
template <int kNTiles, bool kTransposed = false>
__device__ __forceinline__ void apply_mask(float (&s)[4 * kNTiles], const AttentionParams& params, const MaskRule& mask,
                                           std::int64_t b, std::int64_t h, std::int64_t row0, std::int64_t col0,
                                           float bias_factor) {
  for_each_position<kNTiles, kTransposed>(row0, col0, [&](int index, std::int64_t row, std::int64_t col) {
    const float offset = mask_offset(params, mask, b, h, row, col);
    s[index] = offset == -INFINITY ? -INFINITY : s[index] + offset * bias_factor;
  });
}

// apply_mask as a real call (not inlined), for kernels whose registers are full: inlined
// into the unrolled loop of the hdim-128 sm80 forward (a few 64-bit offsets and loads per
// element, 32 elements per call), the element pass raised ptxas' stack from 32 to 248
// bytes of spills; called, to 176, paid around the call on partial tiles. Keep the
// list-driven loop a separate instantiation either way: as a runtime branch of the
// interval kernel even the call cost 15% at d128 on H100 without masks. The fragment
// travels by value (a reference would put the caller's array in local memory). A tile
// code other than kGeneralTile takes the fast pass (apply_fragment_mask) inside the same
// call: a second call site for it raised the spills from 252 to 352 bytes.
template <int kNTiles>
struct ScoreFragment {
  float values[4 * kNTiles];
};
template <int kNTiles, bool kTransposed = false>
__device__ __noinline__ ScoreFragment<kNTiles> masked_fragment(ScoreFragment<kNTiles> s, const AttentionParams& params,
                                                               const MaskRule mask, std::int64_t b, std::int64_t h,
                                                               std::int64_t row0, std::int64_t col0, float bias_factor,
                                                               std::int32_t tile_code) {
  if (tile_code != kGeneralTile) apply_fragment_mask<kNTiles, kTransposed>(s.values, params, mask, tile_code, b, row0, col0);
  else apply_mask<kNTiles, kTransposed>(s.values, params, mask, b, h, row0, col0, bias_factor);
  return s;
}
template <int kNTiles, bool kTransposed = false>
__device__ __forceinline__ void apply_mask_outlined(float (&s)[4 * kNTiles], const AttentionParams& params,
                                                    const MaskRule& mask, std::int64_t b, std::int64_t h,
                                                    std::int64_t row0, std::int64_t col0, float bias_factor,
                                                    std::int32_t tile_code = kGeneralTile) {
  ScoreFragment<kNTiles> fragment;
#pragma unroll
  for (int i = 0; i < 4 * kNTiles; ++i) fragment.values[i] = s[i];
  fragment = masked_fragment<kNTiles, kTransposed>(fragment, params, mask, b, h, row0, col0, bias_factor, tile_code);
#pragma unroll
  for (int i = 0; i < 4 * kNTiles; ++i) s[i] = fragment.values[i];
}

// dBias += dS for each element inside the sequences (dS in natural-log units =
// ds[index] * ds_factor; masked elements have dS = 0 and are skipped, as are zeros).
template <int kNTiles, bool kTransposed = false>
__device__ __forceinline__ void accumulate_dbias(const float (&ds)[4 * kNTiles], const AttentionParams& params,
                                                 const MaskRule& mask, std::int64_t b, std::int64_t h,
                                                 std::int64_t row0, std::int64_t col0, float ds_factor) {
  const DeviceMask& device_mask = params.device_mask;
  for_each_position<kNTiles, kTransposed>(row0, col0, [&](int index, std::int64_t row, std::int64_t col) {
    const float value = ds[index] * ds_factor;
    if (row < mask.seqlen_q && col < mask.seqlen_k && value != 0.0f)
      atomicAdd(device_mask.maybe_dbias_sum + device_mask.dbias_offset(b, h, row, col), value);
  });
}

}  // namespace flashattn::cuda::fragment
