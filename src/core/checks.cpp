// src/core/checks.cpp — the shared validation building blocks (see checks.hpp).
#include "src/core/checks.hpp"

#include <cfloat>
#include <cmath>

#include "flashattn/error.hpp"
#include "flashattn/online_softmax.hpp"

namespace flashattn::checks {

[[noreturn]] void fail(const std::string& argument, const std::string& problem) {
  throw Error("flashattn: " + argument + ": " + problem);
}

[[noreturn]] void unsupported(const std::string& argument, const std::string& problem) {
  throw NotSupported("flashattn: " + argument + ": " + problem);
}

std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& argument) {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(argument, "size computation overflows int64");
  return r;
}
std::int64_t checked_add(std::int64_t a, std::int64_t b, const std::string& argument) {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail(argument, "size computation overflows int64");
  return r;
}

namespace {

std::string number(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

// A positive parameter the kernels read as float32 and multiply by log2(e): it must
// stay a normal float32 (GPU kernels flush subnormals to zero) and that product finite.
void check_float32_parameter(double value, const std::string& name, const std::string& requirement) {
  const double largest = FLT_MAX / online_softmax::kLog2e;
  if (!std::isfinite(value) || !(value > 0.0))
    fail(name, "must be finite and " + requirement + ", got " + number(value));
  if (value < FLT_MIN || value > largest)
    fail(name, "out of range: " + expected_got("a value in [" + number(FLT_MIN) + ", " + number(largest) +
                                                   "] (it is used as a float32 and times log2(e))",
                                               number(value)));
}

}  // namespace

void check_common_options(const AttentionOptions& options) {
  if (options.softmax_scale) check_float32_parameter(*options.softmax_scale, "softmax_scale", "> 0");
  if (options.softcap != 0.0) check_float32_parameter(options.softcap, "softcap", ">= 0 (0 = off)");
  if (options.window_left < -1) fail("window_left", "must be >= -1 (-1 = unbounded), got " + std::to_string(options.window_left));
  if (options.window_right < -1) fail("window_right", "must be >= -1 (-1 = unbounded), got " + std::to_string(options.window_right));
}

void check_num_threads(int num_threads) {
  if (num_threads < 0 || num_threads > kMaxThreads)
    fail("num_threads", expected_got("0 (all hardware threads) to " + std::to_string(kMaxThreads), num_threads));
}

Extent check_layout(const TensorView& t, const std::string& name, int expected_rank) {
  if (!t.defined()) fail(name, "missing tensor (rank 0)");
  if (t.rank != expected_rank) fail(name, "wrong rank: " + expected_got(expected_rank, t.rank) + " " + shape_string(t));
  std::int64_t last_offset = 0;
  bool is_empty = false;
  for (int d = 0; d < t.rank; ++d) {
    if (t.size(d) < 0) fail(name, "negative size in shape " + shape_string(t));
    if (t.stride(d) < 0) fail(name, "negative stride " + std::to_string(t.stride(d)) + " in dimension " + std::to_string(d));
    if (t.size(d) == 0) is_empty = true;
  }
  // An empty tensor touches no memory, so its strides are irrelevant (NumPy exports
  // zero strides for empty arrays).
  if (!is_empty && t.size(t.rank - 1) > 1 && t.stride(t.rank - 1) != 1)
    fail(name, "last dimension must be contiguous: stride " + expected_got(1, t.stride(t.rank - 1)));
  for (std::int64_t d = 0, n = 1; d < t.rank; ++d) n = checked_mul(n, t.size(static_cast<int>(d)), name);  // element count fits int64
  if (is_empty) return {};
  if (t.data == nullptr) fail(name, "null data pointer for a non-empty tensor");
  for (int d = 0; d < t.rank; ++d)
    last_offset = checked_add(last_offset, checked_mul(t.size(d) - 1, t.stride(d), name), name);
  const auto element = static_cast<std::int64_t>(dtype_size(t.dtype));
  const std::int64_t bytes = checked_mul(checked_add(last_offset, 1, name), element, name);
  const auto begin = reinterpret_cast<std::uintptr_t>(t.data);
  return {begin, begin + static_cast<std::uintptr_t>(bytes)};
}

Extent check_any_strides(const TensorView& t, const std::string& name, int expected_rank) {
  if (!t.defined()) fail(name, "missing tensor (rank 0)");
  if (t.rank != expected_rank) fail(name, "wrong rank: " + expected_got(expected_rank, t.rank) + " " + shape_string(t));
  bool is_empty = false;
  for (int d = 0; d < t.rank; ++d) {
    if (t.size(d) < 0) fail(name, "negative size in shape " + shape_string(t));
    if (t.stride(d) < 0) fail(name, "negative stride " + std::to_string(t.stride(d)) + " in dimension " + std::to_string(d));
    if (t.size(d) == 0) is_empty = true;
  }
  std::int64_t n = 1;
  for (int d = 0; d < t.rank; ++d) n = checked_mul(n, t.size(d), name);
  if (is_empty) return {};
  if (t.data == nullptr) fail(name, "null data pointer for a non-empty tensor");
  std::int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) last = checked_add(last, checked_mul(t.size(d) - 1, t.stride(d), name), name);
  const std::int64_t bytes = checked_mul(checked_add(last, 1, name), static_cast<std::int64_t>(dtype_size(t.dtype)), name);
  const auto begin = reinterpret_cast<std::uintptr_t>(t.data);
  return {begin, begin + static_cast<std::uintptr_t>(bytes)};
}

void check_broadcast_shape(const TensorView& t, const std::string& name, const std::vector<std::int64_t>& full,
                           const std::string& what) {
  std::string dims = "[";
  for (std::size_t i = 0; i < full.size(); ++i) dims += (i ? ", " : "") + std::to_string(full[i]);
  dims += "]";
  for (int d = 0; d < t.rank; ++d)
    if (t.size(d) != full[static_cast<std::size_t>(d)] && t.size(d) != 1)
      fail(name, "not broadcastable: " + expected_got(what + " = " + dims + " with 1 on broadcast dimensions", shape_string(t)));
}

void check_dtype(const TensorView& t, const std::string& name, DType expected, const std::string& why) {
  if (t.dtype != expected)
    fail(name, "dtype mismatch: " + expected_got(std::string(dtype_name(expected)) + why, dtype_name(t.dtype)));
}

void check_device(const TensorView& t, const std::string& name, Device expected) {
  if (t.device != expected)
    fail(name, "device mismatch: " + expected_got(to_string(expected) + " (like q)", to_string(t.device)));
}

void check_shape(const TensorView& t, const std::string& name, const std::vector<std::int64_t>& expected,
                 const std::string& like) {
  bool same = static_cast<int>(expected.size()) == t.rank;
  for (int d = 0; same && d < t.rank; ++d) same = expected[static_cast<std::size_t>(d)] == t.size(d);
  if (!same) {
    std::ostringstream e;
    e << "[";
    for (std::size_t i = 0; i < expected.size(); ++i) e << (i ? ", " : "") << expected[i];
    e << "]" << like;
    fail(name, "shape mismatch: " + expected_got(e.str(), shape_string(t)));
  }
}

void check_no_overlap(const std::vector<NamedExtent>& outputs, const std::vector<NamedExtent>& all) {
  for (const auto& o : outputs) {
    if (o.extent.empty()) continue;
    for (const auto& other : all) {
      if (&other.extent == &o.extent || other.name == o.name || other.extent.empty()) continue;
      if (o.extent.overlaps(other.extent))
        fail(o.name, "output overlaps " + other.name + " in memory");
    }
  }
}

}  // namespace flashattn::checks
