// src/cpu/backend.cpp — the CPU backend's entry points: limits, algorithm choice,
// the run-time choice of the vector kernels, and merge_attention_states.
#include <cstring>
#include <string>
#include <vector>

#include "flashattn/error.hpp"
#include "flashattn/online_softmax.hpp"
#include "src/core/backend.hpp"
#include "src/core/dense_mask_blocks.hpp"
#include "src/core/numeric.hpp"
#include "src/cpu/flash.hpp"
#include "src/cpu/kernels.hpp"
#include "src/cpu/reference.hpp"

namespace flashattn::cpu {

BackendLimits limits() noexcept {
  // head_dim is bounded only to keep per-thread tiles small; the kernels are generic.
  // FP8 inputs are dequantised to float32 (fp8_forward.cpp): every feature applies.
  return BackendLimits{"cpu", 1024, 1, true, true, {true, true, true, true}, true, true};
}

const TileKernels& tile_kernels() {
#if defined(__x86_64__) || defined(_M_X64)
  // Decided once: the widest vector ISA this CPU has (and the kernels were built for).
  static const TileKernels& chosen = [] () -> const TileKernels& {
    __builtin_cpu_init();
    // Both x86 tables also use F16C (every AVX2 CPU has it; checked all the same).
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c")) return tile_kernels_avx512();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return tile_kernels_avx2();
    return tile_kernels_baseline();
  }();
  return chosen;
#else
  return tile_kernels_baseline();
#endif
}

namespace {
// Validation admits only these for attention tensors; checked again here, before any
// parallel region (an exception cannot leave one), because tile_io.hpp relies on it.
void require_float_dtype(DType dtype, const char* pass) {
  if (dtype != DType::float32 && dtype != DType::float16 && dtype != DType::bfloat16)
    throw NotSupported(std::string("flashattn: cpu ") + pass + ": dtype " + dtype_name(dtype) + " is not float32, float16 or bfloat16");
}
// Paged K/V: the keys and values of every sequence copied out of the page pools into
// packed varlen buffers (row cu_seqlens_k[b] + j = key j of sequence b), so every
// algorithm runs unchanged on them. Validation range-checked the pages (host table).
struct PackedKV {
  std::vector<unsigned char> k, v;
  AttentionParams params;
};

PackedKV gather_paged_kv(const AttentionParams& paged) {
  PackedKV packed;
  packed.params = paged;
  AttentionParams& p = packed.params;
  const auto element = static_cast<std::int64_t>(dtype_size(paged.dtype));
  const std::int64_t row_elements = paged.heads_kv * paged.head_dim;
  const auto bytes = static_cast<std::size_t>(paged.total_k * row_elements * element);
  packed.k.resize(bytes);
  packed.v.resize(bytes);
  const auto* k_pool = static_cast<const unsigned char*>(paged.k);
  const auto* v_pool = static_cast<const unsigned char*>(paged.v);
  for (std::int64_t b = 0; b < paged.batch; ++b)
    for (std::int64_t j = 0; j < paged.seqlen_k_of(b); ++j) {
      const std::int64_t block = paged.page_block(b, j / paged.page_size);
      const std::int64_t in_page = j % paged.page_size;
      const std::int64_t row = paged.k_start(b) + j;
      for (std::int64_t h = 0; h < paged.heads_kv; ++h) {
        const std::int64_t dst = (row * row_elements + h * paged.head_dim) * element;
        const std::int64_t k_src = block * paged.k_batch_stride + in_page * paged.k_row_stride + h * paged.k_head_stride;
        const std::int64_t v_src = block * paged.v_batch_stride + in_page * paged.v_row_stride + h * paged.v_head_stride;
        std::memcpy(packed.k.data() + dst, k_pool + k_src * element, static_cast<std::size_t>(paged.head_dim * element));
        std::memcpy(packed.v.data() + dst, v_pool + v_src * element, static_cast<std::size_t>(paged.head_dim * element));
      }
    }
  p.k = packed.k.data();
  p.v = packed.v.data();
  p.k_batch_stride = p.v_batch_stride = 0;
  p.k_row_stride = p.v_row_stride = row_elements;
  p.k_head_stride = p.v_head_stride = paged.head_dim;
  p.maybe_block_table = nullptr;
  return packed;
}

// Unless FLASHATTN_DENSE_MASK=elements (src/core/dense_mask_blocks.hpp): the flash paths run a
// dense boolean attn_mask as its block form, so they skip its empty blocks (no Q·K^T
// there) and test elements in its partial blocks only; the results are equal. The
// reference keeps reading the dense mask (the oracle).
bool runs_dense_mask_as_blocks(const AttentionParams& params, Algorithm algorithm) {
  return algorithm != Algorithm::reference && is_dense_mask_convertible(params) && is_dense_mask_conversion_requested();
}
// params with its dense mask replaced by the block form held in `storage`.
template <class Params>
Params with_block_form(const Params& params, DenseBlockMask& storage, int num_threads) {
  build_dense_block_mask(params, kCpuDenseMaskBlock, kCpuDenseMaskBlock, storage, num_threads);
  Params converted = params;
  converted.block_mask = storage.view();
  converted.maybe_attn_mask = nullptr;
  return converted;
}

}  // namespace

void forward(const AttentionParams& params, Algorithm algorithm, int num_threads) {
  require_float_dtype(params.dtype, "forward");
  if (params.is_fp8()) {
    fp8_forward(params, algorithm, num_threads);
    return;
  }
  if (params.is_paged()) {
    const PackedKV packed = gather_paged_kv(params);
    forward(packed.params, algorithm, num_threads);
    return;
  }
  if (runs_dense_mask_as_blocks(params, algorithm)) {
    DenseBlockMask blocks;
    forward(with_block_form(params, blocks, num_threads), algorithm, num_threads);
    return;
  }
  switch (algorithm) {
    case Algorithm::automatic:
    case Algorithm::flash2: flash2_forward(params, num_threads); return;
    case Algorithm::flash1: flash1_forward(params, num_threads); return;
    case Algorithm::reference: reference_forward_into(params); return;
    case Algorithm::flash3: break;  // the Hopper kernels' algorithm: refused below
  }
  throw NotSupported(std::string("flashattn: cpu forward: no CPU implementation of algorithm ") + algorithm_name(algorithm));
}

void backward(const BackwardParams& params, Algorithm algorithm, int num_threads) {
  require_float_dtype(params.dtype, "backward");
  if (runs_dense_mask_as_blocks(params, algorithm)) {
    DenseBlockMask blocks;
    backward(with_block_form(params, blocks, num_threads), algorithm, num_threads);
    return;
  }
  switch (algorithm) {
    case Algorithm::automatic:
    case Algorithm::flash2:
    case Algorithm::flash1: flash_backward(params, num_threads); return;  // one flash backward serves both forwards
    case Algorithm::reference: reference_backward_into(params); return;
    case Algorithm::flash3: break;  // the Hopper kernels' algorithm: refused below
  }
  throw NotSupported(std::string("flashattn: cpu backward: no CPU implementation of algorithm ") + algorithm_name(algorithm));
}

void merge_attention_states(const MergeParams& p) {
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads; ++h)
      for (std::int64_t s = 0; s < p.seqlen; ++s) {
        auto lse_index = [&](int which) {
          return b * p.lse_strides[which][0] + h * p.lse_strides[which][1] + s * p.lse_strides[which][2];
        };
        auto out_index = [&](int which) {
          return b * p.out_strides[which][0] + s * p.out_strides[which][1] + h * p.out_strides[which][2];
        };
        const auto w = online_softmax::merge_weights(p.lse_a[lse_index(0)], p.lse_b[lse_index(1)]);
        const std::int64_t ia = out_index(0), ib = out_index(1), io = out_index(2);
        for (std::int64_t d = 0; d < p.head_dim; ++d) {
          const float a = numeric::load_as_float(p.out_a, p.dtype, ia + d);
          const float c = numeric::load_as_float(p.out_b, p.dtype, ib + d);
          // An empty part may hold anything (even NaN); a zero weight must not let it through.
          const float value = (w.weight_a > 0.0f ? w.weight_a * a : 0.0f) + (w.weight_b > 0.0f ? w.weight_b * c : 0.0f);
          numeric::store_from_float(p.out, p.dtype, io + d, value);
        }
        p.lse[lse_index(2)] = w.lse;
      }
}

}  // namespace flashattn::cpu
