// tests/support/host_tensor.hpp — owning host buffers for tests and tools: random
// fill (never zeros), canary fill, float64 views, and a TensorView onto them.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include "flashattn/tensor.hpp"
#include "src/core/numeric.hpp"

namespace flashattn::testing {

class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<std::int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    std::int64_t n = 1;
    for (auto s : shape_) n *= s;
    numel_ = n;
    bytes_.assign(static_cast<std::size_t>(n) * dtype_size(dtype) + 64, 0);  // +64: never a null data() for empty tensors
  }

  DType dtype() const { return dtype_; }
  std::int64_t numel() const { return numel_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }

  TensorView view() {
    TensorView t;
    t.data = data();
    t.dtype = dtype_;
    t.rank = static_cast<int>(shape_.size());
    std::int64_t stride = 1;
    for (int d = t.rank - 1; d >= 0; --d) {
      t.shape[static_cast<std::size_t>(d)] = shape_[static_cast<std::size_t>(d)];
      t.strides[static_cast<std::size_t>(d)] = stride;
      stride *= shape_[static_cast<std::size_t>(d)];
    }
    return t;
  }

  float get(std::int64_t i) const { return numeric::load_as_float(data(), dtype_, i); }
  void set(std::int64_t i, float value) { numeric::store_from_float(data(), dtype_, i, value); }

  // Normal(0, stddev) values, rounded to the dtype.
  void fill_random(std::uint64_t seed, float stddev = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, stddev);
    for (std::int64_t i = 0; i < numel_; ++i) set(i, normal(rng));
  }
  // A recognisable bit pattern (a NaN for every float dtype) to detect writes.
  void fill_canary() {
    for (std::size_t i = 0; i < bytes_.size(); ++i) bytes_[i] = static_cast<unsigned char>(0xA5 ^ (i * 7));
  }
  bool bitwise_equal(const HostTensor& other) const { return bytes_ == other.bytes_; }
  std::vector<double> to_double() const {
    std::vector<double> out(static_cast<std::size_t>(numel_));
    for (std::int64_t i = 0; i < numel_; ++i) out[static_cast<std::size_t>(i)] = get(i);
    return out;
  }

 private:
  DType dtype_ = DType::float32;
  std::vector<std::int64_t> shape_;
  std::int64_t numel_ = 0;
  std::vector<unsigned char> bytes_;
};

}  // namespace flashattn::testing
