// src/cuda/hopper/launch.cu — host side of the Hopper forward: the support predicate,
// the TMA tensor maps, and the dispatch to the generated (dtype, head dim) kernels.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "flashattn/error.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/head_dims.hpp"
#include "src/cuda/hopper/launch.hpp"
#include "src/cuda/hopper/tile_config.hpp"
#include "src/cuda/masks/device_mask.hpp"

namespace flashattn::cuda::hopper {
namespace {

// Compute capability (major * 10 + minor) per device index, asked once per device:
// the dispatch runs on every call and must stay in the microseconds.
constexpr int kMaxCachedDevices = 64;
std::atomic<int> cached_capability[kMaxCachedDevices];

int compute_capability(int device) {
  if (device < 0 || device >= kMaxCachedDevices) return 0;
  int capability = cached_capability[device].load(std::memory_order_relaxed);
  if (capability != 0) return capability;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it so the caller's next check is not blamed
    return 0;
  }
  capability = major * 10 + minor;
  cached_capability[device].store(capability, std::memory_order_relaxed);
  return capability;
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  // The driver's entry point through the runtime: libcuda is never linked, so the
  // static-cudart binary keeps running on machines without a GPU.
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encoder;
}

// A stride (elements of element_bytes each) the tensor map can encode: a positive multiple
// of 16 bytes below 2^40 bytes. A dimension of extent 1 is never stepped over, so its
// stride is free.
bool is_encodable_stride(std::int64_t stride_elements, std::int64_t extent, std::int64_t element_bytes = 2) {
  if (extent <= 1) return true;
  const std::int64_t bytes = stride_elements * element_bytes;
  return bytes > 0 && bytes % 16 == 0 && bytes < (std::int64_t{1} << 40);
}

std::uint64_t encodable_stride_bytes(std::int64_t stride_elements, std::int64_t extent, std::int64_t element_bytes) {
  return extent <= 1 ? 16 : static_cast<std::uint64_t>(stride_elements * element_bytes);
}

// 4-D map (head_dim, rows, heads, batch) over one 16-bit, e4m3 (as bytes) or fp32 tensor
// (the backward's dq_accum, for TMA reductions); box (panel_bytes of columns, box_rows, 1,
// 1) with the swizzle of the panel width (128 bytes: 64 16-bit or 32 fp32 columns; the
// FP8 kernel also uses 64). Returns the driver's result; encode is the driver's entry
// point (non-null).
CUresult encode_tensor_map(CUtensorMap& map, PFN_cuTensorMapEncodeTiled_v12000 encode, const void* data, DType dtype,
                           std::int64_t head_dim, std::int64_t rows, std::int64_t heads, std::int64_t batch,
                           std::int64_t row_stride, std::int64_t head_stride, std::int64_t batch_stride, int box_rows,
                           int panel_bytes) {
  const std::int64_t element_bytes = static_cast<std::int64_t>(dtype_size(dtype));
  const cuuint64_t extents[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(rows > 0 ? rows : 1),
                                 static_cast<cuuint64_t>(heads > 0 ? heads : 1),
                                 static_cast<cuuint64_t>(batch > 0 ? batch : 1)};
  const cuuint64_t strides[3] = {encodable_stride_bytes(row_stride, rows, element_bytes),
                                 encodable_stride_bytes(head_stride, heads, element_bytes),
                                 encodable_stride_bytes(batch_stride, batch, element_bytes)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(panel_bytes / element_bytes), static_cast<cuuint32_t>(box_rows), 1,
                             1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType data_type = dtype == DType::bfloat16      ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                        : dtype == DType::float8_e4m3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                        : dtype == DType::float32     ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(&map, data_type, 4, const_cast<void*>(data), extents, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, panel_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// encode_tensor_map, throwing NotSupported (naming the tensor) where it cannot be encoded.
CUtensorMap make_tensor_map(const char* name, const void* data, DType dtype, std::int64_t head_dim, std::int64_t rows,
                            std::int64_t heads, std::int64_t batch, std::int64_t row_stride, std::int64_t head_stride,
                            std::int64_t batch_stride, int box_rows, int panel_bytes = 2 * kPanelColumns) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) throw NotSupported("flashattn: algorithm: flash3 needs the driver's cuTensorMapEncodeTiled");
  CUtensorMap map;
  const CUresult result = encode_tensor_map(map, encode, data, dtype, head_dim, rows, heads, batch, row_stride,
                                            head_stride, batch_stride, box_rows, panel_bytes);
  if (result != CUDA_SUCCESS)
    throw NotSupported(std::string("flashattn: ") + name + ": cuTensorMapEncodeTiled failed (CUresult " +
                       std::to_string(static_cast<int>(result)) + ") for the flash3 kernel's TMA tensor map");
  return map;
}

// Out as the TMA store target of the tile-overlap schedule, box (64 columns, 64 rows):
// false (the kernel then stores O from registers) where out's address or strides are
// not encodable. Never throws: the registers path runs any out the API accepts.
bool make_output_store_map(const AttentionParams& params, std::int64_t rows, std::int64_t batch, CUtensorMap& map) {
  const bool encodable = reinterpret_cast<std::uintptr_t>(params.out) % 16 == 0 &&
                         is_encodable_stride(params.out_row_stride, rows) &&
                         is_encodable_stride(params.out_head_stride, params.heads_q) &&
                         is_encodable_stride(params.out_batch_stride, batch);
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encodable || encode == nullptr) return false;
  return encode_tensor_map(map, encode, params.out, params.dtype, params.head_dim, rows, params.heads_q, batch,
                           params.out_row_stride, params.out_head_stride, params.out_batch_stride,
                           kOutputStoreRows, 2 * kPanelColumns) == CUDA_SUCCESS;
}

template <class T>
void run_for_head_dim(int kernel_head_dim, const HopperForwardParams& params, cudaStream_t stream) {
  const bool ran = HopperForwardHeadDims::visit(
      kernel_head_dim, [&](auto head_dim) { run_forward_sm90<T, decltype(head_dim)::value>(params, stream); });
  if (!ran)
    throw NotSupported("flashattn: q: head_dim " + std::to_string(params.attention.head_dim) +
                       ": no flash3 kernel was built for it (kernel head dim " + std::to_string(kernel_head_dim) + ")");
}

}  // namespace

