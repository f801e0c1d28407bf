// src/cuda/masks/device_mask.cu — the table-building kernels of device_mask.hpp and
// the dBias conversion. Tiny work (a few µs per call): one warp per block-code row or
// per tile list, no tuning.
#include "src/cuda/masks/device_mask.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include "flashattn/error.hpp"
#include "flashattn/mask.hpp"
#include "src/core/dense_mask_blocks.hpp"
#include "src/cuda/common/check.cuh"

namespace flashattn::cuda::masks {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr std::int64_t kMaxBlocks = 65535 * 16;  // grid-stride beyond this
// The code of a partial block whose stored id is negative (hostile memory): an id no
// partial block has, so ElementRule::allowed denies its elements with bits (a code
// must stay >= 0: -1 and -2 mean full and empty).
constexpr std::int32_t kBadPartialId = INT32_MAX;

unsigned blocks_for_threads(std::int64_t threads) {
  const std::int64_t blocks = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Byte size rounded up to 256 (cudaMallocAsync's alignment is kept for every section).
std::size_t section_bytes(std::int64_t elements, std::size_t element_size) {
  return (static_cast<std::size_t>(elements) * element_size + 255) / 256 * 256;
}

// Block codes (mask_tables.hpp), one warp per (b, h, query block m) row of
// kv_blocks codes: all empty, then the full list's blocks, then the partial list's
// (a block listed in both — invalid input — ends partial). BlockList clamps counts and
// maps out-of-range indices to -1, which are skipped.
__global__ void block_codes_kernel(const __grid_constant__ BlockMaskView view, std::int32_t* codes, std::int64_t batches,
                                   std::int64_t heads) {
  const std::int64_t rows = batches * heads * view.q_blocks;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t first_warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const std::int64_t warp_count = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t row = first_warp; row < rows; row += warp_count) {
    const std::int64_t m = row % view.q_blocks;
    const std::int64_t h = (row / view.q_blocks) % heads;
    const std::int64_t b = row / (view.q_blocks * heads);
    std::int32_t* row_codes = codes + row * view.kv_blocks;  // (kv_blocks)
    for (std::int64_t n = lane; n < view.kv_blocks; n += 32) row_codes[n] = DeviceMask::kEmptyBlock;
    __syncwarp();
    const BlockList full = view.full_key_blocks(b, h, m);
    for (std::int32_t i = lane; i < full.count; i += 32) {
      const std::int32_t n = full.at(i);
      if (n >= 0) row_codes[n] = DeviceMask::kFullBlock;
    }
    __syncwarp();
    const BlockList partial = view.partial_key_blocks(b, h, m);
    for (std::int32_t i = lane; i < partial.count; i += 32) {
      const std::int32_t n = partial.at(i);
      if (n < 0) continue;
      const std::int32_t id = partial.maybe_ids ? partial.id_at(i) : 0;
      row_codes[n] = id >= 0 ? id : kBadPartialId;
    }
    __syncwarp();  // the next row's stores must not overtake this row's reads of the lists
  }
}

// The document rule as spans (mask_tables.hpp): for each row of `row_ids` (one batch
// item's ids at b * row_batch_stride) the span of rows of `other_ids` with the same id,
// found by binary search — exact when other_ids is sorted. Clears *maybe_sorted (set
// nonzero before) when either id array is not sorted, so the list kernel gives
// kGeneralTile instead of trusting the spans.
__global__ void document_spans_kernel(const std::int32_t* row_ids, std::int64_t rows, std::int64_t row_batch_stride,
                                      const std::int32_t* other_ids, std::int64_t others,
                                      std::int64_t other_batch_stride, std::int64_t batches, std::int32_t* spans,
                                      std::int32_t* sorted) {
  const std::int64_t first = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = first; i < batches * rows; i += step) {
    const std::int64_t b = i / rows, r = i % rows;
    const std::int32_t* ids = row_ids + b * row_batch_stride;
    const std::int32_t* other = other_ids + b * other_batch_stride;
    const std::int32_t id = ids[r];
    if (r > 0 && ids[r - 1] > id) *sorted = 0;
    std::int64_t low = 0, high = others;  // first index with other >= id
    while (low < high) {
      const std::int64_t middle = (low + high) / 2;
      if (other[middle] < id) low = middle + 1;
      else high = middle;
    }
    const std::int64_t begin = low;
    high = others;  // first index with other > id
    while (low < high) {
      const std::int64_t middle = (low + high) / 2;
      if (other[middle] <= id) low = middle + 1;
      else high = middle;
    }
    spans[2 * i] = static_cast<std::int32_t>(begin);
    spans[2 * i + 1] = static_cast<std::int32_t>(low);
  }
  for (std::int64_t i = first; i < batches * others; i += step) {
    const std::int64_t b = i / others, c = i % others;
    const std::int32_t* other = other_ids + b * other_batch_stride;
    if (c > 0 && other[c - 1] > other[c]) *sorted = 0;
  }
}

// The partial bits transposed (DeviceMask::maybe_partial_bits_by_key), one thread per
// output word gathering its 32 query rows.
__global__ void transpose_bits_kernel(const ElementRule rule, std::uint32_t* by_key, std::int64_t words_per_key) {
  const std::int64_t words = rule.partial_block_count * rule.block_n * words_per_key;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t word_index = i % words_per_key;
    const std::int64_t key = (i / words_per_key) % rule.block_n;
    const std::int64_t block = i / (words_per_key * rule.block_n);
    std::uint32_t word = 0;
    for (int k = 0; k < 32; ++k) {
      const std::int64_t row = 32 * word_index + k;
      if (row >= rule.block_m) break;
      const std::uint32_t source = rule.maybe_partial_bits[(block * rule.block_m + row) * rule.words_per_row + key / 32];
      word |= ((source >> (key % 32)) & 1u) << k;
    }
    by_key[i] = word;
  }
}

