// tests/cuda/test_backward_layout.cpp — the shared-memory addressing of the dK/dV
// kernel for every entry of the tile table (pure host arithmetic, runs without a
// GPU): each ldmatrix address a lane computes with FragmentAddress equals the
// swizzled offset of the (row, chunk) the product needs, stays inside its tile, and
// the 8 rows of every 8x8 matrix fall into 8 distinct 16-byte bank groups. The GPU
// tests run only the head dims a build compiles; this covers all of them.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>

#include "src/cuda/bwd/dkdv_traits.hpp"
#include "src/cuda/bwd/fragment_address.hpp"

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
void check_config() {
  using T = DkdvTraits<std::uint16_t, kHeadDim, kConfig>;
  const std::string config = "d" + std::to_string(kHeadDim) + " m" + std::to_string(T::kBlockM) + " n" +
                             std::to_string(T::kBlockN) + " w" + std::to_string(T::kWarps);
  EXPECT_LE(T::kSmemBytes, 227 * 1024) << config << ": more shared memory than an H100 CTA may use";
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

TEST(BackwardLayout, EveryTableEntryAddressesItsTilesExactly) {
  check_config<32>();
  check_config<64>();
  check_config<96>();
  check_config<128>();
  check_config<192>();
  check_config<256>();
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
