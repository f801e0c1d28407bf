// src/cpu/flash.hpp — the CPU attention algorithms behind cpu::forward/backward.
#pragma once

#include <omp.h>

#include "src/core/params.hpp"

namespace flashattn::cpu {

// FlashAttention-2 forward (flash2_forward.cpp): Q blocks outer, K/V blocks inner,
// delayed normalisation. The automatic choice on the CPU.
void flash2_forward(const AttentionParams& params, int num_threads);

// FlashAttention-1 forward (flash1_forward.cpp): K/V blocks outer, Q blocks inner,
// O/l/m rescaled and stored every step (seeds 000/003, Algorithm 1).
void flash1_forward(const AttentionParams& params, int num_threads);

// Flash backward by recomputation from the LSE (flash_backward.cpp).
void flash_backward(const BackwardParams& params, int num_threads);

// ExecutionContext::num_threads: 0 = all hardware threads (OpenMP's default).
inline int thread_count(int num_threads) { return num_threads > 0 ? num_threads : omp_get_max_threads(); }

}  // namespace flashattn::cpu
