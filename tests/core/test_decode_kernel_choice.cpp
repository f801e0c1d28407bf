// The decode kernel rule (src/cuda/decode/kernel_choice.hpp): a pure function of what
// the host knows about a call, checked on the measured shapes and at its edge.
#include <gtest/gtest.h>

#include "src/cuda/decode/kernel_choice.hpp"

namespace flashattn::cuda::decode {
namespace {

constexpr DecodeKernelChoice kCpAsync{DecodeKernel::cp_async, 0};
constexpr DecodeKernelChoice kTmaWithoutPrefetch{DecodeKernel::tma, 0};

// Usable at compile time: no hidden state, no device query.
static_assert(choose_decode_kernel(true, 1024, true) == kTmaWithoutPrefetch);

TEST(DecodeKernelChoice, ShortPagedCachesRunTheTmaKernelWithoutPrefetch) {
  // Batch 8 / 64 at KV 1k, paged 16 or 256 (H100, 2026-11-25: 20.3 vs 24.6 us at batch 8).
  EXPECT_EQ(choose_decode_kernel(true, 1024, true), kTmaWithoutPrefetch);
  EXPECT_EQ(choose_decode_kernel(true, 1, true), kTmaWithoutPrefetch);
  EXPECT_EQ(choose_decode_kernel(true, 0, true), kTmaWithoutPrefetch);  // an empty cache: either kernel, no work
}

TEST(DecodeKernelChoice, LongerPagedCachesStayOnCpAsync) {
  // KV 4k paged: the cp.async kernel was 3.5% faster; from the first key past the bound.
  EXPECT_EQ(choose_decode_kernel(true, kShortPagedKeyRange + 1, true), kCpAsync);
  EXPECT_EQ(choose_decode_kernel(true, 4096, true), kCpAsync);
  EXPECT_EQ(choose_decode_kernel(true, 131072, true), kCpAsync);
}

TEST(DecodeKernelChoice, ContiguousCachesStayOnCpAsync) {
  // Contiguous KV 1k: 20.7 us cp.async vs 21.8 TMA; longer ranges within noise.
  for (std::int64_t keys : {0, 1, 1024, 4096, 65536, 131072})
    EXPECT_EQ(choose_decode_kernel(false, keys, true), kCpAsync) << keys;
}

TEST(DecodeKernelChoice, TheLibraryKeepsTheCpAsyncKernelUntilTheTmaKernelIsRacecheckClean) {
  // The library's own calls pass kAutomaticTma (false while kernel_tma.cuh's racecheck
  // report stands): cp.async everywhere.
  static_assert(!kAutomaticTma);
  for (bool paged : {false, true})
    for (std::int64_t keys : {0, 1024, 4096}) EXPECT_EQ(choose_decode_kernel(paged, keys), kCpAsync) << paged << keys;
}

}  // namespace
}  // namespace flashattn::cuda::decode
