// tools/problem.hpp — one attention problem as the CLI describes it (shape, dtype,
// device, mask, algorithm, threads), parsing of the option values, FLOP counts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "flashattn/tensor.hpp"

namespace flashattn::tools {

struct Problem {
  Device device = Device::cpu();
  DType dtype = DType::float32;
  std::int64_t batch = 2;
  std::int64_t heads = 16;     // query heads
  std::int64_t heads_kv = 16;  // key/value heads (GQA when fewer)
  std::int64_t head_dim = 64;
  std::int64_t seqlen_q = 2048;
  std::int64_t seqlen_k = 2048;
  bool causal = false;
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  double softcap = 0.0;
  Algorithm algorithm = Algorithm::automatic;
  int threads = 0;  // CPU threads, 0 = all

  AttentionOptions options() const;
  // "q [2, 2048, 16, 64]  k/v [2, 2048, 16, 64]" (batch, seqlen, heads, head_dim)
  std::string shape_text() const;
  // "causal", "window (128, 0)", "softcap 30", "full", combined.
  std::string mask_text() const;
  // The forward FLOPs actually needed: 4 * head_dim per (query row, visible key)
  // pair, per batch item and head (two matmuls of 2 FLOPs per multiply-add). Pairs
  // are counted exactly with the mask rule; for causal with seqlen_q == seqlen_k
  // that is N(N+1)/2 per head, within 0.2% of the usual N²/2 for N >= 512.
  double forward_flops() const;
  // The backward pass: 2.5x the forward (four matmuls plus recomputing QK^T).
  double backward_flops() const { return 2.5 * forward_flops(); }
  // Threads the CPU backend will use (resolves 0 to the hardware count); 0 on CUDA.
  int effective_threads() const;
};

// Option parsing helpers; each throws std::invalid_argument naming the value.
Device parse_device(const std::string& text);  // cpu | cuda | cuda:N | auto
DType parse_dtype(const std::string& text);    // float32|fp32|float16|fp16|half|bfloat16|bf16
Algorithm parse_algorithm(const std::string& text);
std::vector<std::int64_t> parse_int_list(const std::string& text);  // "512,1024,2048"

// "auto" resolves to the GPU when this build has CUDA and one is present.
Device resolve_device(const std::string& text);
// "auto" dtype: float16 on the GPU, float32 on the CPU.
DType resolve_dtype(const std::string& text, Device device);

double median(std::vector<double> values);

}  // namespace flashattn::tools
