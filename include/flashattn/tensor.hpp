// flashattn/tensor.hpp — a non-owning, framework-free view of a strided tensor.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace flashattn {

// boolean: one byte per element, 0 = false (attention masks). float8_e4m3: OCP FP8
// E4M3 (PyTorch's float8_e4m3fn: no infinities, one NaN encoding, max 448).
enum class DType : std::uint8_t { float32, float16, bfloat16, int32, uint8, int64, boolean, float8_e4m3 };

std::size_t dtype_size(DType dtype) noexcept;
const char* dtype_name(DType dtype) noexcept;

enum class DeviceType : std::uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA ordinal; always 0 for the CPU

  static constexpr Device cpu() noexcept { return {DeviceType::cpu, 0}; }
  static constexpr Device cuda(int ordinal = 0) noexcept { return {DeviceType::cuda, ordinal}; }
  friend constexpr bool operator==(const Device&, const Device&) = default;
};

std::string to_string(Device device);

inline constexpr int kMaxRank = 4;

// data + dtype + device + shape + strides (in elements, not bytes). Only the last
// dimension must have unit stride; batch, row and head strides are arbitrary int64.
// rank == 0 means "no tensor": optional arguments are named maybe_* and left default.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::float32;
  Device device{};
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> strides{};

  bool defined() const noexcept { return rank > 0; }
  std::int64_t size(int dim) const noexcept { return shape[static_cast<std::size_t>(dim)]; }
  std::int64_t stride(int dim) const noexcept { return strides[static_cast<std::size_t>(dim)]; }
  // Product of the shape; throws flashattn::Error if it overflows int64.
  std::int64_t numel() const;
  bool is_contiguous() const noexcept;

  // Row-major (C-order) view of `shape`.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               Device device = Device::cpu());
  static TensorView strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                            std::initializer_list<std::int64_t> strides, Device device = Device::cpu());
};

std::string shape_string(const TensorView& tensor);

}  // namespace flashattn