// The block form of a dense boolean mask (src/core/dense_mask_blocks.hpp), one CTA per
// mask block (grid-stride): a warp packs one 32-column word of a block row per ballot,
// lane = column, so it reads 32 consecutive mask bytes; kUnroll words per warp are
// loaded before the first ballot (a one-off pass over the mask, bound by its reads).
// The CTA then sums the allowed bits into the block's code. Elements outside the
// sequences are 0 bits and never read.
struct MaskStrides {
  std::int64_t values[4];  // of attn_mask, 0 on broadcast dimensions
};
__global__ void dense_mask_blocks_kernel(const std::uint8_t* mask, const MaskStrides strides, const DenseMaskGrid grid,
                                         std::int32_t* codes, std::uint32_t* bits) {
  constexpr int kUnroll = 8;
  __shared__ std::int32_t warp_allowed[kWarpsPerBlock];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  // (row, word) pairs of a block, row-major: at most 1024 x 32, and words_per_row is a
  // power of two (block_n is), so 32-bit shifts instead of 64-bit divisions.
  const int words = static_cast<int>(grid.words_per_block());
  const int word_shift = __ffs(static_cast<int>(grid.words_per_row)) - 1;
  for (std::int64_t index = blockIdx.x; index < grid.block_count(); index += gridDim.x) {
    const std::int64_t n = index % grid.kv_blocks;
    const std::int64_t m = (index / grid.kv_blocks) % grid.q_blocks;
    const std::int64_t set = index / (grid.kv_blocks * grid.q_blocks);
    const std::int64_t h = set % grid.heads, b = set / grid.heads;  // 0 on a broadcast dimension
    const std::uint8_t* set_mask = mask + b * strides.values[0] + h * strides.values[1];
    std::uint32_t* block_bits = bits + index * words;  // (block_m, words_per_row)
    std::int32_t allowed = 0;
    for (int first = warp; first < words; first += kWarpsPerBlock * kUnroll) {
      bool values[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int pair = first + u * kWarpsPerBlock;
        const int r = pair >> word_shift, c = (pair & ((1 << word_shift) - 1)) * 32 + lane;
        const std::int64_t row = m * grid.block_m + r, col = n * grid.block_n + c;
        const bool is_inside = pair < words && c < grid.block_n && row < grid.seqlen_q && col < grid.seqlen_k;
        values[u] = is_inside && set_mask[row * strides.values[2] + col * strides.values[3]] != 0;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int pair = first + u * kWarpsPerBlock;
        const std::uint32_t word = __ballot_sync(0xffffffffu, values[u]);
        if (lane == 0 && pair < words) block_bits[pair] = word;
        allowed += __popc(word);
      }
    }
    if (lane == 0) warp_allowed[warp] = allowed;
    __syncthreads();
    if (threadIdx.x == 0) {
      std::int64_t total = 0;
      for (int k = 0; k < kWarpsPerBlock; ++k) total += warp_allowed[k];
      codes[index] = DenseMaskGrid::code_of(total, grid.inside_count(m, n), index);
    }
    __syncthreads();  // warp_allowed is rewritten for the next block
  }
}

