// bench/gpu/ladder/fa1_attention.cu — see fa1_attention.hpp.
//
// Fixing the minimal kernel for Br != Bc. The minimal kernel of seed 000
//   - launches Bc threads and lets thread tx own query row tx, so with Br > Bc rows
//     Bc..Br-1 of each Q block are never computed, and with Br < Bc threads read
//     past the block;
//   - addresses the Q and O blocks with tile_size * i where tile_size = Bc * d, but
//     l and m with Br * i, so Q/O block i starts at row Bc*i while l/m block i
//     starts at row Br*i;
//   - sizes the shared Q tile as Bc * d and loads K/V with one row per thread;
//   - has no tail handling (N must be a multiple of both block sizes);
//   - computes exp(m_prev - m_new) = exp(-inf - -inf) = NaN for a row whose block
//     is fully masked.
// Here each tile kind has its own extent: a Q block is Br rows and owns Br threads
// (one query row each, the row's Q in registers), a K/V block is Bc rows loaded
// cooperatively by all Br threads in a strided loop (so any Bc works), rows and
// columns past the sequence end are predicated off, and the rescaling goes through
// flashattn::online_softmax (the one rule, -inf safe) in the log2 domain.
#include "bench/gpu/ladder/fa1_attention.hpp"

#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "bench/gpu/ladder/cuda_check.hpp"
#include "bench/gpu/ladder/element.cuh"
#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"

