// flashattn/fp8.hpp — quantising attention inputs to FP8 (float8_e4m3) for the FP8
// forward pass (AttentionOptions::maybe_{q,k,v}_descale).
//
// quantize_fp8 stores x as e4m3 codes with one float32 descale per (batch, group of
// heads):   descale[b, g] = amax[b, g] / 448   (1 where amax is 0)
//           out[b, s, h, :] = e4m3(y[b, s, h, :] / descale[b, h / (heads / groups)])
// where amax[b, g] = max |y| over the rows of batch b and the heads of group g, and
// e4m3() rounds to nearest even (PyTorch's .to(torch.float8_e4m3fn)). Dequantised:
// y ≈ descale * out. For attention's q pass groups = heads_kv (a q descale covers the
// query heads that share a kv head, FA3's [batch, heads_kv]); for k and v groups =
// heads_kv too. A varlen tensor [total, heads, head_dim] is one batch: descale [1,
// groups], to be broadcast over the sequences (a zero-stride [batch, heads_kv] view).
//
// Incoherent processing (FA3, QuIP#): with `incoherent`, y = x R with the orthogonal
// R = H diag(s) / sqrt(head_dim): H the Sylvester-Hadamard matrix (H[i][j] =
// (-1)^popcount(i & j)) and s_j = hadamard_sign(seed, j) in {-1, +1}. Because
// R R^T = I, (q R)(k R)^T = q k^T: apply it to q and k with the SAME seed, never to v
// (out = P v needs v itself). It spreads an outlier over the whole head dim before the
// amax is taken, so the other elements keep their precision: on N(0,1) inputs with
// 0.1% N(0,100) outliers the attention RMSE drops 1.2-1.8x (tests/cpu/test_fp8.cpp).
// head_dim must then be a power of two in [32, 256].
//
// Inputs must be finite: an Inf makes its group's descale Inf; a NaN stays NaN.
#pragma once

#include <cstdint>

#include "flashattn/attention.hpp"
#include "flashattn/config.hpp"
#include "flashattn/tensor.hpp"

namespace flashattn {

inline constexpr float kFloat8E4M3Max = 448.0f;  // the largest finite e4m3 value

struct QuantizeFp8Options {
  bool incoherent = false;  // rotate the head dim by R = H diag(s) / sqrt(head_dim) first
  std::uint64_t seed = 0;   // s_j = hadamard_sign(seed, j); q and k must share it
};

// The random sign s_j of incoherent processing: a fixed function of (seed, j) (the
// top bit of SplitMix64's output for seed + j), the same on every backend.
FLASHATTN_HOST_DEVICE float hadamard_sign(std::uint64_t seed, std::int64_t index) {
  std::uint64_t z = seed + static_cast<std::uint64_t>(index) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (z >> 63) ? -1.0f : 1.0f;
}

// x: float32/float16/bfloat16 [batch, seqlen, heads, head_dim] or [total, heads,
// head_dim] (any strides, unit last); out: float8_e4m3 of x's shape (written);
// descale: float32 [batch, groups] ([1, groups] for rank-3 x), groups dividing heads
// (written). CPU tensors run on the CPU, CUDA tensors on context.stream.
void quantize_fp8(const TensorView& x, const TensorView& out, const TensorView& descale,
                  const QuantizeFp8Options& options = {}, const ExecutionContext& context = {});

}  // namespace flashattn