// Shared with the Hopper backward (src/cuda/hopper_bwd/launch.cu): one tensor-map encoder.
CUtensorMap make_panel_tensor_map(const char* name, const void* data, DType dtype, std::int64_t head_dim,
                                  std::int64_t rows, std::int64_t heads, std::int64_t batch, std::int64_t row_stride,
                                  std::int64_t head_stride, std::int64_t batch_stride, int box_rows, int panel_bytes) {
  return make_tensor_map(name, data, dtype, head_dim, rows, heads, batch, row_stride, head_stride, batch_stride,
                         box_rows, panel_bytes);
}
bool is_tma_encodable_stride(std::int64_t stride_elements, std::int64_t extent, std::int64_t element_bytes) {
  return is_encodable_stride(stride_elements, extent, element_bytes);
}
int device_compute_capability(int device) { return compute_capability(device); }

bool is_built() { return !HopperForwardHeadDims::empty(); }

int kernel_head_dim_for(std::int64_t head_dim) { return HopperForwardHeadDims::smallest_holding(head_dim); }

std::string why_unsupported(const AttentionParams& params) {
  if (!is_built())
    return "this library has no flash3 kernel (it needs sm_90a among CMAKE_CUDA_ARCHITECTURES and head dim 64, "
           "128 or 256 in FLASHATTN_CUDA_HEAD_DIMS)";
  const int capability = compute_capability(params.device.index);
  if (capability != 90)
    return "flash3 runs on compute capability 9.0 (Hopper) only; device " + std::to_string(params.device.index) +
           " has " + std::to_string(capability / 10) + "." + std::to_string(capability % 10);
  if (params.dtype != DType::float16 && params.dtype != DType::bfloat16)
    return std::string("flash3 runs float16 and bfloat16, got ") + dtype_name(params.dtype);
  if (kernel_head_dim_for(params.head_dim) == 0)
    return "flash3 has no kernel for head_dim " + std::to_string(params.head_dim) + " in this build";
  const std::int64_t rows_q = params.is_varlen() ? params.total_q : params.seqlen_q;
  const std::int64_t rows_k = params.is_varlen() ? params.total_k : params.seqlen_k;
  const std::int64_t batch = params.is_varlen() ? 1 : params.batch;
  // An empty tensor is never read (no CTA for no query row; no K/V map without keys),
  // so its strides (often 0) need not be encodable.
  const bool is_q_empty = rows_q == 0 || batch == 0 || params.heads_q == 0;
  const bool is_k_empty = is_q_empty || rows_k == 0;
  const bool encodable =
      (is_q_empty || (is_encodable_stride(params.q_row_stride, rows_q) &&
                      is_encodable_stride(params.q_head_stride, params.heads_q) &&
                      is_encodable_stride(params.q_batch_stride, batch))) &&
      (is_k_empty ||
       (is_encodable_stride(params.k_row_stride, rows_k) && is_encodable_stride(params.k_head_stride, params.heads_kv) &&
        is_encodable_stride(params.k_batch_stride, batch) && is_encodable_stride(params.v_row_stride, rows_k) &&
        is_encodable_stride(params.v_head_stride, params.heads_kv) && is_encodable_stride(params.v_batch_stride, batch)));
  if (!encodable) return "flash3's TMA needs positive q/k/v strides below 2^40 bytes";
  const std::int64_t int32_limit = std::int64_t{1} << 31;
  if (rows_q + 256 >= int32_limit || rows_k + 256 >= int32_limit)
    return "flash3's TMA coordinates are 32-bit: too many rows";
  return {};
}

