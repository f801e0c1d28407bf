// src/core/tensor.cpp — TensorView helpers and names.
#include <sstream>

#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "flashattn/tensor.hpp"

namespace flashattn {

std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32: return 4;
    case DType::float16: return 2;
    case DType::bfloat16: return 2;
    case DType::int32: return 4;
    case DType::uint8: return 1;
    case DType::int64: return 8;
    case DType::boolean: return 1;
    case DType::float8_e4m3: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::int32: return "int32";
    case DType::uint8: return "uint8";
    case DType::int64: return "int64";
    case DType::boolean: return "bool";
    case DType::float8_e4m3: return "float8_e4m3fn";
  }
  return "unknown";
}

const char* algorithm_name(Algorithm algorithm) noexcept {
  switch (algorithm) {
    case Algorithm::automatic: return "automatic";
    case Algorithm::reference: return "reference";
    case Algorithm::flash2: return "flash2";
    case Algorithm::flash1: return "flash1";
    case Algorithm::flash3: return "flash3";
  }
  return "unknown";
}

std::string to_string(Device device) {
  if (device.type == DeviceType::cpu) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

std::string shape_string(const TensorView& tensor) {
  std::ostringstream s;
  s << "[";
  for (int d = 0; d < tensor.rank; ++d) s << (d ? ", " : "") << tensor.size(d);
  s << "]";
  return s.str();
}

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) {
    if (shape[static_cast<std::size_t>(d)] < 0) throw Error("flashattn: tensor: negative size in shape " + shape_string(*this));
    if (__builtin_mul_overflow(n, shape[static_cast<std::size_t>(d)], &n))
      throw Error("flashattn: tensor: element count of shape " + shape_string(*this) + " overflows int64");
  }
  return n;
}

bool TensorView::is_contiguous() const noexcept {
  std::int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (size(d) != 1 && stride(d) != expected) return false;
    expected *= size(d);
  }
  return true;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape, Device device) {
  if (shape.size() > static_cast<std::size_t>(kMaxRank) || shape.size() == 0)
    throw Error("flashattn: tensor: rank must be 1.." + std::to_string(kMaxRank) + ", got " + std::to_string(shape.size()));
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = static_cast<int>(shape.size());
  std::size_t i = 0;
  for (auto s : shape) t.shape[i++] = s;
  std::int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.strides[static_cast<std::size_t>(d)] = stride;
    stride *= t.shape[static_cast<std::size_t>(d)] > 0 ? t.shape[static_cast<std::size_t>(d)] : 1;
  }
  return t;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               std::initializer_list<std::int64_t> strides, Device device) {
  if (shape.size() != strides.size())
    throw Error("flashattn: tensor: shape and strides differ in rank (" + std::to_string(shape.size()) + " vs " +
                std::to_string(strides.size()) + ")");
  TensorView t = contiguous(data, dtype, shape, device);
  std::size_t i = 0;
  for (auto s : strides) t.strides[i++] = s;
  return t;
}

}  // namespace flashattn