namespace ladder {
namespace {

namespace osm = flashattn::online_softmax;

constexpr int kElementsPerVector = 8;  // 16-byte loads of 16-bit elements

// Loads kCount contiguous 16-bit elements (16-byte aligned) as floats.
template <class Element, int kCount>
__device__ __forceinline__ void load_as_float(const Element* source, float* destination) {
  static_assert(kCount % kElementsPerVector == 0);
#pragma unroll
  for (int v = 0; v < kCount / kElementsPerVector; ++v) {
    const uint4 packed = reinterpret_cast<const uint4*>(source)[v];
    const Element* elements = reinterpret_cast<const Element*>(&packed);
#pragma unroll
    for (int e = 0; e < kElementsPerVector; ++e) destination[v * kElementsPerVector + e] = to_float(elements[e]);
  }
}

template <class Element, int kHeadDim, int kBlockM, int kBlockN>
__global__ void __launch_bounds__(kBlockM)
    fa1_forward_kernel(flashattn::AttentionParams params, float* out_accumulator /* (B, H, Nq, d) */,
                       float* row_max /* (B, H, Nq) */, float* row_sum /* (B, H, Nq) */) {
  __shared__ __align__(16) float k_tile[kBlockN][kHeadDim];  // (kBlockN, kHeadDim) K_j
  __shared__ __align__(16) float v_tile[kBlockN][kHeadDim];  // (kBlockN, kHeadDim) V_j

  const std::int64_t head = blockIdx.x;
  const std::int64_t batch = blockIdx.y;
  const std::int64_t seqlen_q = params.seqlen_q;
  const std::int64_t seqlen_k = params.seqlen_k;
  const flashattn::MaskRule mask = params.mask_of(batch);
  const auto* q = static_cast<const Element*>(params.q) + params.q_offset(batch, head);
  const auto* k = static_cast<const Element*>(params.k) + params.k_offset(batch, head);
  const auto* v = static_cast<const Element*>(params.v) + params.v_offset(batch, head);
  const std::int64_t stats_offset = (batch * params.heads_q + head) * seqlen_q;
  float* o = out_accumulator + stats_offset * kHeadDim;  // (Nq, kHeadDim)
  float* m = row_max + stats_offset;                     // (Nq)
  float* l = row_sum + stats_offset;                     // (Nq)

  // Line 5: for each K/V block j (outer loop).
  for (std::int64_t key_begin = 0; key_begin < seqlen_k; key_begin += kBlockN) {
    // Line 6: load K_j, V_j from HBM to SRAM, all threads, zero past the end.
    constexpr int kVectorsPerRow = kHeadDim / kElementsPerVector;
    for (int index = threadIdx.x; index < kBlockN * kVectorsPerRow; index += kBlockM) {
      const int row = index / kVectorsPerRow;
      const int column = (index % kVectorsPerRow) * kElementsPerVector;
      const std::int64_t key = key_begin + row;
      if (key < seqlen_k) {
        load_as_float<Element, kElementsPerVector>(k + key * params.k_row_stride + column, &k_tile[row][column]);
        load_as_float<Element, kElementsPerVector>(v + key * params.v_row_stride + column, &v_tile[row][column]);
      } else {
        for (int e = 0; e < kElementsPerVector; ++e) k_tile[row][column + e] = v_tile[row][column + e] = 0.0f;
      }
    }
    __syncthreads();

    // Line 7: for each Q block i (inner loop). Blocks that see none of K_j's
    // columns (causal/window) are skipped; the decision is uniform over the CTA.
    for (std::int64_t query_begin = 0; query_begin < seqlen_q; query_begin += kBlockM) {
      const std::int64_t query_end = query_begin + kBlockM < seqlen_q ? query_begin + kBlockM : seqlen_q;
      const flashattn::MaskRule::ColumnRange visible = mask.columns_of_rows(query_begin, query_end);
      if (visible.end <= key_begin || visible.begin >= key_begin + kBlockN) continue;
      const std::int64_t query = query_begin + threadIdx.x;
      if (query >= seqlen_q) continue;

      // Line 8: load Q_i (this thread's row) and O_i, l_i, m_i from HBM.
      float q_row[kHeadDim];  // (kHeadDim)
      load_as_float<Element, kHeadDim>(q + query * params.q_row_stride, q_row);

      // Lines 9-10: S_ij = Q_i K_j^T (log2 units), m~ = rowmax, P~ = exp2(S - m~), l~ = rowsum.
      float p[kBlockN];  // (kBlockN) scores, then probabilities
      float block_max = osm::negative_infinity<float>();
#pragma unroll
      for (int y = 0; y < kBlockN; ++y) {
        float dot = 0.0f;
#pragma unroll
        for (int x = 0; x < kHeadDim; ++x) dot += q_row[x] * k_tile[y][x];
        p[y] = mask.allowed(query, key_begin + y) ? dot * params.softmax_scale_log2 : osm::negative_infinity<float>();
        block_max = fmaxf(block_max, p[y]);
      }
      osm::State<float> block;
      block.raise_max(block_max);
      const float base = block.base();
      float block_sum = 0.0f;
#pragma unroll
      for (int y = 0; y < kBlockN; ++y) {
        p[y] = exp2f(p[y] - base);
        block_sum += p[y];
      }
      block.add(block_sum);

      // Line 11: m_new = max(m_i, m~), l_new = e^(m_i - m_new) l_i + e^(m~ - m_new) l~.
      const osm::State<float> previous{m[query], l[query]};
      float previous_factor = 0.0f;
      float block_factor = 0.0f;
      const osm::State<float> updated = osm::merge(previous, block, &previous_factor, &block_factor);

      // Line 12: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j), in HBM.
      const float inverse_sum = updated.inverse_sum();
      const float previous_weight = previous.l * previous_factor * inverse_sum;
      const float block_weight = block_factor * inverse_sum;
      float4* o_row = reinterpret_cast<float4*>(o + query * kHeadDim);  // (kHeadDim / 4)
#pragma unroll 4
      for (int x4 = 0; x4 < kHeadDim / 4; ++x4) {
        float4 pv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int y = 0; y < kBlockN; ++y) {
          const float4 v_values = reinterpret_cast<const float4*>(&v_tile[y][0])[x4];
          pv.x += p[y] * v_values.x;
          pv.y += p[y] * v_values.y;
          pv.z += p[y] * v_values.z;
          pv.w += p[y] * v_values.w;
        }
        float4 accumulated = o_row[x4];
        accumulated.x = previous_weight * accumulated.x + block_weight * pv.x;
        accumulated.y = previous_weight * accumulated.y + block_weight * pv.y;
        accumulated.z = previous_weight * accumulated.z + block_weight * pv.z;
        accumulated.w = previous_weight * accumulated.w + block_weight * pv.w;
        o_row[x4] = accumulated;
      }
      // Line 13: l_i <- l_new, m_i <- m_new, in HBM.
      m[query] = updated.m;
      l[query] = updated.l;
    }
    __syncthreads();  // every thread is done with K_j, V_j before the next block overwrites them
  }
}

// Line 2: O = 0, l = 0, m = -inf in HBM.
__global__ void fa1_init_kernel(std::int64_t rows, std::int64_t head_dim, float* out_accumulator, float* row_max,
                                float* row_sum) {
  const std::int64_t index = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (index < rows * head_dim) out_accumulator[index] = 0.0f;
  if (index < rows) {
    row_max[index] = osm::negative_infinity<float>();
    row_sum[index] = 0.0f;
  }
}

// Line 16: return O — converted to the input dtype and layout, with the LSE.
template <class Element>
__global__ void fa1_finalize_kernel(flashattn::AttentionParams params, const float* out_accumulator,
                                    const float* row_max, const float* row_sum, float* lse) {
  const std::int64_t index = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t head_dim = params.head_dim;
  const std::int64_t total = params.batch * params.heads_q * params.seqlen_q * head_dim;
  if (index >= total) return;
  const std::int64_t column = index % head_dim;
  const std::int64_t stats_index = index / head_dim;  // (batch, head, row) flattened
  const std::int64_t row = stats_index % params.seqlen_q;
  const std::int64_t head = (stats_index / params.seqlen_q) % params.heads_q;
  const std::int64_t batch = stats_index / (params.seqlen_q * params.heads_q);
  auto* out = static_cast<Element*>(params.out) + params.out_offset(batch, head) + row * params.out_row_stride;
  out[column] = from_float<Element>(out_accumulator[index]);
  if (column == 0) {
    const osm::State<float> state{row_max[stats_index], row_sum[stats_index]};
    lse[stats_index] = state.lse();
  }
}

constexpr int kElementwiseThreads = 256;

std::int64_t blocks_for(std::int64_t count) { return (count + kElementwiseThreads - 1) / kElementwiseThreads; }

}  // namespace

