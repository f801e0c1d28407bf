// tests/cuda/test_backward_layout.cpp — the shared-memory addressing of the dK/dV
// and dQ kernels for every entry of the tile table (pure host arithmetic, runs without a
// GPU): each ldmatrix address a lane computes with FragmentAddress equals the
// swizzled offset of the (row, chunk) the product needs, stays inside its tile, and
// the 8 rows of every 8x8 matrix fall into 8 distinct 16-byte bank groups. Every
// config fits the shared memory of its tier, and the selection (select.hpp) picks
// the tier each GPU family can run. The GPU tests run only the head dims a build
// compiles; this covers all of them.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <utility>
#include <string>

#include "src/cuda/bwd/dkdv_traits.hpp"
#include "src/cuda/bwd/dq_traits.hpp"
#include "src/cuda/bwd/fragment_address.hpp"
#include "src/cuda/bwd/select.hpp"

namespace flashattn::cuda::bwd {
namespace {

constexpr std::uint32_t kTileBase = 1u << 20;  // any 128-byte-aligned shared address

// One use of a FragmentAddress in the kernel: lanes of `warp` address rows
// row0 + lane.row + 16 i (i < row_steps) at chunks warp_chunk + lane.chunk_bit + 2 j
// (j < chunk_steps), through at(16 i, 2 j).
struct Use {
  const char* what;
  int warp_row0;      // the warp's row offset inside the tile
  int warp_chunk;     // the warp's chunk offset
  int row_steps;
  int chunk_steps;
};

template <class Tile, int kRows, int kWarpChunks>
void check_use(const Use& use, LaneRow (*pattern)(int), const std::string& config) {
  SCOPED_TRACE(std::string(use.what) + " " + config);
  std::uint32_t addresses[32] = {};
  for (int i = 0; i < use.row_steps; ++i) {
    for (int j = 0; j < use.chunk_steps; ++j) {
      for (int lane = 0; lane < 32; ++lane) {
        const LaneRow lane_row = pattern(lane);
        const FragmentAddress<Tile, kWarpChunks> address(kTileBase, use.warp_row0 + lane_row.row, use.warp_chunk,
                                                         lane_row.chunk_bit);
        const int row = use.warp_row0 + lane_row.row + 16 * i;
        const int chunk = use.warp_chunk + lane_row.chunk_bit + 2 * j;
        ASSERT_LT(row, kRows) << "row outside the tile";
        ASSERT_LT(chunk, Tile::kChunks) << "chunk outside the tile";
        addresses[lane] = address.at(16 * i, 2 * j);
        ASSERT_EQ(addresses[lane], kTileBase + 2 * Tile::chunk_offset(row, chunk))
            << "lane " << lane << " step (" << i << ", " << j << ")";
      }
      for (int matrix = 0; matrix < 4; ++matrix) {
        std::set<std::uint32_t> bank_groups;
        for (int r = 0; r < 8; ++r) bank_groups.insert((addresses[8 * matrix + r] - kTileBase) / 16 % 8);
        EXPECT_EQ(bank_groups.size(), 8u) << "bank conflict in matrix " << matrix << " step (" << i << ", " << j << ")";
      }
    }
  }
}

template <int kHeadDim, DkdvConfig kConfig = dkdv_config(kHeadDim)>
void check_config(int shared_memory_budget = kSmemTierBytes[0]) {
  using T = DkdvTraits<std::uint16_t, kHeadDim, kConfig>;
  const std::string config = "d" + std::to_string(kHeadDim) + " m" + std::to_string(T::kBlockM) + " n" +
                             std::to_string(T::kBlockN) + " w" + std::to_string(T::kWarps) + " s" +
                             std::to_string(T::kStages);
  EXPECT_LE(T::kSmemBytes, shared_memory_budget) << config << ": more shared memory than its tier allows";
  for (int warp = 0; warp < T::kWarps; ++warp) {
    // S = Q K^T, dP = dO V^T
    check_use<typename T::QTile, T::kBlockM, 0>({"Q as A", T::sdp_row0(warp), 0, T::kSdpMTiles, kHeadDim / 16},
                                                plain_a_lane, config);
    check_use<typename T::KvTile, T::kBlockN, 0>(
        {"K as B", T::sdp_col0(warp), 0, T::kSdpNTiles / 2, kHeadDim / 16}, plain_b_pair_lane, config);
    // dV = P^T dO, dK = dS^T Q
    check_use<typename T::ScoreTile, T::kBlockM, T::kPWarpChunks>(
        {"P^T as A", 0, T::kv_row0(warp) / kChunkElements, T::kBlockM / 16, T::kKvMTiles}, plain_b_pair_lane, config);
    check_use<typename T::QTile, T::kBlockM, T::kKvWarpChunks>(
        {"dO as B", 0, T::kv_col0(warp) / kChunkElements, T::kBlockM / 16, T::kKvNTiles / 2}, trans_b_pair_lane,
        config);
    // dQ = dS K
    check_use<typename T::ScoreTile, T::kBlockM, 0>({"dS as A", T::dq_row0(warp), 0, T::kDqMTiles, T::kBlockN / 16},
                                                    plain_a_lane, config);
    check_use<typename T::KvTile, T::kBlockN, T::kDqWarpChunks>(
        {"K as B (dQ)", 0, T::dq_col0(warp) / kChunkElements, T::kBlockN / 16, T::kDqNTiles / 2}, trans_b_pair_lane,
        config);
  }
}

// The dQ kernel's products: S = Q K^T, dP = dO V^T and dQ = dS K.
template <int kHeadDim, TileConfig kConfig>
void check_dq_config(int shared_memory_budget) {
  using D = DqTraits<std::uint16_t, kHeadDim, kConfig>;
  const std::string config = "dQ kernel d" + std::to_string(kHeadDim) + " m" + std::to_string(D::kBlockM) + " n" +
                             std::to_string(D::kBlockN) + " w" + std::to_string(D::kWarps) + " s" +
                             std::to_string(D::kStages);
  EXPECT_LE(static_cast<int>(D::kDqSmemBytes), shared_memory_budget) << config << ": more shared memory than its tier allows";
  for (int warp = 0; warp < D::kWarps; ++warp) {
    check_use<typename D::QTile, D::kBlockM, 0>({"Q as A", D::sdp_row0(warp), 0, D::kSdpMTiles, kHeadDim / 16},
                                                plain_a_lane, config);
    check_use<typename D::KvTile, D::kBlockN, 0>(
        {"K as B", D::sdp_col0(warp), 0, D::kSdpNTiles / 2, kHeadDim / 16}, plain_b_pair_lane, config);
    check_use<typename D::ScoreTile, D::kBlockM, 0>({"dS as A", D::dq_row0(warp), 0, D::kDqMTiles, D::kBlockN / 16},
                                                    plain_a_lane, config);
    check_use<typename D::KvTile, D::kBlockN, D::kDqWarpChunks>(
        {"K as B (dQ)", 0, D::dq_col0(warp) / kChunkElements, D::kBlockN / 16, D::kDqNTiles / 2}, trans_b_pair_lane,
        config);
  }
}

template <int kHeadDim, SmemTier kTier>
void check_tier() {
  constexpr int kBudget = kSmemTierBytes[static_cast<int>(kTier)];
  check_config<kHeadDim, dkdv_config(kHeadDim, kTier)>(kBudget);
  check_dq_config<kHeadDim, dq_config(kHeadDim, kTier)>(kBudget);
  // Below the hopper tier the dQ of the dK/dV kernel cannot rely on the sm_90 bulk reduction.
  if (kTier != SmemTier::hopper) EXPECT_TRUE(dkdv_config(kHeadDim, kTier).dq_atomics) << "d" << kHeadDim;
}

template <int kHeadDim>
void check_every_tier() {
  check_tier<kHeadDim, SmemTier::hopper>();
  check_tier<kHeadDim, SmemTier::ampere>();
  check_tier<kHeadDim, SmemTier::compact>();
}

TEST(BackwardLayout, EveryTableEntryAddressesItsTilesExactly) {
  check_every_tier<32>();
  check_every_tier<64>();
  check_every_tier<96>();
  check_every_tier<128>();
  check_every_tier<192>();
  check_every_tier<256>();
}

// The opt-in shared memory per block of each GPU family (cudaDevAttrMaxSharedMemoryPerBlockOptin).
constexpr DeviceLimits kH100{232448, true};
constexpr DeviceLimits kA100{166912, false};
constexpr DeviceLimits kSm86{101376, false};  // also sm_89 and sm_120

TEST(BackwardSelection, EachGpuFamilyRunsItsTier) {
  for (const int d : kHeadDims) {
    SCOPED_TRACE("d" + std::to_string(d));
    const auto h100 = select_kernels(d, kH100), a100 = select_kernels(d, kA100), sm86 = select_kernels(d, kSm86);
    ASSERT_TRUE(h100 && a100 && sm86);
    // Tiers with equal configs select the first of them: compare the configs.
    EXPECT_EQ(dkdv_config(d, h100->dkdv), dkdv_config(d, SmemTier::hopper));
    EXPECT_EQ(dq_config(d, h100->dq), dq_config(d, SmemTier::hopper));
    EXPECT_EQ(dkdv_config(d, a100->dkdv), dkdv_config(d, SmemTier::ampere));
    EXPECT_EQ(dq_config(d, a100->dq), dq_config(d, SmemTier::ampere));
    EXPECT_EQ(dkdv_config(d, sm86->dkdv), dkdv_config(d, SmemTier::compact));
    EXPECT_EQ(dq_config(d, sm86->dq), dq_config(d, SmemTier::compact));
  }
}

TEST(BackwardSelection, StagedDqNeedsBulkReductions) {
  // 227 KB but code compiled for sm_80 (a newer GPU running the JIT-compiled PTX).
  for (const int d : kHeadDims) {
    const auto choice = select_kernels(d, DeviceLimits{232448, false});
    ASSERT_TRUE(choice) << "d" << d;
    EXPECT_TRUE(dkdv_config(d, choice->dkdv).dq_atomics) << "d" << d;
  }
  // An H100 capped at 163 KB (as the GPU test does): the hopper configs that fit stay.
  EXPECT_EQ(select_kernels(32, DeviceLimits{166912, true})->dkdv, SmemTier::hopper);
  EXPECT_EQ(select_kernels(96, DeviceLimits{166912, true})->dkdv, SmemTier::hopper);
  EXPECT_EQ(select_kernels(128, DeviceLimits{166912, true})->dkdv, SmemTier::ampere);
}

TEST(BackwardSelection, RefusesWhereNothingFits) {
  for (const int d : kHeadDims) EXPECT_FALSE(select_kernels(d, DeviceLimits{48 * 1024, true})) << "d" << d;
  EXPECT_FALSE(select_kernels(80, kH100)) << "not a kernel head dim";
}

// Shared memory of the tier's kernels, dK/dV and dQ, for a head dim known at run time.
std::pair<int, int> smem_bytes(int head_dim, SmemTier tier) {
  const int t = static_cast<int>(tier);
  switch (head_dim) {
    case 32: return {kDkdvSmemBytes<32>[t], kDqSmemBytes<32>[t]};
    case 64: return {kDkdvSmemBytes<64>[t], kDqSmemBytes<64>[t]};
    case 96: return {kDkdvSmemBytes<96>[t], kDqSmemBytes<96>[t]};
    case 128: return {kDkdvSmemBytes<128>[t], kDqSmemBytes<128>[t]};
    case 192: return {kDkdvSmemBytes<192>[t], kDqSmemBytes<192>[t]};
    default: return {kDkdvSmemBytes<256>[t], kDqSmemBytes<256>[t]};
  }
}

// The selected tier is canonical (the instantiated one), fits the device, and no
// earlier tier would have: from 64 KB to 227 KB in 1 KB steps.
TEST(BackwardSelection, SelectedConfigsFitTheDevice) {
  for (const int d : kHeadDims)
    for (int limit = 64 * 1024; limit <= 232448; limit += 1024)
      for (const bool has_bulk_reduce : {false, true}) {
        const auto choice = select_kernels(d, DeviceLimits{limit, has_bulk_reduce});
        if (!choice) continue;
        EXPECT_EQ(canonical_dkdv_tier(d, choice->dkdv), choice->dkdv);
        EXPECT_EQ(canonical_dq_tier(d, choice->dq), choice->dq);
        EXPECT_TRUE(has_bulk_reduce || dkdv_config(d, choice->dkdv).dq_atomics);
        EXPECT_LE(smem_bytes(d, choice->dkdv).first, limit);
        EXPECT_LE(smem_bytes(d, choice->dq).second, limit);
        for (int t = 0; t < static_cast<int>(choice->dkdv); ++t) {
          const auto tier = static_cast<SmemTier>(t);
          const bool runs = has_bulk_reduce || dkdv_config(d, tier).dq_atomics;
          EXPECT_FALSE(runs && smem_bytes(d, tier).first <= limit) << "d" << d << " limit " << limit << " tier " << t;
        }
      }
}

// The alternatives bwd_timing compares (other warp grids, 16 warps, block_m 32).
TEST(BackwardLayout, AlternativeConfigsAddressTheirTilesExactly) {
  check_config<64, DkdvConfig{64, 128, 8, 2, 2, 4, 4}>();
  check_config<64, DkdvConfig{128, 128, 8, 2, 4, 4, 4}>();
  check_config<64, DkdvConfig{128, 128, 16, 2, 4, 8, 8}>();
  check_config<128, DkdvConfig{64, 128, 8, 2, 2, 4, 4}>();
  check_config<128, DkdvConfig{32, 128, 8, 2, 2, 8, 2}>();
  check_config<128, DkdvConfig{64, 128, 16, 2, 2, 8, 4}>();
  check_config<256, DkdvConfig{32, 64, 8, 2, 2, 4, 2}>();
}

}  // namespace
}  // namespace flashattn::cuda::bwd