// Which lists a list kernel writes and at which tile sizes.
struct ListGeometry {
  std::int32_t* counts = nullptr;   // [list_batches, list_heads, outer_tiles]
  std::int32_t* entries = nullptr;  // [list_batches, list_heads, outer_tiles, inner_tiles]
  std::int32_t* codes = nullptr;    // the entries' tile codes, same layout
  const std::int32_t* maybe_documents_sorted = nullptr;  // nonzero: the document spans are exact
  std::int64_t lists = 0;           // list_batches * list_heads * outer_tiles
  std::int64_t list_heads = 0;
  std::int64_t outer_tiles = 0;
  std::int32_t inner_tiles = 0;
  std::int32_t query_tile = 0;
  std::int32_t key_tile = 0;
  bool is_outer_query = true;  // by query tile (inner = key tiles) or by key tile (inner = query tiles)
};

struct TileVisit {
  bool is_listed;
  bool is_partial;
  std::int32_t code;  // the tile code (mask_tables.hpp)
};

// Whether a kernel visits query tile mt x key tile nt of (b, h), and whether it needs
// the element pass there (see mask_tables.hpp). A tile sticking out of either sequence
// is partial: the pass masks the keys past seqlen_k (the kernels load them
// zero-filled, score 0) and the query rows past seqlen_q, whose recomputed P a
// backward kernel must not keep.
__device__ TileVisit visit_of(const AttentionParams& params, const ListGeometry& geometry, std::int64_t b,
                              std::int64_t h, std::int64_t mt, std::int64_t nt, std::int64_t query_tile,
                              std::int64_t key_tile) {
  const MaskRule mask = params.mask_of(0);  // no varlen with masks: one geometry for every batch item
  const std::int64_t row_begin = mt * query_tile, col_begin = nt * key_tile;
  const std::int64_t row_end = row_begin + query_tile < mask.seqlen_q ? row_begin + query_tile : mask.seqlen_q;
  const std::int64_t col_end = col_begin + key_tile < mask.seqlen_k ? col_begin + key_tile : mask.seqlen_k;
  const TileKind interval = mask.tile_kind(row_begin, row_end, col_begin, col_end);
  if (interval == TileKind::empty) return {false, false, kGeneralTile};
  bool is_partial = interval == TileKind::partial || row_begin + query_tile > mask.seqlen_q ||
                    col_begin + key_tile > mask.seqlen_k || params.has_attn_mask();
  const DeviceMask& device_mask = params.device_mask;
  if (device_mask.maybe_block_codes != nullptr) {
    const BlockMaskView& view = params.block_mask;
    const std::int32_t* codes = device_mask.maybe_block_codes + b * device_mask.code_batch_stride + h * device_mask.code_head_stride;
    bool is_any_allowed = false, is_all_full = true;
    // Mask blocks and kernel tiles are powers of two: a tile overlaps 1 x 1 blocks, or
    // (tile / block)^2 of them (at most 64 for 128-tiles of 16-blocks).
    for (std::int64_t qb = row_begin / view.block_m; qb <= (row_end - 1) / view.block_m; ++qb)
      for (std::int64_t kb = col_begin / view.block_n; kb <= (col_end - 1) / view.block_n; ++kb) {
        const std::int32_t code = codes[qb * view.kv_blocks + kb];
        is_any_allowed = is_any_allowed || code != DeviceMask::kEmptyBlock;
        is_all_full = is_all_full && code == DeviceMask::kFullBlock;
      }
    if (!is_any_allowed) return {false, false, kGeneralTile};
    is_partial = is_partial || !is_all_full;
  }
  // The tile code: the spans (and one block's bits) of the kernels' fast element pass
  // hold when no dense attn_mask covers the tile, the documents are sorted, and every
  // mask block under the tile has the same code.
  std::int32_t code = DeviceMask::kFullBlock;
  if (params.has_attn_mask() || (geometry.maybe_documents_sorted != nullptr && *geometry.maybe_documents_sorted == 0)) {
    code = kGeneralTile;
  } else if (device_mask.maybe_block_codes != nullptr) {
    code = shared_block_code(device_mask.maybe_block_codes + b * device_mask.code_batch_stride +
                                 h * device_mask.code_head_stride,
                             params.block_mask, row_begin, row_end, col_begin, col_end);
  }
  return {true, is_partial, code};
}

