// The decode kernel rule (src/cuda/decode/kernel_choice.hpp): pure functions of what
// the host knows about a call.
#include <gtest/gtest.h>

#include "src/cuda/decode/kernel_choice.hpp"

namespace flashattn::cuda::decode {
namespace {

constexpr DecodeKernelChoice kCpAsync{DecodeKernel::cp_async, 0};
constexpr DecodeKernelChoice kTmaWithoutPrefetch{DecodeKernel::tma, 0};

// Usable at compile time: no hidden state, no device query.
static_assert(choose_decode_kernel(true) == kTmaWithoutPrefetch);

TEST(DecodeKernelChoice, TheTmaKernelRunsWhereverItCanWithoutThePreWaitPrefetch) {
  EXPECT_EQ(choose_decode_kernel(true), kTmaWithoutPrefetch);
  EXPECT_EQ(choose_decode_kernel(true).tma_prefetch_tiles, 0);
}

TEST(DecodeKernelChoice, ElsewhereTheCpAsyncKernel) {
  // No sm_90 code (Ampere, Ada, a compute_80 PTX build), cache_batch_idx, strides a
  // tensor map cannot encode.
  EXPECT_EQ(choose_decode_kernel(false), kCpAsync);
}

TEST(DecodeKernelChoice, TheSplitHeuristicPlansOneTmaCtaPerSm) {
  for (int head_dim : {64, 128, 256}) EXPECT_EQ(planned_ctas_per_sm(DecodeKernel::tma, head_dim), 1) << head_dim;
  EXPECT_EQ(planned_ctas_per_sm(DecodeKernel::cp_async, 64), 2);
  EXPECT_EQ(planned_ctas_per_sm(DecodeKernel::cp_async, 128), 2);
  EXPECT_EQ(planned_ctas_per_sm(DecodeKernel::cp_async, 256), 1);
}

TEST(DecodeKernelChoice, TheTmaKernelStreamsWithHalfTheSmsWhenD128TilesAreWholeBoxes) {
  // Contiguous caches and pages of 64+ keys (boxes of 64 keys) at d128: half the SMs.
  EXPECT_EQ(tma_streaming_ctas(132, 64, 128), 66);
  EXPECT_EQ(tma_streaming_ctas(133, 64, 128), 67);
  // Pages of 16 / 32 keys (4-16 boxes per tile), d64 and d256: every SM.
  EXPECT_EQ(tma_streaming_ctas(132, 64, 64), 132);
  EXPECT_EQ(tma_streaming_ctas(132, 16, 128), 132);
  EXPECT_EQ(tma_streaming_ctas(132, 32, 128), 132);
  EXPECT_EQ(tma_streaming_ctas(132, 64, 256), 132);
}

}  // namespace
}  // namespace flashattn::cuda::decode