Fa1Attention::Fa1Attention(const flashattn::AttentionParams& params, cudaStream_t stream)
    : params_(params), stream_(stream) {
  if (params.group_size != 1 || params.has_softcap() || params.is_varlen())
    throw std::invalid_argument("ladder FA1: MHA, no softcap, no varlen only");
  if (params.head_dim != 64 && params.head_dim != 128)
    throw std::invalid_argument("ladder FA1: head_dim 64 or 128 only");
  if (params.q_row_stride % kElementsPerVector != 0 || params.k_row_stride % kElementsPerVector != 0 ||
      params.v_row_stride % kElementsPerVector != 0)
    throw std::invalid_argument("ladder FA1: row strides must allow 16-byte loads");
  const std::size_t rows = static_cast<std::size_t>(params.batch * params.heads_q * params.seqlen_q);
  const std::size_t out_bytes = rows * static_cast<std::size_t>(params.head_dim) * sizeof(float);
  LADDER_CUDA_CHECK(cudaMalloc(&out_accumulator_, out_bytes));
  LADDER_CUDA_CHECK(cudaMalloc(&row_max_, rows * sizeof(float)));
  LADDER_CUDA_CHECK(cudaMalloc(&row_sum_, rows * sizeof(float)));
  LADDER_CUDA_CHECK(cudaMalloc(&lse_, rows * sizeof(float)));
  extra_bytes_ = out_bytes + 3 * rows * sizeof(float);
}

Fa1Attention::~Fa1Attention() {
  cudaFree(out_accumulator_);
  cudaFree(row_max_);
  cudaFree(row_sum_);
  cudaFree(lse_);
}

void Fa1Attention::run() {
  const flashattn::AttentionParams& p = params_;
  const std::int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  if (rows == 0) return;
  fa1_init_kernel<<<blocks_for(rows * p.head_dim), kElementwiseThreads, 0, stream_>>>(rows, p.head_dim,
                                                                                       out_accumulator_, row_max_,
                                                                                       row_sum_);
  LADDER_CHECK_LAUNCH("fa1_init_kernel");
  dispatch_element(p.dtype, [&](auto element) {
    using Element = decltype(element);
    const dim3 grid(static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
    if (p.head_dim == 64) {
      fa1_forward_kernel<Element, 64, kFa1BlockM, kFa1BlockN>
          <<<grid, kFa1BlockM, 0, stream_>>>(p, out_accumulator_, row_max_, row_sum_);
    } else {
      fa1_forward_kernel<Element, 128, kFa1BlockM, kFa1BlockN>
          <<<grid, kFa1BlockM, 0, stream_>>>(p, out_accumulator_, row_max_, row_sum_);
    }
    LADDER_CHECK_LAUNCH("fa1_forward_kernel");
    fa1_finalize_kernel<Element><<<blocks_for(rows * p.head_dim), kElementwiseThreads, 0, stream_>>>(
        p, out_accumulator_, row_max_, row_sum_, lse_);
    LADDER_CHECK_LAUNCH("fa1_finalize_kernel");
  });
}

}  // namespace ladder