// One warp per list: the lanes classify 32 inner tiles at a time, from the last one
// down, and a ballot compacts the listed ones in that (descending) order.
__global__ void tile_lists_kernel(const __grid_constant__ AttentionParams params, const ListGeometry geometry) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::uint32_t lanes_below = (1u << lane) - 1u;
  const std::int64_t first_warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const std::int64_t warp_count = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t list = first_warp; list < geometry.lists; list += warp_count) {
    const std::int64_t outer = list % geometry.outer_tiles;
    const std::int64_t h = (list / geometry.outer_tiles) % geometry.list_heads;
    const std::int64_t b = list / (geometry.outer_tiles * geometry.list_heads);
    std::int32_t* list_entries = geometry.entries + list * geometry.inner_tiles;  // (inner_tiles)
    std::int32_t count = 0;
    for (std::int32_t chunk = 0; chunk < geometry.inner_tiles; chunk += 32) {
      const std::int32_t inner = geometry.inner_tiles - 1 - (chunk + lane);
      TileVisit visit{false, false, kGeneralTile};
      if (inner >= 0) {
        visit = geometry.is_outer_query
                    ? visit_of(params, geometry, b, h, outer, inner, geometry.query_tile, geometry.key_tile)
                    : visit_of(params, geometry, b, h, inner, outer, geometry.query_tile, geometry.key_tile);
      }
      const std::uint32_t listed = __ballot_sync(0xffffffffu, visit.is_listed);
      if (visit.is_listed) {
        const std::int32_t slot = count + __popc(listed & lanes_below);
        list_entries[slot] = inner << 1 | (visit.is_partial ? 1 : 0);
        geometry.codes[list * geometry.inner_tiles + slot] = visit.code;
      }
      count += __popc(listed);
    }
    if (lane == 0) geometry.counts[list] = count;
  }
}

// dbias[b, h, r, c] (its dtype and strides) = the float32 accumulator, one thread per element.
__global__ void finish_dbias_kernel(const float* sum, DeviceMask device_mask, void* dbias, DType dtype,
                                    const std::int64_t shape0, const std::int64_t shape1, const std::int64_t shape2,
                                    const std::int64_t shape3, const std::int64_t stride0, const std::int64_t stride1,
                                    const std::int64_t stride2, const std::int64_t stride3) {
  const std::int64_t elements = shape0 * shape1 * shape2 * shape3;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < elements;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t c = i % shape3;
    const std::int64_t r = (i / shape3) % shape2;
    const std::int64_t h = (i / (shape3 * shape2)) % shape1;
    const std::int64_t b = i / (shape3 * shape2 * shape1);
    const float value = sum[device_mask.dbias_offset(b, h, r, c)];
    const std::int64_t offset = b * stride0 + h * stride1 + r * stride2 + c * stride3;
    if (dtype == DType::float32) static_cast<float*>(dbias)[offset] = value;
    else if (dtype == DType::float16) static_cast<__half*>(dbias)[offset] = __float2half_rn(value);
    else static_cast<__nv_bfloat16*>(dbias)[offset] = __float2bfloat16_rn(value);
  }
}

// Whether the block mask's forward lists vary over dimension `dim` (0 batch, 1 head):
// a size-1 (or zero-stride) dimension is broadcast, so one set of codes serves all.
bool block_mask_varies(const BlockMaskView& view, int dim) {
  for (const BlockListTensor* list : {&view.partial_kv, &view.full_kv}) {
    if (!list->present()) continue;
    if (list->num_strides[dim] != 0 || list->index_strides[dim] != 0) return true;
  }
  return false;
}

}  // namespace

MaskTables::MaskTables(MaskTables&& other) noexcept
    : view_(other.view_),
      dense_mask_blocks_(other.dense_mask_blocks_),
      has_dense_mask_blocks_(std::exchange(other.has_dense_mask_blocks_, false)),
      scratch_(std::exchange(other.scratch_, nullptr)),
      stream_(other.stream_) {
  other.view_ = DeviceMask{};
}

