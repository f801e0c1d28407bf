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
  static const char* const kCodeNames[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const std::string code = dtype.code < 7 ? kCodeNames[dtype.code] : "code" + std::to_string(dtype.code);
  std::string name = code + std::to_string(dtype.bits);
  if (dtype.lanes != 1) name += "x" + std::to_string(dtype.lanes);
  return name;
}

// `name` is the argument name used in error messages ("q", "cu_seqlens_k", ...).
// Wrong dtypes raise TypeError, anything else about the array ValueError; the
// library itself then checks shapes, strides, devices and dtypes against each other.
template <class... Config>
TensorView tensor_view_from_dlpack(const nb::ndarray<Config...>& array, const char* name) {
  using Code = nb::dlpack::dtype_code;
  const nb::dlpack::dtype dt = array.dtype();
  TensorView view;
  const auto code = static_cast<Code>(dt.code);
  if (dt.lanes == 1 && code == Code::Float && dt.bits == 32) view.dtype = DType::float32;
  else if (dt.lanes == 1 && code == Code::Float && dt.bits == 16) view.dtype = DType::float16;
  else if (dt.lanes == 1 && code == Code::Bfloat && dt.bits == 16) view.dtype = DType::bfloat16;
  else if (dt.lanes == 1 && code == Code::Int && dt.bits == 32) view.dtype = DType::int32;
  else if (dt.lanes == 1 && code == Code::UInt && dt.bits == 8) view.dtype = DType::uint8;
  else
    throw nb::type_error(("flashattn: " + std::string(name) + ": unsupported dtype: expected float32, float16, bfloat16 "
                          "(int32 for cu_seqlens, uint8 for the workspace), got " + dlpack_dtype_name(dt)).c_str());

  const int device_type = array.device_type();
  if (device_type == kDLCPU || device_type == kDLCUDAHost) view.device = Device::cpu();
  else if (device_type == kDLCUDA) view.device = Device::cuda(array.device_id());
  else
    throw nb::value_error(("flashattn: " + std::string(name) + ": unsupported device: expected cpu or cuda, got DLPack device type " +
                           std::to_string(device_type)).c_str());

  const auto rank = static_cast<int>(array.ndim());
  if (rank < 1 || rank > kMaxRank)
    throw nb::value_error(("flashattn: " + std::string(name) + ": wrong rank: expected 1 to " + std::to_string(kMaxRank) +
                           ", got " + std::to_string(rank)).c_str());
  view.rank = rank;
  view.data = const_cast<void*>(static_cast<const void*>(array.data()));  // data() includes DLPack's byte_offset
  bool is_empty = false;
  for (int d = 0; d < rank; ++d) {
    view.shape[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(array.shape(static_cast<std::size_t>(d)));
    view.strides[static_cast<std::size_t>(d)] = array.stride(static_cast<std::size_t>(d));  // DLPack: in elements
    is_empty = is_empty || view.shape[static_cast<std::size_t>(d)] == 0;
  }
  // An array without elements has meaningless strides (NumPy exports zeros); give it
  // the row-major ones so the layout checks judge only arrays that hold data.
  if (is_empty) {
    std::int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      view.strides[static_cast<std::size_t>(d)] = stride;
      stride *= view.shape[static_cast<std::size_t>(d)] > 0 ? view.shape[static_cast<std::size_t>(d)] : 1;
    }
  }
  return view;
}

}  // namespace flashattn::python
