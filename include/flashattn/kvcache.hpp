// flashattn/kvcache.hpp — attention over a KV cache for autoregressive decoding
// (seed 002), with flash_attn 2.x `flash_attn_with_kvcache` semantics.
//
// Each decoding step attends the new query tokens to every cached key/value of
// their sequence, optionally appending the step's new keys/values to the cache
// first (in place). Decoding reads the whole cache once per step, so it is bound
// by memory bandwidth; the CUDA backend splits the key range over CTAs
// ("flash-decoding") and merges the partial results with the online-softmax merge
// of flashattn/online_softmax.hpp.
//
// Layouts (the last dimension contiguous, other strides arbitrary):
//   q          [batch, seqlen_q, heads_q, head_dim]
//   cache, contiguous: k_cache/v_cache [batch_cache, seqlen_cache, heads_kv, head_dim];
//              sequence b lives in cache row maybe_cache_batch_idx[b] (default b;
//              batch_cache >= max index + 1). Capacity per sequence: seqlen_cache.
//   cache, paged (maybe_block_table given): k_cache/v_cache [num_blocks, page_size,
//              heads_kv, head_dim], block_table int32 [batch, max_blocks_per_seq];
//              cache position p of sequence b is row p % page_size of block
//              block_table[b][p / page_size]. page_size: a multiple of 16 in [16, 256]
//              (flash_attn needs multiples of 256). Capacity: max_blocks_per_seq * page_size.
//              Not combined with maybe_cache_batch_idx.
//   k_new/v_new [batch, seqlen_new, heads_kv, head_dim] (optional, together).
//   out        like q;  maybe_lse float32 [batch, heads_q, seqlen_q] (natural log).
//
// Semantics, step by step (b = sequence, L_b = cache_seqlens[b], pad_b = cache_leftpad[b]):
//  1. Append (k_new/v_new given): cache positions L_b .. L_b + seqlen_new - 1 of
//     sequence b receive k_new[b], v_new[b] (k_new rotated, see 3); nothing else in
//     the cache is written. Requires cache_seqlens and L_b + seqlen_new <= capacity.
//     Duplicate cache_batch_idx entries with an append: which write wins is unspecified.
//  2. Attend: the keys of sequence b are cache positions [pad_b, L_b + seqlen_new)
//     (seqlen_new = 0 without an append), so seqlen_k(b) = L_b + seqlen_new - pad_b.
//     Without cache_seqlens every sequence uses the whole capacity. Causal and the
//     window are aligned bottom-right on (seqlen_q, seqlen_k(b)): query row i is at
//     key column i + seqlen_k(b) - seqlen_q (see flashattn/mask.hpp). GQA/MQA: query
//     head h reads kv head h / (heads_q / heads_kv). A sequence with no keys gives
//     output 0 and LSE -inf.
//  3. Rotary (maybe_rotary_cos/sin [seqlen_ro, rotary_dim / 2], same dtype as q,
//     needs k_new/v_new; rotary_dim even and <= head_dim; seqlen_ro >= capacity):
//     applied to the first rotary_dim features of k_new row j at position L_b + j,
//     and of q row i at position L_b + i when causal or windowed, else at position
//     L_b for every row (all queries considered at the same position) — flash_attn's
//     convention. Interleaved (GPT-J): pairs (2t, 2t+1); otherwise (GPT-NeoX): pairs
//     (t, t + rotary_dim/2); each pair with angle cos/sin[position][t]:
//       x1' = x1 cos - x2 sin,  x2' = x1 sin + x2 cos.
//     The rotation is computed in float32 and rounded to the input dtype.
//  4. Split-KV: num_splits = 0 picks a split count with the heuristic of
//     src/core/split_heuristic.hpp; 1 does not split; n > 1 splits each sequence's
//     key range into n chunks (results equal up to rounding for every n). The CPU
//     backend honours it too (same merge), so the CPU is an oracle for every split.
//
// Scratch: with more than one split the CUDA backend needs a workspace of
// kvcache_workspace_bytes(args) bytes (uint8, on q's device) in maybe_workspace;
// nothing is allocated by the library. The CPU needs none. With exactly two splits
// on sm_90 the two partial results merge inside a thread-block cluster and the
// workspace goes unused; the size query still counts it: the size is a function of
// the split count alone, not of how a given GPU merges the splits.
//
// Validation: every argument is checked before anything is written (the cache is an
// output when appending). Block-table entries, cache_batch_idx, cache_leftpad and
// cache_seqlens are range-checked on the host when they live in host memory (CPU
// tensors, or the uniform cache_seqlen). A paged cache with device-resident
// cache_seqlens is checked on the host too in eager mode (capacity and the block ids
// each sequence touches: one stream-ordered device-to-host read); inside CUDA-graph
// capture the decode kernels clamp a block id outside the page pool into it (wrong
// values, never an access outside k_cache/v_cache) and the append skips such pages.
// Other device-resident indices are the caller's contract, as in flash_attn. ALiBi is
// not supported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "flashattn/attention.hpp"
#include "flashattn/tensor.hpp"