MaskTables& MaskTables::operator=(MaskTables&& other) noexcept {
  if (this != &other) {
    release();
    view_ = std::exchange(other.view_, DeviceMask{});
    dense_mask_blocks_ = other.dense_mask_blocks_;
    has_dense_mask_blocks_ = std::exchange(other.has_dense_mask_blocks_, false);
    scratch_ = std::exchange(other.scratch_, nullptr);
    stream_ = other.stream_;
  }
  return *this;
}

MaskTables::~MaskTables() { release(); }

void MaskTables::release() noexcept {
  // A destructor cannot throw: a failing free here reports at the next checked call.
  if (scratch_ != nullptr) (void)cudaFreeAsync(scratch_, stream_);
  scratch_ = nullptr;
  view_ = DeviceMask{};
  has_dense_mask_blocks_ = false;
}

void MaskTables::bind(AttentionParams& params) const {
  params.device_mask = view_;
  if (!has_dense_mask_blocks_) return;
  params.block_mask = dense_mask_blocks_;
  params.maybe_attn_mask = nullptr;
}

MaskTables MaskTables::build(const AttentionParams& given, const BackwardParams* maybe_backward, const KernelTiles& tiles,
                             cudaStream_t stream) {
  MaskTables tables;
  if (!given.has_attn_mask() && !given.has_block_mask()) return tables;
  if ((!tiles.by_query_tile && !tiles.by_key_tile) || tiles.query_tile <= 0 || tiles.key_tile <= 0)
    throw NotSupported("flashattn: attn_mask: internal error: mask tables requested for no list or a tile size <= 0 (" +
                       std::to_string(tiles.query_tile) + " x " + std::to_string(tiles.key_tile) + ")");
  if (given.is_varlen())
    throw NotSupported(std::string("flashattn: ") + (given.has_attn_mask() ? "attn_mask" : "block_mask") +
                       ": masks are not supported with variable-length batches (cu_seqlens_q, cu_seqlens_k)");
  // A dense boolean mask alone (unless FLASHATTN_DENSE_MASK=elements): its block form
  // at mask blocks matching the kernel's tiles (src/core/dense_mask_blocks.hpp). From here
  // on `params` are the masks as the kernels will read them (bind()): the converted mask
  // is a block mask with bits and no attn_mask (the bits pointer is set once allocated).
  const bool converts = is_dense_mask_convertible(given) && is_dense_mask_conversion_requested();
  DenseMaskGrid dense_grid;
  AttentionParams params = given;
  if (converts) {
    dense_grid = dense_mask_grid(given, dense_mask_block_for_tile(tiles.query_tile), dense_mask_block_for_tile(tiles.key_tile));
    params.maybe_attn_mask = nullptr;
    params.block_mask = dense_grid.view(nullptr);
  }
  const BlockMaskView& view = params.block_mask;
  const bool has_block_mask = params.has_block_mask();
  const bool has_dbias = maybe_backward != nullptr && maybe_backward->maybe_dbias != nullptr;

  // The lists depend on (b, h) through the block codes only (the interval rule is one
  // for all without varlen; a dense attn_mask makes every visited tile partial).
  const std::int64_t code_batches =
      has_block_mask && (converts ? dense_grid.batches > 1 : block_mask_varies(view, 0)) ? params.batch : 1;
  const std::int64_t code_heads =
      has_block_mask && (converts ? dense_grid.heads > 1 : block_mask_varies(view, 1)) ? params.heads_q : 1;
  const std::int64_t code_row = has_block_mask ? view.q_blocks * view.kv_blocks : 0;
  const std::int64_t query_tiles = ceil_div(params.seqlen_q, tiles.query_tile);
  const std::int64_t key_tiles = ceil_div(params.seqlen_k, tiles.key_tile);
  if (query_tiles > INT32_MAX / 2 || key_tiles > INT32_MAX / 2)
    throw NotSupported("flashattn: q: too many tiles for the mask tables' int32 entries");
  const std::int64_t list_sets = code_batches * code_heads;  // sets of lists, one per distinct (b|1, h|1)
  const std::int64_t dbias_elements =
      has_dbias ? maybe_backward->dbias_shape[0] * maybe_backward->dbias_shape[1] * maybe_backward->dbias_shape[2] *
                      maybe_backward->dbias_shape[3]
                : 0;

  // Never-empty sections: present() reads a non-null counts pointer even with 0 tiles,
  // and a block mask has codes even over an empty sequence.
  const std::size_t codes_bytes = has_block_mask ? section_bytes(list_sets * code_row + 1, sizeof(std::int32_t)) : 0;
  const std::size_t query_counts_bytes =
      tiles.by_query_tile ? section_bytes(list_sets * query_tiles + 1, sizeof(std::int32_t)) : 0;
  const std::size_t query_entries_bytes =
      tiles.by_query_tile ? section_bytes(list_sets * query_tiles * key_tiles + 1, sizeof(std::int32_t)) : 0;
  const std::size_t key_counts_bytes = tiles.by_key_tile ? section_bytes(list_sets * key_tiles + 1, sizeof(std::int32_t)) : 0;
  const std::size_t key_entries_bytes =
      tiles.by_key_tile ? section_bytes(list_sets * key_tiles * query_tiles + 1, sizeof(std::int32_t)) : 0;
  const std::size_t dbias_bytes = has_dbias ? section_bytes(dbias_elements, sizeof(float)) : 0;
  // The fast element pass's inputs (mask_tables.hpp): document spans per query row (by
  // query tile) and per key row (by key tile), their sortedness flag, the bits by key.
  ElementRule& rule = params.block_mask.rule;
  const bool has_documents = has_block_mask && rule.maybe_q_document_ids != nullptr;
  const std::int64_t document_batches =
      has_documents && (rule.q_document_batch_stride != 0 || rule.k_document_batch_stride != 0) ? params.batch : 1;
  // The key spans whatever the lists: a kernel's fragment rows may be queries under
  // key-tile lists too (the wide Hopper dK/dV kernel). The query spans (fragment rows that
  // are keys) only for the key-tile lists' kernels: a forward does without them (one
  // launch less; the first launch below already checks both id arrays' order).
  const std::size_t key_spans_bytes =
      has_documents ? section_bytes(document_batches * params.seqlen_q * 2 + 1, sizeof(std::int32_t)) : 0;
  const std::size_t query_spans_bytes =
      has_documents && tiles.by_key_tile ? section_bytes(document_batches * params.seqlen_k * 2 + 1, sizeof(std::int32_t))
                                         : 0;
  const std::size_t sorted_bytes = has_documents ? section_bytes(1, sizeof(std::int32_t)) : 0;
  const bool has_bits_by_key = has_block_mask && (converts || rule.has_bits()) && tiles.by_key_tile;
  const std::int64_t words_per_key = (view.block_m + 31) / 32;
  const std::size_t bits_by_key_bytes =
      has_bits_by_key ? section_bytes(rule.partial_block_count * view.block_n * words_per_key + 1, sizeof(std::uint32_t)) : 0;
  // The converted dense mask's bits, every block's (dense_mask_blocks.hpp).
  const std::size_t dense_bits_bytes =
      converts ? section_bytes(dense_grid.block_count() * dense_grid.words_per_block() + 1, sizeof(std::uint32_t)) : 0;
  const std::size_t total = dense_bits_bytes + codes_bytes + 2 * query_entries_bytes + query_counts_bytes + key_counts_bytes +
                            2 * key_entries_bytes + dbias_bytes + key_spans_bytes + query_spans_bytes + sorted_bytes +
                            bits_by_key_bytes;

  FLASHATTN_CUDA_CHECK(cudaMallocAsync(&tables.scratch_, total, stream));
  tables.stream_ = stream;
  unsigned char* cursor = static_cast<unsigned char*>(tables.scratch_);
  auto take = [&](std::size_t bytes) {
    unsigned char* section = bytes ? cursor : nullptr;
    cursor += bytes;
    return section;
  };
  auto* dense_bits = reinterpret_cast<std::uint32_t*>(take(dense_bits_bytes));
  auto* codes = reinterpret_cast<std::int32_t*>(take(codes_bytes));
  auto* query_counts = reinterpret_cast<std::int32_t*>(take(query_counts_bytes));
  auto* query_entries = reinterpret_cast<std::int32_t*>(take(query_entries_bytes));
  auto* query_codes = reinterpret_cast<std::int32_t*>(take(query_entries_bytes));
  auto* key_counts = reinterpret_cast<std::int32_t*>(take(key_counts_bytes));
  auto* key_entries = reinterpret_cast<std::int32_t*>(take(key_entries_bytes));
  auto* key_codes = reinterpret_cast<std::int32_t*>(take(key_entries_bytes));
  auto* dbias_sum = reinterpret_cast<float*>(take(dbias_bytes));
  auto* key_spans = reinterpret_cast<std::int32_t*>(take(key_spans_bytes));
  auto* query_spans = reinterpret_cast<std::int32_t*>(take(query_spans_bytes));
  auto* documents_sorted = reinterpret_cast<std::int32_t*>(take(sorted_bytes));
  auto* bits_by_key = reinterpret_cast<std::uint32_t*>(take(bits_by_key_bytes));

  DeviceMask& mask = tables.view_;
  if (has_block_mask) {
    mask.maybe_block_codes = codes;
    mask.code_batch_stride = code_batches > 1 ? code_heads * code_row : 0;
    mask.code_head_stride = code_heads > 1 ? code_row : 0;
    const std::int64_t code_rows = list_sets * view.q_blocks;
    if (converts) {
      rule.maybe_partial_bits = dense_bits;
      tables.dense_mask_blocks_ = params.block_mask;
      tables.has_dense_mask_blocks_ = true;
      MaskStrides strides;
      for (int d = 0; d < 4; ++d) strides.values[d] = given.attn_mask_strides[d];
      if (dense_grid.block_count() > 0) {
        dense_mask_blocks_kernel<<<static_cast<unsigned>(std::min<std::int64_t>(dense_grid.block_count(), kMaxBlocks)),
                                   kThreads, 0, stream>>>(static_cast<const std::uint8_t*>(given.maybe_attn_mask), strides,
                                                          dense_grid, codes, dense_bits);
        FLASHATTN_CUDA_CHECK_LAUNCH();
      }
    } else if (code_rows > 0 && view.kv_blocks > 0) {
      block_codes_kernel<<<blocks_for_threads(code_rows * 32), kThreads, 0, stream>>>(view, codes, code_batches,
                                                                                      code_heads);
      FLASHATTN_CUDA_CHECK_LAUNCH();
    }
  }

  if (has_documents) {
    FLASHATTN_CUDA_CHECK(cudaMemsetAsync(documents_sorted, 1, sizeof(std::int32_t), stream));  // nonzero: sorted
    const std::int64_t q_stride = rule.q_document_batch_stride, k_stride = rule.k_document_batch_stride;
    // The spans of each row's document among the other side's positions: keys of a query
    // row (forward, dQ) or queries of a key row (dK/dV).
    const auto launch_spans = [&](const std::int32_t* row_ids, std::int64_t rows, std::int64_t row_stride,
                                  const std::int32_t* other_ids, std::int64_t others, std::int64_t other_stride,
                                  std::int32_t* spans) {
      document_spans_kernel<<<blocks_for_threads(document_batches * std::max(params.seqlen_q, params.seqlen_k)), kThreads,
                              0, stream>>>(row_ids, rows, row_stride, other_ids, others, other_stride, document_batches,
                                           spans, documents_sorted);
      FLASHATTN_CUDA_CHECK_LAUNCH();
    };
    if (key_spans != nullptr && params.seqlen_q > 0) {
      launch_spans(rule.maybe_q_document_ids, params.seqlen_q, q_stride, rule.maybe_k_document_ids, params.seqlen_k,
                   k_stride, key_spans);
      mask.maybe_document_key_spans = key_spans;
      mask.document_batch_stride_q = document_batches > 1 ? params.seqlen_q : 0;
    }
    if (query_spans != nullptr && params.seqlen_k > 0) {
      launch_spans(rule.maybe_k_document_ids, params.seqlen_k, k_stride, rule.maybe_q_document_ids, params.seqlen_q,
                   q_stride, query_spans);
      mask.maybe_document_query_spans = query_spans;
      mask.document_batch_stride_k = document_batches > 1 ? params.seqlen_k : 0;
    }
  }
  if (has_bits_by_key) {
    mask.maybe_partial_bits_by_key = bits_by_key;
    mask.words_per_key = words_per_key;
    const std::int64_t words = rule.partial_block_count * view.block_n * words_per_key;
    if (words > 0) {
      transpose_bits_kernel<<<blocks_for_threads(words), kThreads, 0, stream>>>(rule, bits_by_key, words_per_key);
      FLASHATTN_CUDA_CHECK_LAUNCH();
    }
  }

  // The list kernels read the codes through params.device_mask (visit_of).
  AttentionParams list_params = params;
  list_params.device_mask = mask;
  auto build_lists = [&](TileLists& lists, std::int32_t* counts, std::int32_t* entries, std::int32_t* entry_codes,
                         bool is_outer_query) {
    const std::int64_t outer_tiles = is_outer_query ? query_tiles : key_tiles;
    const std::int64_t inner_tiles = is_outer_query ? key_tiles : query_tiles;
    lists.counts = counts;
    lists.entries = entries;
    lists.codes = entry_codes;
    lists.batch_stride = code_batches > 1 ? code_heads * outer_tiles : 0;
    lists.head_stride = code_heads > 1 ? outer_tiles : 0;
    lists.outer_tiles = outer_tiles;
    lists.capacity = inner_tiles;
    lists.inner_tiles = static_cast<std::int32_t>(inner_tiles);
    lists.outer_tile_size = is_outer_query ? tiles.query_tile : tiles.key_tile;
    lists.inner_tile_size = is_outer_query ? tiles.key_tile : tiles.query_tile;
    ListGeometry geometry;
    geometry.counts = counts;
    geometry.entries = entries;
    geometry.codes = entry_codes;
    geometry.maybe_documents_sorted = has_documents ? documents_sorted : nullptr;
    geometry.lists = list_sets * outer_tiles;
    geometry.list_heads = code_heads;
    geometry.outer_tiles = outer_tiles;
    geometry.inner_tiles = static_cast<std::int32_t>(inner_tiles);
    geometry.query_tile = tiles.query_tile;
    geometry.key_tile = tiles.key_tile;
    geometry.is_outer_query = is_outer_query;
    if (geometry.lists == 0) return;
    tile_lists_kernel<<<blocks_for_threads(geometry.lists * 32), kThreads, 0, stream>>>(list_params, geometry);
    FLASHATTN_CUDA_CHECK_LAUNCH();
  };
  if (tiles.by_query_tile) build_lists(mask.by_query_tile, query_counts, query_entries, query_codes, true);
  if (tiles.by_key_tile) build_lists(mask.by_key_tile, key_counts, key_entries, key_codes, false);

  if (has_dbias) {
    // Dense float32 in dbias's shape, stride 0 on size-1 dimensions: broadcast dimensions sum.
    std::int64_t stride = 1;
    for (int d = 3; d >= 0; --d) {
      mask.dbias_sum_strides[d] = maybe_backward->dbias_shape[d] > 1 ? stride : 0;
      stride *= maybe_backward->dbias_shape[d];
    }
    mask.maybe_dbias_sum = dbias_sum;
    FLASHATTN_CUDA_CHECK(cudaMemsetAsync(dbias_sum, 0, dbias_bytes, stream));
  }
  return tables;
}

