// tests/support/dense_mask_mode.hpp — the library's dense-mask conversion forced on or off
// for one scope (CPU and CUDA mask tests).
#pragma once

#include "src/core/dense_mask_blocks.hpp"

namespace flashattn::testing {

// "blocks" converts, null keeps the per-element path (the library reads
// FLASHATTN_DENSE_MASK once per process; tests override it). Outside these scopes the
// default decides (converted, unless FLASHATTN_DENSE_MASK=elements for the whole run).
class DenseMaskMode {
 public:
  explicit DenseMaskMode(const char* value) { set_dense_mask_conversion_override(value != nullptr ? 1 : 0); }
  ~DenseMaskMode() { set_dense_mask_conversion_override(-1); }
  DenseMaskMode(const DenseMaskMode&) = delete;
  DenseMaskMode& operator=(const DenseMaskMode&) = delete;
};

}  // namespace flashattn::testing
