// src/core/checks.hpp — the building blocks of argument validation, shared by every
// entry point's validator (validate.cpp, validate_kvcache.cpp). Each check throws
// flashattn::Error naming the argument, with "expected …, got …"; none writes anything.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "flashattn/tensor.hpp"

namespace flashattn::checks {

[[noreturn]] void fail(const std::string& argument, const std::string& problem);
// Valid input that this build or backend cannot run (throws NotSupported).
[[noreturn]] void unsupported(const std::string& argument, const std::string& problem);

template <class A, class B>
std::string expected_got(const A& expected, const B& got) {
  std::ostringstream s;
  s << "expected " << expected << ", got " << got;
  return s.str();
}

std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& argument);
std::int64_t checked_add(std::int64_t a, std::int64_t b, const std::string& argument);

// Byte range [begin, end) a view can touch; empty for a tensor with no elements.
struct Extent {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  bool empty() const { return end <= begin; }
  bool overlaps(const Extent& other) const {
    return !empty() && !other.empty() && begin < other.end && other.begin < end;
  }
};
struct NamedExtent {
  std::string name;
  Extent extent;
};

// The options every entry point shares (softmax_scale, window, softcap), judged in the
// domain the kernels use: a float parameter after its conversion to float32 (a scale
// of 1e-50 would become 0, 1e39 inf), scale * log2(e) and softcap * log2(e) finite.
// Causal with a window keeps window_left and sets window_right to 0 (flash_attn).
void check_common_options(const AttentionOptions& options);

// ExecutionContext::num_threads: 0 (all hardware threads) to kMaxThreads.
inline constexpr int kMaxThreads = 1024;
void check_num_threads(int num_threads);

// Rank, non-negative sizes and strides, unit stride on the last dimension (for
// non-empty tensors), element count and byte extent that fit int64.
Extent check_layout(const TensorView& t, const std::string& name, int expected_rank);
// check_layout without the unit last stride, for tensors read element by element
// that may broadcast with zero strides anywhere (attn_mask, FP8 descales).
Extent check_any_strides(const TensorView& t, const std::string& name, int expected_rank);
// Each dimension equal to `full[d]` or 1 (broadcast); `what` names the full shape.
void check_broadcast_shape(const TensorView& t, const std::string& name, const std::vector<std::int64_t>& full,
                           const std::string& what);
// The stride of dimension d as read: 0 where the size is 1 (broadcast).
inline std::int64_t broadcast_stride(const TensorView& t, int d) { return t.size(d) == 1 ? 0 : t.stride(d); }
void check_dtype(const TensorView& t, const std::string& name, DType expected, const std::string& why);
void check_device(const TensorView& t, const std::string& name, Device expected);
void check_shape(const TensorView& t, const std::string& name, const std::vector<std::int64_t>& expected,
                 const std::string& like);
// No output may share bytes with any input or other output: a kernel reading q while
// writing out would see its own partial results.
void check_no_overlap(const std::vector<NamedExtent>& outputs, const std::vector<NamedExtent>& all);

}  // namespace flashattn::checks