MaskTables prepare(const AttentionParams& params, const KernelTiles& tiles, cudaStream_t stream) {
  return MaskTables::build(params, nullptr, tiles, stream);
}

MaskTables prepare(const BackwardParams& params, const KernelTiles& tiles, cudaStream_t stream) {
  return MaskTables::build(params, &params, tiles, stream);
}

void finish_dbias(const BackwardParams& params, const MaskTables& tables, cudaStream_t stream) {
  const DeviceMask& mask = tables.view();
  if (params.maybe_dbias == nullptr) return;
  if (mask.maybe_dbias_sum == nullptr)
    throw NotSupported("flashattn: dbias: internal error: no dBias accumulator (prepare() was not given the BackwardParams)");
  const std::int64_t* shape = params.dbias_shape;
  const std::int64_t* strides = params.dbias_strides;
  const std::int64_t elements = shape[0] * shape[1] * shape[2] * shape[3];
  if (elements == 0) return;
  finish_dbias_kernel<<<blocks_for_threads(elements), kThreads, 0, stream>>>(
      mask.maybe_dbias_sum, mask, params.maybe_dbias, params.attn_mask_dtype, shape[0], shape[1], shape[2], shape[3],
      strides[0], strides[1], strides[2], strides[3]);
  FLASHATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda::masks
