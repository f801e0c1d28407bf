// src/cuda/hopper/dropout_mask_ring.cuh — the shared-memory slots through which the
// Hopper forward's producer warpgroup hands dropout keep masks to the consumer
// warpgroups (kernel.cuh, FLASHATTN_CUDA_HOPPER_DROPOUT=producer).
//
// A slot holds one key block's keep bits as the consumers use them: per consumer thread
// the kKeepBits = block_n / 2 bits of its accumulator fragment, in the keep words of
// dropout_fragment.hpp (bit i % 32 of word i / 32 = the thread's element i). Stored
// word-major with the threads consecutive — word w of thread t at byte 4 (w kThreads + t),
// then the last, partial word (block_n 80: 8 bits) in its narrowest type at
// 4 kFullWords kThreads + t sizeof(Tail) — so the 32 lanes of a warp read or write
// consecutive words: no bank conflicts, no swizzle. The producer writes a thread's words
// with the thread's own fragment arithmetic (its rows, its quad), so the consumer needs
// no exchange: it loads kWords values and applies them as if it had drawn them.
// The slot sizes are tile_config.hpp's (dropout_mask_slot_bytes: the launch reserves them).
#pragma once

#include <cstdint>
#include <type_traits>

namespace flashattn::cuda::hopper {

template <int kKeepBits, int kThreads>
struct DropoutMaskRing {
  static constexpr int kFullWords = kKeepBits / 32;
  static constexpr int kTailBits = kKeepBits % 32;
  static constexpr int kTailBytes = kTailBits == 0 ? 0 : kTailBits <= 8 ? 1 : kTailBits <= 16 ? 2 : 4;
  static constexpr int kWords = kFullWords + (kTailBits > 0 ? 1 : 0);
  static constexpr int kSlotBytes = kThreads * (4 * kFullWords + kTailBytes);
  using Tail = std::conditional_t<kTailBytes == 1, std::uint8_t,
                                  std::conditional_t<kTailBytes == 2, std::uint16_t, std::uint32_t>>;
  static_assert(kSlotBytes % 4 == 0, "slots start on word boundaries");

  unsigned char* base;  // slot 0; slot s at base + s kSlotBytes

  // Thread `thread`'s keep words (bits past kKeepBits are dropped).
  __device__ __forceinline__ void store(int slot, int thread, const std::uint32_t (&keep)[kWords]) const {
    unsigned char* slot_base = base + slot * kSlotBytes;
#pragma unroll
    for (int w = 0; w < kFullWords; ++w) reinterpret_cast<std::uint32_t*>(slot_base)[w * kThreads + thread] = keep[w];
    if constexpr (kTailBytes > 0)
      reinterpret_cast<Tail*>(slot_base + 4 * kFullWords * kThreads)[thread] = static_cast<Tail>(keep[kFullWords]);
  }

  // Thread `thread`'s keep words as stored (bits past kKeepBits are 0).
  __device__ __forceinline__ void load(int slot, int thread, std::uint32_t (&keep)[kWords]) const {
    const unsigned char* slot_base = base + slot * kSlotBytes;
#pragma unroll
    for (int w = 0; w < kFullWords; ++w)
      keep[w] = reinterpret_cast<const std::uint32_t*>(slot_base)[w * kThreads + thread];
    if constexpr (kTailBytes > 0)
      keep[kFullWords] = reinterpret_cast<const Tail*>(slot_base + 4 * kFullWords * kThreads)[thread];
  }
};

}  // namespace flashattn::cuda::hopper