namespace flashattn {

struct KVCacheArgs {
  TensorView q;        // [batch, seqlen_q, heads_q, head_dim]
  TensorView k_cache;  // contiguous [batch_cache, seqlen_cache, heads_kv, head_dim] or paged [num_blocks, page_size, heads_kv, head_dim]
  TensorView v_cache;  // like k_cache
  TensorView maybe_k_new;  // [batch, seqlen_new, heads_kv, head_dim], appended in place
  TensorView maybe_v_new;  // like maybe_k_new
  // Sequence lengths already in the cache: an int32 [batch] tensor, or one value for
  // all sequences. Neither: every sequence fills the whole capacity (no append then).
  TensorView maybe_cache_seqlens;
  std::optional<std::int64_t> maybe_uniform_cache_seqlen;
  TensorView maybe_cache_batch_idx;  // int32 [batch], contiguous caches only
  TensorView maybe_cache_leftpad;    // int32 [batch]: first valid cache position per sequence
  TensorView maybe_block_table;      // int32 [batch, max_blocks_per_seq]: paged cache
  TensorView maybe_rotary_cos;       // [seqlen_ro, rotary_dim / 2], dtype of q
  TensorView maybe_rotary_sin;       // like maybe_rotary_cos
  bool rotary_interleaved = true;
  TensorView out;        // like q, written
  TensorView maybe_lse;  // float32 [batch, heads_q, seqlen_q], written
  int num_splits = 0;    // 0 = heuristic, else 1..kMaxKVCacheSplits
  TensorView maybe_workspace;  // uint8, >= kvcache_workspace_bytes(args) bytes (CUDA, num_splits != 1)
  // FP8 cache: k_cache/v_cache (and k_new/v_new when appending, or those in q's dtype,
  // quantised with the descale on append) in float8_e4m3 with q in float16/bfloat16;
  // options.maybe_k_descale / maybe_v_descale ([batch, heads_kv] float32, zero strides
  // allowed, a size-1 dimension broadcasts; absent = 1) dequantise them: key =
  // k_descale * stored. options.maybe_q_descale is refused (q stays 16-bit).
  // Quantisation of an appended row in q's dtype (after the rotary, rounded to q's dtype
  // as a 16-bit cache would hold it): stored = e4m3(x / descale), the division in
  // float32, then round to nearest even, saturating at +-448 (NaN -> 0x7f): PTX
  // cvt.rn.satfinite (vLLM's FP8 cache writes); PyTorch's cast gives NaN past 464
  // instead (src/core/float8.hpp). e4m3 rows are copied (no rotary then).
  // CUDA: head_dim a multiple of 16, cache rows 16-byte aligned (strides in bytes).
  AttentionOptions options;    // softmax_scale, causal, window, softcap (dropout/deterministic unused)
};

inline constexpr int kMaxKVCacheSplits = 128;

void forward_with_kvcache(const KVCacheArgs& args, const ExecutionContext& context = {});

// Scratch bytes forward_with_kvcache needs for these arguments (0 on the CPU, and
// 0 when the chosen split count is 1). maybe_workspace is ignored.
std::size_t kvcache_workspace_bytes(const KVCacheArgs& args);

// The split count forward_with_kvcache will use for these arguments (resolves 0).
int kvcache_num_splits(const KVCacheArgs& args);

}  // namespace flashattn
