// python/src/tensor_view_from_dlpack.hpp — the one place where a DLPack tensor
// (NumPy array, PyTorch tensor, CuPy array, ... as received by nanobind) becomes a
// flashattn::TensorView. Nothing below this layer knows about Python.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

#include "flashattn/tensor.hpp"

namespace flashattn::python {

namespace nb = nanobind;

// DLPack device type codes (dlpack.h DLDeviceType).
inline constexpr int kDLCPU = 1;
inline constexpr int kDLCUDA = 2;
inline constexpr int kDLCUDAHost = 3;  // pinned host memory: the CPU backend can read it

inline std::string dlpack_dtype_name(nb::dlpack::dtype dtype) {
  static const char* const kCodeNames[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool",
                                           "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn"};
  const std::string code = dtype.code < 11 ? kCodeNames[dtype.code] : "code" + std::to_string(dtype.code);
  std::string name = code + std::to_string(dtype.bits);
  if (dtype.lanes != 1) name += "x" + std::to_string(dtype.lanes);
  return name;
}

// Rank bounds; an array without elements has meaningless strides (NumPy exports
// zeros), so it gets the row-major ones and the layout checks judge only arrays that
// hold data.
inline void finish_view(TensorView& view, const char* name) {
  if (view.rank < 1 || view.rank > kMaxRank)
    throw nb::value_error(("flashattn: " + std::string(name) + ": wrong rank: expected 1 to " + std::to_string(kMaxRank) +
                           ", got " + std::to_string(view.rank)).c_str());
  bool is_empty = false;
  for (int d = 0; d < view.rank; ++d) is_empty = is_empty || view.shape[static_cast<std::size_t>(d)] == 0;
  if (is_empty) {
    std::int64_t stride = 1;
    for (int d = view.rank - 1; d >= 0; --d) {
      view.strides[static_cast<std::size_t>(d)] = stride;
      stride *= view.shape[static_cast<std::size_t>(d)] > 0 ? view.shape[static_cast<std::size_t>(d)] : 1;
    }
  }
}

// dtype/device/shape/strides (DLPack's, strides in elements) -> TensorView. `name` is
// the argument name used in error messages ("q", "cu_seqlens_k", ...). Wrong dtypes
// raise TypeError, anything else about the array ValueError; the library itself then
// checks shapes, strides, devices and dtypes against each other.
inline TensorView tensor_view_from_parts(void* data, nb::dlpack::dtype dt, int device_type, int device_id, int rank,
                                         const std::int64_t* shape, const std::int64_t* strides, const char* name) {
  using Code = nb::dlpack::dtype_code;
  TensorView view;
  const auto code = static_cast<Code>(dt.code);
  if (dt.lanes == 1 && code == Code::Float && dt.bits == 32) view.dtype = DType::float32;
  else if (dt.lanes == 1 && code == Code::Float && dt.bits == 16) view.dtype = DType::float16;
  else if (dt.lanes == 1 && code == Code::Bfloat && dt.bits == 16) view.dtype = DType::bfloat16;
  else if (dt.lanes == 1 && code == Code::Int && dt.bits == 32) view.dtype = DType::int32;
  else if (dt.lanes == 1 && code == Code::UInt && dt.bits == 8) view.dtype = DType::uint8;
  else if (dt.lanes == 1 && code == Code::Int && dt.bits == 64) view.dtype = DType::int64;
  else if (dt.lanes == 1 && code == Code::Bool && dt.bits == 8) view.dtype = DType::boolean;
  else if (dt.lanes == 1 && code == Code::Float8_E4M3FN && dt.bits == 8) view.dtype = DType::float8_e4m3;
  else
    throw nb::type_error(("flashattn: " + std::string(name) + ": unsupported dtype: expected float32, float16, bfloat16, "
                          "float8_e4m3fn (int32 for cu_seqlens, uint8 for the workspace, int64 for the dropout seed/offset, bool for attn_mask), got " + dlpack_dtype_name(dt)).c_str());

  if (device_type == kDLCPU || device_type == kDLCUDAHost) view.device = Device::cpu();
  else if (device_type == kDLCUDA) view.device = Device::cuda(device_id);
  else
    throw nb::value_error(("flashattn: " + std::string(name) + ": unsupported device: expected cpu or cuda, got DLPack device type " +
                           std::to_string(device_type)).c_str());

  view.rank = rank;
  view.data = data;
  if (rank >= 1 && rank <= kMaxRank) {
    std::int64_t row_major = 1;  // DLPack: strides == nullptr means compact row-major
    for (int d = rank - 1; d >= 0; --d) {
      const auto i = static_cast<std::size_t>(d);
      view.shape[i] = shape[d];
      view.strides[i] = strides != nullptr ? strides[d] : row_major;
      row_major *= shape[d];
    }
  }
  finish_view(view, name);
  return view;
}

// A DLTensor borrowed through the DLPack C exchange API.
inline TensorView tensor_view_from_dltensor(const nb::dlpack::dltensor& tensor, const char* name) {
  void* data = static_cast<char*>(tensor.data) + tensor.byte_offset;
  return tensor_view_from_parts(data, tensor.dtype, tensor.device.device_type, tensor.device.device_id, tensor.ndim,
                                tensor.shape, tensor.strides, name);
}

// An array imported by nanobind (capsule, __dlpack__, buffer protocol).
template <class... Config>
TensorView tensor_view_from_dlpack(const nb::ndarray<Config...>& array, const char* name) {
  // data() includes DLPack's byte_offset; nanobind fills in strides when the producer left them out.
  return tensor_view_from_parts(const_cast<void*>(static_cast<const void*>(array.data())), array.dtype(),
                                array.device_type(), array.device_id(), static_cast<int>(array.ndim()),
                                array.shape_ptr(), array.stride_ptr(), name);
}

}  // namespace flashattn::python
