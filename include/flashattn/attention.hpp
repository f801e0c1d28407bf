// flashattn/attention.hpp — the public attention entry points.
//
// Layout is flash_attn's: q [batch, seqlen_q, heads_q, head_dim], k/v
// [batch, seqlen_k, heads_kv, head_dim], out like q, LSE [batch, heads_q, seqlen_q]
// (float32, natural log). Variable-length batches pack the sequences along one
// axis instead: q [total_q, heads_q, head_dim] with cu_seqlens_q (int32, batch+1
// prefix sums), LSE [heads_q, total_q].
//
// Every argument is checked before anything is written: on bad input a
// flashattn::Error names the argument and all outputs stay bitwise unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "flashattn/tensor.hpp"

namespace flashattn {

// Which algorithm computes the attention. automatic = the fastest for the device.
//   reference: the standard three steps (S = QK^T, P = softmax(S), O = PV) with S
//              and P materialised, accumulated in float64 — the oracle (CPU only).
//   flash2:    FlashAttention-2: Q blocks outer, K/V blocks inner, delayed normalisation.
//   flash1:    FlashAttention-1 (Algorithm 1): K/V blocks outer, O/l/m rescaled every step.
//   flash3:    FlashAttention-3: the flash2 algorithm mapped onto Hopper (sm_90a):
//              TMA loads, wgmma, warp-specialised producer/consumer warpgroups.
//              CUDA only, on devices of compute capability 9.0; where the problem is
//              not covered, the call throws NotSupported saying why (automatic then
//              runs flash2).
// The CUDA backward pass has one kernel family (recomputation from the saved LSE), so
// flash2 and flash3 name the same backward there; the options struct is shared by both
// passes and a forward's algorithm never has to be changed for its backward.
enum class Algorithm : std::uint8_t { automatic, reference, flash2, flash1, flash3 };
inline constexpr int kAlgorithmCount = 5;

const char* algorithm_name(Algorithm algorithm) noexcept;

// A block-sparse mask (flashattn/block_mask.hpp): FlexAttention's BlockMask lists
// (int32, batch and head dimensions of size 1 broadcast, any strides) and the
// element rule of its partial blocks. The rule is a conjunction of the band
// (causal/window, aligned by diagonal_offset: 0 = top-left as in PyTorch), prefix-LM
// lengths, document ids and a bit mask of the partial blocks; with no term enabled,
// partial blocks are fully allowed. Block sizes: powers of two in [16, 1024].
struct BlockMaskArgs {
  std::int64_t block_size_q = 128;
  std::int64_t block_size_kv = 128;
  TensorView kv_num_blocks;             // int32 [B|1, H|1, ceil(seqlen_q / block_size_q)]: partial key blocks
  TensorView kv_indices;                // int32 [B|1, H|1, q_blocks, capacity >= 1]
  TensorView maybe_full_kv_num_blocks;  // full key blocks (no element rule), like kv_num_blocks
  TensorView maybe_full_kv_indices;
  TensorView maybe_q_num_blocks;        // the transposed lists for the backward: [B|1, H|1, kv_blocks]
  TensorView maybe_q_indices;           //   [B|1, H|1, kv_blocks, capacity]
  TensorView maybe_full_q_num_blocks;
  TensorView maybe_full_q_indices;
  // The element rule of partial blocks.
  bool has_band = false;
  std::int64_t diagonal_offset = 0;  // row i's diagonal is column i + diagonal_offset
  std::int64_t window_left = -1;     // -1 = unbounded
  std::int64_t window_right = -1;    // -1 = unbounded; 0 = causal
  TensorView maybe_prefix_lengths;   // int32 [batch]: prefix-LM, columns < length visible to every row
  TensorView maybe_q_document_ids;   // int32 [B|1, seqlen_q]: rows see only columns of their document
  TensorView maybe_k_document_ids;   // int32 [B|1, seqlen_k]
  TensorView maybe_partial_bits;     // int32 [partial blocks, block_size_q, ceil(block_size_kv / 32)]
  TensorView maybe_partial_ids;      // int32 like kv_indices: each partial entry's block in partial_bits
  TensorView maybe_q_partial_ids;    // int32 like q_indices (for the GPU backward)
};

// Options shared by the forward and the backward pass.
struct AttentionOptions {
  // Default 1/sqrt(head_dim). softmax_scale and softcap are used as float32 times log2(e):
  // each must be in [FLT_MIN, FLT_MAX / log2(e)] (softcap may also be 0 = off).
  std::optional<double> softmax_scale;
  // Causal masking aligned to the bottom-right corner: query row i sees key
  // column j iff j <= i + seqlen_k - seqlen_q (FlashAttention >= 2.1). With
  // seqlen_q > seqlen_k the first rows see nothing: their output is 0, LSE -inf.
  bool causal = false;
  // Sliding window, bottom-right aligned like causal: row i sees columns
  // [i + seqlen_k - seqlen_q - window_left, i + seqlen_k - seqlen_q + window_right].
  // -1 = unbounded on that side; a window at least as wide as the sequences is the
  // same as -1. causal is window_right = 0: causal with a window keeps window_left and
  // uses window_right = 0 whatever is given (flash_attn's rule).
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  // Logit soft-capping: s -> softcap * tanh(s / softcap) applied to scale*q.k. 0 = off.
  double softcap = 0.0;
  // ALiBi (flash_attn's): float32 slopes [heads_q] or [batch, heads_q] on q's device;
  // the score of row i, column j gets -slope * |i + seqlen_k - seqlen_q - j| after the
  // softcap (flashattn/score.hpp). Undefined = no bias.
  TensorView maybe_alibi_slopes;
  // Dropout on the attention probabilities (flashattn/dropout.hpp): each probability is
  // kept with probability 1 - dropout_p and scaled by 1 / (1 - dropout_p); the LSE is
  // unaffected. The mask is a function of (seed, offset, batch, head, row, column)
  // only: the same on every backend and kernel, and regenerated by the backward pass,
  // which must be given the forward's dropout_p, seed and offset. The seed and offset
  // come from dropout_seed/dropout_offset or, when maybe_dropout_seed_offset is given
  // (int64 [2] = {seed, offset} on q's device), from that tensor at run time, so a
  // captured CUDA graph can draw a fresh mask on each replay.
  double dropout_p = 0.0;  // in [0, 1)
  std::uint64_t dropout_seed = 0;
  std::uint64_t dropout_offset = 0;
  TensorView maybe_dropout_seed_offset;
  // FP8 inputs (forward only): q, k and v in float8_e4m3 with float32 descale factors
  // (FA3's q_descale, k_descale, v_descale), each [batch, heads_kv] (any strides, 0
  // included, so one value per tensor is a zero-stride view); undefined = 1. The
  // scores are (q_descale * k_descale) * q.k and the output v_descale * P V; out is
  // bfloat16 or float16 (its own dtype). The backward pass refuses FP8.
  TensorView maybe_q_descale;
  TensorView maybe_k_descale;
  TensorView maybe_v_descale;
  // A dense mask, PyTorch's attn_mask: [B|1, H|1, seqlen_q|1, seqlen_k|1] (size-1
  // dimensions broadcast, any strides, zero included; never expanded in memory).
  // bool (or uint8): true = take part; float (q's dtype or float32): an additive bias
  // on the score, after the softcap and ALiBi (-inf = masked). Combined with every
  // other mask (causal, window, block mask) as a conjunction. A row that sees no key
  // gets output 0, LSE -inf and zero gradients. Not with varlen.
  TensorView maybe_attn_mask;
  // A block-sparse mask (see BlockMaskArgs); the kernels visit only its listed blocks.
  std::optional<BlockMaskArgs> maybe_block_mask;
  // Backward only: bitwise-reproducible gradients (may be slower on the GPU). On the
  // CUDA backend the Hopper kernels (sm_90, head dim 64/128/256) add the dQ tiles of each
  // query block in a fixed key-block order (semaphores in the workspace); elsewhere a
  // separate dQ kernel computes dQ without atomics. The workspace size of a
  // deterministic call covers both, whichever GPU runs it.
  bool deterministic = false;
  Algorithm algorithm = Algorithm::automatic;
};

// Optional variable-length description (the first four set together, or none).
struct VarlenArgs {
  TensorView cu_seqlens_q;  // int32 [batch + 1], cu_seqlens_q[0] == 0, non-decreasing
  TensorView cu_seqlens_k;  // int32 [batch + 1]
  std::int64_t max_seqlen_q = 0;
  std::int64_t max_seqlen_k = 0;
  // Paged K/V (prefill over a paged KV cache; forward only, as flash_attn's
  // flash_attn_varlen_func(..., block_table=)): k/v are page pools [num_blocks,
  // page_size, heads_kv, head_dim] (any page_size >= 1, so every page size
  // forward_with_kvcache accepts) and block_table is int32 [batch, max_blocks_per_seq]
  // with contiguous rows: key j of sequence b is row j % page_size of page
  // block_table[b][j / page_size]. Sequence b has cu_seqlens_k[b + 1] - cu_seqlens_k[b]
  // keys; max_seqlen_k <= max_blocks_per_seq * page_size. On the CPU the block ids each
  // sequence touches are range-checked; on the GPU a device-resident table is the
  // caller's contract and an id outside the pool is clamped into it (wrong values,
  // never an access outside k/v). The keys are gathered into packed scratch first
  // (CUDA: stream-ordered cudaMallocAsync, freed on the stream).
  TensorView maybe_block_table;
};

struct ForwardArgs {
  TensorView q;          // [batch, seqlen_q, heads_q, head_dim] (varlen: [total_q, heads_q, head_dim])
  TensorView k;          // [batch, seqlen_k, heads_kv, head_dim]
  TensorView v;          // like k
  TensorView out;        // like q, written
  TensorView maybe_lse;  // float32 [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]), written
  std::optional<VarlenArgs> maybe_varlen;
  AttentionOptions options;
};

struct BackwardArgs {
  TensorView q, k, v;
  TensorView out;         // the forward output O
  TensorView dout;        // dL/dO, like out (any strides)
  TensorView lse;         // the forward LSE, required
  TensorView dq, dk, dv;  // written; dk/dv have k's shape (GQA: summed over each group's query heads)
  std::optional<VarlenArgs> maybe_varlen;
  TensorView maybe_workspace;  // uint8, at least backward_workspace_bytes(args) bytes
  // dL/d(attn_mask) for a float attn_mask: its shape and dtype (any strides), written
  // with dS summed over the broadcast dimensions. Undefined = not computed.
  TensorView maybe_dbias;
  AttentionOptions options;
};

// Where and how to run. `stream` is a cudaStream_t for CUDA tensors (nullptr = the
// default stream); `num_threads` bounds CPU threads (0 = all hardware threads, at most 1024).
struct ExecutionContext {
  void* stream = nullptr;
  int num_threads = 0;
};

void forward(const ForwardArgs& args, const ExecutionContext& context = {});
void backward(const BackwardArgs& args, const ExecutionContext& context = {});

// Scratch bytes the backward pass needs for these arguments on their device
// (0 on the CPU, which allocates O(block) per thread itself).
std::size_t backward_workspace_bytes(const BackwardArgs& args);

// Same checks as forward(), nothing run: empty if supported, else the reason.
std::string why_unsupported(const ForwardArgs& args);

// Combine two attentions of the same queries over disjoint key sets (e.g. the two
// halves of a split KV): out = w_a * out_a + w_b * out_b with weights from the
// LSEs, lse = log(exp(lse_a) + exp(lse_b)). Outputs [batch, seqlen, heads, head_dim],
// LSEs float32 [batch, heads, seqlen]. out/lse may alias out_a/lse_a (in-place).
void merge_attention_states(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                            const TensorView& lse_b, const TensorView& out, const TensorView& lse,
                            const ExecutionContext& context = {});

// Whether this build has the CUDA backend and a usable GPU is present.
bool cuda_available() noexcept;

}  // namespace flashattn