HopperForwardParams make_forward_params(const AttentionParams& params, const HopperTileConfig& config) {
  const bool is_varlen = params.is_varlen();
  const std::int64_t rows_q = is_varlen ? params.total_q : params.seqlen_q;
  const std::int64_t rows_k = is_varlen ? params.total_k : params.seqlen_k;
  const std::int64_t batch = is_varlen ? 1 : params.batch;
  HopperForwardParams hopper_params{};
  hopper_params.attention = params;
  if (rows_q == 0 || batch == 0 || params.heads_q == 0) return hopper_params;
  hopper_params.q_map = make_tensor_map("q", params.q, params.dtype, params.head_dim, rows_q, params.heads_q, batch,
                                        params.q_row_stride, params.q_head_stride, params.q_batch_stride,
                                        config.block_m);
  if (overlaps_with_two_q_buffers(config, params.has_dropout()) && requested_epilogue() == HopperEpilogue::tma_overlap)
    hopper_params.has_o_map = make_output_store_map(params, rows_q, batch, hopper_params.o_map);
  if (rows_k == 0) return hopper_params;
  hopper_params.k_map = make_tensor_map("k", params.k, params.dtype, params.head_dim, rows_k, params.heads_kv, batch,
                                        params.k_row_stride, params.k_head_stride, params.k_batch_stride,
                                        config.block_n);
  hopper_params.v_map = make_tensor_map("v", params.v, params.dtype, params.head_dim, rows_k, params.heads_kv, batch,
                                        params.v_row_stride, params.v_head_stride, params.v_batch_stride,
                                        config.block_n);
  return hopper_params;
}

namespace {

// One zeroed 32-bit counter for a launch, allocated and freed in stream order.
class TileCounter {
 public:
  TileCounter() = default;
  explicit TileCounter(cudaStream_t stream) : stream_(stream) {
    FLASHATTN_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&counter_), sizeof(unsigned int), stream));
    const cudaError_t status = cudaMemsetAsync(counter_, 0, sizeof(unsigned int), stream);
    if (status != cudaSuccess) {
      (void)cudaFreeAsync(counter_, stream);
      FLASHATTN_CUDA_CHECK(status);
    }
  }
  TileCounter(const TileCounter&) = delete;
  TileCounter& operator=(const TileCounter&) = delete;
  TileCounter& operator=(TileCounter&& other) noexcept {
    std::swap(counter_, other.counter_);
    std::swap(stream_, other.stream_);
    return *this;
  }
  ~TileCounter() {
    if (counter_ != nullptr) (void)cudaFreeAsync(counter_, stream_);
  }
  unsigned int* get() const { return counter_; }

 private:
  unsigned int* counter_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

void forward(const AttentionParams& params, cudaStream_t stream) {
  if (params.batch == 0 || params.seqlen_q == 0 || params.heads_q == 0) return;
  const int kernel_head_dim = kernel_head_dim_for(params.head_dim);
  const HopperTileConfig config = hopper_tile_config(kernel_head_dim, problem_class_of(params), params.has_dropout());
  HopperForwardParams hopper_params = make_forward_params(params, config);
  // attn_mask / block mask: the key-tile lists of each query tile at the kernel's tiles
  // (the kernel then visits them instead of the interval range). Freed stream-ordered
  // after the launch below, so they only need to outlive the enqueue. Without masks the
  // dispatch does nothing more than before.
  masks::MaskTables tables;
  if (params.has_attn_mask() || params.has_block_mask()) {
    tables = masks::prepare(params, {config.block_m, config.block_n, /*by_query_tile=*/true, /*by_key_tile=*/false},
                            stream);
    tables.bind(hopper_params.attention);
  }
  // A persistent launch over tiles of unequal work takes them from a counter, heavy
  // first (kernel.cuh): stream-ordered, so CUDA graphs capture it as a node and every
  // replay starts from zero.
  TileCounter counter;
  if (config.is_persistent && (params.is_causal || params.is_local() || params.is_varlen())) {
    counter = TileCounter(stream);
    hopper_params.maybe_tile_counter = counter.get();
  }
  if (params.dtype == DType::bfloat16) {
    run_for_head_dim<__nv_bfloat16>(kernel_head_dim, hopper_params, stream);
  } else {
    run_for_head_dim<__half>(kernel_head_dim, hopper_params, stream);
  }
}

}  // namespace flashattn::cuda::hopper
