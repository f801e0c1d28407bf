// tests/cuda/test_backward_hopper.cpp — the Hopper (sm_90a) backward kernel
// (src/cuda/hopper_bwd) through the public API, against the float64 oracle with the
// gradient rule of test_backward.cpp: head dims 64, 128 (kernel.cuh) and 256 (kernel_wide.cuh), both dtypes, tails
// of both sequence lengths, ring wrap-around (many query blocks per key block), GQA,
// causal/window/softcap masks, varlen with empty sequences, dK/dV bitwise
// stability, and deterministic mode (dQ reductions ordered by key block: bitwise
// repeatable, equal to the default mode up to summation order). On a GPU without the
// kernel (or a build without it) the same cases run on the FA2-class kernel; the
// dispatch test says which. ALiBi (slopes per head and per (batch, head)) and dropout
// (p = 0.1, 0.5) on both kernels: against the oracle computed with the same slopes and
// the same seed/offset (a run with another seed is checked to be far outside the
// tolerance, so passing proves the regenerated mask equals the forward's bit for bit),
// repeatable bitwise, the seed/offset read from memory equal to the host values.
// Skips without a GPU.
#include "tests/cuda/backward_case.hpp"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "src/cuda/hopper_bwd/launch.hpp"

namespace flashattn {
namespace {

class CudaBackwardHopper : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// The kernels' head dims (64: block_m 128, dQ split by rows; 128: block_m 64, dQ split by
// columns; 256: the wide kernel, head dim split between the consumers).
constexpr std::int64_t kHeadDims[] = {64, 128, 256};
// Deterministic mode (ordered dQ reductions) in both kernels.
constexpr std::int64_t kDeterministicHeadDims[] = {64, 128, 256};

Case hopper_case(DType dtype, std::int64_t seqlen_q, std::int64_t seqlen_k, bool causal, std::int64_t head_dim = 128) {
  Case c;
  c.dtype = dtype, c.head_dim = head_dim, c.seqlen_q = seqlen_q, c.seqlen_k = seqlen_k, c.causal = causal;
  c.seed = static_cast<std::uint64_t>(seqlen_q * 1000 + seqlen_k);
  return c;
}

// Which kernel the dispatch picks for a plain d128 problem on this GPU: the Hopper one
// wherever it is built and the device is sm_90 (so the cases below test it there).
TEST_F(CudaBackwardHopper, DispatchPicksTheHopperKernelOnSm90) {
  Case c = hopper_case(DType::bfloat16, 256, 256, false);
  Problem p(c);
  HostTensor dq(c.dtype, p.q_shape), dk(c.dtype, p.k_shape), dv(c.dtype, p.k_shape);
  BackwardArgs args;
  const Device gpu = Device::cuda(0);
  std::vector<std::unique_ptr<DeviceCopy>> buffers;
  auto on_device = [&](const HostTensor& host) {
    buffers.push_back(std::make_unique<DeviceCopy>(host.numel() * dtype_size(host.dtype())));
    return Problem::on(host, buffers.back()->data(), gpu);
  };
  args.q = on_device(p.q), args.k = on_device(p.k), args.v = on_device(p.v), args.out = on_device(p.out);
  buffers.push_back(std::make_unique<DeviceCopy>(p.dout.numel() * dtype_size(c.dtype)));
  args.dout = p.dout_view(buffers.back()->data(), gpu);
  args.lse = on_device(p.lse), args.dq = on_device(dq), args.dk = on_device(dk), args.dv = on_device(dv);
  const BackwardParams params = validate_backward(args);
  const std::string reason = cuda::hopper_bwd::why_unsupported(params);
  int device = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), cudaSuccess);
  if (reason.rfind("no Hopper backward kernel in this build", 0) == 0 || reason.rfind("disabled by", 0) == 0)
    GTEST_SKIP() << reason;
  if (major * 10 + minor == 90) {
    EXPECT_EQ(reason, "") << "d128 bf16 should run on the Hopper backward kernel";
  } else {
    EXPECT_NE(reason, "") << "the Hopper backward kernel must not run on compute capability " << major << "." << minor;
  }
  // Deterministic mode runs wherever the default mode does (ordered dQ reductions);
  // unaligned strides stay on the FA2-class kernels.
  BackwardParams deterministic = params;
  deterministic.deterministic = true;
  EXPECT_EQ(cuda::hopper_bwd::why_unsupported(deterministic), reason);
  BackwardParams head_dim_256 = params;
  head_dim_256.head_dim = 256;
  const std::string reason_256 = cuda::hopper_bwd::why_unsupported(head_dim_256);
  if (major * 10 + minor == 90 && reason.empty() && reason_256.rfind("head_dim 256 not built", 0) != 0)
    EXPECT_EQ(reason_256, "") << "d256 should run on the wide Hopper backward kernel";
  head_dim_256.deterministic = true;
  EXPECT_EQ(cuda::hopper_bwd::why_unsupported(head_dim_256), reason_256);
  BackwardParams unaligned = params;
  unaligned.dout_row_stride += 3;
  EXPECT_NE(cuda::hopper_bwd::why_unsupported(unaligned), "");
  BackwardParams other_head_dim = params;
  other_head_dim.head_dim = 96;
  EXPECT_NE(cuda::hopper_bwd::why_unsupported(other_head_dim), "");
  if (major * 10 + minor == 90 && reason.empty()) {
    BackwardParams head_dim_64 = params;
    head_dim_64.head_dim = 64;
    const std::string reason_64 = cuda::hopper_bwd::why_unsupported(head_dim_64);
    if (reason_64.rfind("head_dim 64 not built", 0) != 0)  // a build with FLASHATTN_CUDA_HEAD_DIMS=128
      EXPECT_EQ(reason_64, "") << "d64 should run on the Hopper backward kernel too";
  }
}

// kernel.cuh's schedule, the CTA order and the grid follow FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE,
// FLASHATTN_CUDA_HOPPER_BWD_ORDER and FLASHATTN_CUDA_HOPPER_BWD_GRID(_CTAS) (ctest runs this
// binary again as "lockstep.*", "deferred_dk.*", "l2_order.*", "persistent_grid*" and
// "dq_handoff_early*" with some of them set: this pins that the cases there really run them).
TEST_F(CudaBackwardHopper, ScheduleFollowsTheEnvironment) {
  auto is_set_to = [](const char* name, const std::string& expected) {
    const char* value = std::getenv(name);
    return value != nullptr && std::string(value) == expected;
  };
  using cuda::hopper_bwd::BackwardSchedule;
  const char* const kSchedule = "FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE";
  const BackwardSchedule expected = is_set_to(kSchedule, "lockstep")      ? BackwardSchedule::lockstep
                                    : is_set_to(kSchedule, "deferred_dk") ? BackwardSchedule::deferred_dk
                                                                          : BackwardSchedule::overlapped;
  EXPECT_EQ(cuda::hopper_bwd::backward_schedule(), expected);
  EXPECT_EQ(cuda::hopper_bwd::is_l2_section_order_requested(),
            is_set_to("FLASHATTN_CUDA_HOPPER_BWD_ORDER", "l2_sections"));
  // "dq_handoff_early*" (the early dQ hand-off of the overlapped schedules; late by default).
  EXPECT_EQ(cuda::hopper_bwd::is_dq_handoff_late_enabled(), !is_set_to("FLASHATTN_CUDA_HOPPER_BWD_DQ_HANDOFF", "early"));
  EXPECT_EQ(cuda::hopper_bwd::is_epilogue_tma_requested(), is_set_to("FLASHATTN_CUDA_HOPPER_BWD_EPILOGUE", "tma"));
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) GTEST_SKIP() << "no SM count";
  const cuda::hopper_bwd::BackwardGrid grid = cuda::hopper_bwd::persistent_grid(0);
  const bool is_dynamic = is_set_to("FLASHATTN_CUDA_HOPPER_BWD_GRID", "dynamic");
  if (!is_set_to("FLASHATTN_CUDA_HOPPER_BWD_GRID", "persistent") && !is_dynamic) {
    EXPECT_EQ(grid.ctas, 0) << "one CTA per tile unless a persistent grid is asked for";
  } else {
    const char* cap = std::getenv("FLASHATTN_CUDA_HOPPER_BWD_GRID_CTAS");
    const int ctas = cap != nullptr ? std::atoi(cap) : 0;
    EXPECT_EQ(grid.ctas, ctas > 0 ? std::min(ctas, sms) : sms);
    EXPECT_EQ(grid.is_dynamic, is_dynamic);
  }
}

// The grid of a call (launch.hpp's backward_grid): the environment's when it names one,
// else the dynamic grid on every SM for causal problems of at most 4k keys without device
// masks or deterministic turns, one CTA per tile for the rest.
TEST_F(CudaBackwardHopper, GridFollowsTheProblemUnlessAsked) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) GTEST_SKIP() << "no SM count";
  BackwardParams causal_1k;
  causal_1k.seqlen_q = causal_1k.seqlen_k = 1024;
  causal_1k.is_causal = true;
  causal_1k.window_right = 0;
  BackwardParams causal_16k = causal_1k;
  causal_16k.seqlen_q = causal_16k.seqlen_k = 16384;
  BackwardParams full_1k = causal_1k;
  full_1k.is_causal = false;
  full_1k.window_right = -1;
  BackwardParams windowed_1k = causal_1k;
  windowed_1k.window_left = 256;
  BackwardParams deterministic_1k = causal_1k;
  deterministic_1k.deterministic = true;
  BackwardParams deterministic_full_1k = full_1k;
  deterministic_full_1k.deterministic = true;
  BackwardParams deterministic_full_16k = deterministic_full_1k;
  deterministic_full_16k.seqlen_q = deterministic_full_16k.seqlen_k = 16384;
  BackwardParams block_masked_1k = full_1k;  // the rule reads only whether a block mask is present
  block_masked_1k.block_mask.block_m = block_masked_1k.block_mask.block_n = 128;
  BackwardParams block_masked_16k = block_masked_1k;
  block_masked_16k.seqlen_q = block_masked_16k.seqlen_k = 16384;
  using cuda::hopper_bwd::backward_grid;
  if (std::getenv("FLASHATTN_CUDA_HOPPER_BWD_GRID") != nullptr) {
    for (const BackwardParams* params : {&causal_1k, &causal_16k, &full_1k}) {
      const cuda::hopper_bwd::BackwardGrid asked = cuda::hopper_bwd::persistent_grid(0), got = backward_grid(*params, 0);
      EXPECT_EQ(got.ctas, asked.ctas);
      EXPECT_EQ(got.is_dynamic, asked.is_dynamic);
    }
    return;
  }
  for (const BackwardParams* params : {&causal_1k, &deterministic_full_1k, &block_masked_1k}) {
    const cuda::hopper_bwd::BackwardGrid dynamic = backward_grid(*params, 0);
    EXPECT_EQ(dynamic.ctas, sms);
    EXPECT_TRUE(dynamic.is_dynamic);
  }
  for (const BackwardParams* params :
       {&causal_16k, &full_1k, &windowed_1k, &deterministic_1k, &deterministic_full_16k, &block_masked_16k})
    EXPECT_EQ(backward_grid(*params, 0).ctas, 0);
}

// The persistent grids (kernel.cuh: CTAs looping over tiles, the ring and the K/V buffers
// running on from one tile into the next), the static walk and the dynamic claims (in the
// L2-section order), against the per-tile grid in one process: grids of 1, 3 and 7 CTAs, so
// every CTA runs many tiles, including tiles past a varlen sequence's keys and tiles without
// a step (empty sequences). Deterministic mode: dQ, dK, dV bitwise equal to the per-tile grid
// (the same turns; a CTA only waits for tiles of lower index, which it or a resident CTA has
// run or will run before any higher one). Default mode: dK, dV bitwise equal (summed in
// registers in a fixed order), dQ within the oracle's tolerance. (The wide kernel, d256,
// keeps one CTA per tile.)
TEST_F(CudaBackwardHopper, PersistentGridMatchesThePerTileGrid) {
  struct GridOverride {  // the process's own grid again when the test ends, even on failure
    ~GridOverride() { cuda::hopper_bwd::override_persistent_grid_ctas(-1); }
  } restore;
  for (std::int64_t d : {64, 128})
    for (bool deterministic : {true, false})
      for (bool causal : {true, false}) {
        Case c = hopper_case(causal ? DType::bfloat16 : DType::float16, 0, 0, causal, d);
        c.varlen_q = {0, 1, 70, 300, 5, 0, 260, 129};
        c.varlen_k = {3, 1, 200, 290, 0, 0, 400, 64};
        c.batch = 8, c.heads_q = 8, c.heads_kv = 2, c.deterministic = deterministic;
        if (!causal) c.window_left = 100, c.window_right = 20;
        SCOPED_TRACE(c.name());
        Problem p(c);
        cuda::hopper_bwd::override_persistent_grid_ctas(0);
        const std::vector<Gradients> per_tile = run_cuda(p, 1);
        for (const bool is_dynamic : {false, true})
        for (int ctas : {1, 3, 7}) {
          SCOPED_TRACE(std::string(is_dynamic ? "dynamic" : "static") + " persistent grid of " +
                       std::to_string(ctas) + " CTAs");
          cuda::hopper_bwd::override_persistent_grid_ctas(ctas, is_dynamic);
          const std::vector<Gradients> persistent = run_cuda(p, deterministic ? 2 : 1);
          for (const Gradients& run : persistent) {
            if (deterministic) EXPECT_TRUE(run.dq.bitwise_equal(per_tile[0].dq)) << "dq differs from the per-tile grid";
            EXPECT_TRUE(run.dk.bitwise_equal(per_tile[0].dk)) << "dk differs from the per-tile grid";
            EXPECT_TRUE(run.dv.bitwise_equal(per_tile[0].dv)) << "dv differs from the per-tile grid";
          }
          if (ctas == 3) {
            const ReferencePair ref = reference_gradients(p);
            expect_close("dq", persistent[0].dq, ref.exact.dq, ref.lowprec.dq, c.name());
            expect_close("dk", persistent[0].dk, ref.exact.dk, ref.lowprec.dk, c.name());
            expect_close("dv", persistent[0].dv, ref.exact.dv, ref.lowprec.dv, c.name());
          }
        }
      }
}

TEST_F(CudaBackwardHopper, TailsOfBothSequences) {
  for (std::int64_t d : kHeadDims)
    for (DType dtype : {DType::float16, DType::bfloat16})
      for (bool causal : {false, true})
        for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{129, 200}, {200, 129}, {64, 64}, {128, 128},
                              {1, 257}, {257, 1}, {17, 300}})
          check_case(hopper_case(dtype, sq, sk, causal, d));
}

// Many query blocks per key block: the Q/dO ring wraps several times.
TEST_F(CudaBackwardHopper, LongQueryRangeWrapsTheRing) {
  for (std::int64_t d : kHeadDims)
    for (bool causal : {false, true}) {
      Case c = hopper_case(DType::bfloat16, 700, 333, causal, d);
      c.batch = 1, c.heads_q = c.heads_kv = 1;
      check_case(c);
    }
}

TEST_F(CudaBackwardHopper, GroupedQueryAttention) {
  for (auto [hq, hkv] : {std::pair<std::int64_t, std::int64_t>{8, 2}, {6, 1}})
    for (bool causal : {false, true})
      for (std::int64_t d : {hq == 8 ? std::int64_t{64} : std::int64_t{128}, std::int64_t{256}}) {
        Case c = hopper_case(DType::float16, 100, 150, causal, d);
        c.heads_q = hq, c.heads_kv = hkv, c.batch = 1;
        check_case(c);
      }
}

TEST_F(CudaBackwardHopper, WindowAndSoftcap) {
  Case c = hopper_case(DType::bfloat16, 200, 230, false);
  for (auto [left, right] : {std::pair<std::int64_t, std::int64_t>{32, 0}, {16, 16}, {-1, 40}, {70, -1}, {0, 0}}) {
    c.window_left = left, c.window_right = right;
    check_case(c);
  }
  c.window_left = c.window_right = -1;
  c.softcap = 5.0;
  check_case(c);
  c.causal = true;
  c.q_scale = 3.0f;
  c.dtype = DType::float16;
  check_case(c);
  c.head_dim = 64;
  check_case(c);
  c.head_dim = 256;
  check_case(c);
  c.softcap = 0.0, c.causal = false, c.q_scale = 1.0f, c.window_left = 20, c.window_right = 5;
  check_case(c);
  c.head_dim = 64;
  check_case(c);
}

TEST_F(CudaBackwardHopper, VarlenWithEmptyAndSingleTokenSequences) {
  for (bool causal : {false, true})
    for (std::int64_t d : {causal ? std::int64_t{64} : std::int64_t{128}, std::int64_t{256}}) {
      Case c = hopper_case(DType::float16, 0, 0, causal, d);
      c.varlen_q = {0, 1, 70, 129, 5, 0, 200};
      c.varlen_k = {3, 1, 200, 64, 0, 0, 190};
      c.batch = 7, c.heads_q = 4, c.heads_kv = 2;
      check_case(c);
    }
}

// dout with padded heads (aligned: the Hopper kernel; odd: the FA2-class fallback).
TEST_F(CudaBackwardHopper, NonContiguousDout) {
  for (std::int64_t d : {128, 256}) {
    Case c = hopper_case(DType::bfloat16, 150, 170, true, d);
    c.dout_head_padding = 8;
    check_case(c);
    c.dout_head_padding = 3;
    check_case(c);
  }
}

TEST_F(CudaBackwardHopper, NoNanForMaskedRowsAndLargeLogits) {
  for (std::int64_t d : kHeadDims) {
    Case c = hopper_case(DType::float16, 150, 40, true, d);
    c.q_scale = 5.0f;
    check_case(c);
  }
}

// dK/dV are summed in registers in a fixed order: bitwise identical across runs
// The dK/dV epilogue through shared memory and TMA stores (launch.hpp's
// override_epilogue_tma; FLASHATTN_CUDA_HOPPER_BWD_EPILOGUE=tma) stores the same values as
// the register stores, bit for bit: varlen tails (full tiles staged, partial ones from
// registers), a dense tail the map clips (seqlen_k 200), GQA, both kernel.cuh head dims, one
// CTA per tile and a dynamic grid of 3 CTAs (many tiles per CTA: the staging stage and the
// dS^T rows handed back between tiles), in the environment's schedule (lockstep: the switch
// does nothing).
TEST_F(CudaBackwardHopper, TmaEpilogueMatchesTheRegisterStores) {
  struct Overrides {  // the process's own choices again when the test ends, even on failure
    ~Overrides() {
      cuda::hopper_bwd::override_epilogue_tma(-1);
      cuda::hopper_bwd::override_persistent_grid_ctas(-1);
    }
  } restore;
  for (std::int64_t d : {64, 128})
    for (bool is_varlen : {true, false})
      for (bool deterministic : {false, true}) {
        Case c = is_varlen ? hopper_case(DType::bfloat16, 0, 0, false, d) : hopper_case(DType::float16, 300, 200, true, d);
        if (is_varlen) {
          c.varlen_q = {0, 1, 70, 300, 5, 0, 260, 129};
          c.varlen_k = {3, 1, 200, 290, 0, 0, 400, 64};
          c.batch = 8;
        } else {
          c.batch = 3;
        }
        c.heads_q = 8, c.heads_kv = 2, c.deterministic = deterministic;
        SCOPED_TRACE(c.name());
        Problem p(c);
        for (const int ctas : {0, 3}) {
          SCOPED_TRACE(ctas == 0 ? "one CTA per tile" : "dynamic grid of 3 CTAs");
          cuda::hopper_bwd::override_persistent_grid_ctas(ctas, /*is_dynamic=*/true);
          cuda::hopper_bwd::override_epilogue_tma(0);
          const std::vector<Gradients> registers = run_cuda(p, 1);
          cuda::hopper_bwd::override_epilogue_tma(1);
          const std::vector<Gradients> tma = run_cuda(p, 1);
          EXPECT_TRUE(tma[0].dk.bitwise_equal(registers[0].dk)) << "dk differs from the register stores";
          EXPECT_TRUE(tma[0].dv.bitwise_equal(registers[0].dv)) << "dv differs from the register stores";
          if (deterministic) EXPECT_TRUE(tma[0].dq.bitwise_equal(registers[0].dq)) << "dq differs";
          if (ctas == 3 && !deterministic) {
            const ReferencePair ref = reference_gradients(p);
            expect_close("dk", tma[0].dk, ref.exact.dk, ref.lowprec.dk, c.name());
            expect_close("dv", tma[0].dv, ref.exact.dv, ref.lowprec.dv, c.name());
          }
        }
      }
}

// (dQ goes through unordered bulk reductions and may differ in the last bits).
TEST_F(CudaBackwardHopper, RepeatedRunsGiveBitwiseEqualDkDv) {
  const int repeats = 30;
  for (std::int64_t d : kHeadDims) {
    Case c = hopper_case(DType::bfloat16, 256, 256, true, d);
    c.batch = 30, c.heads_q = 4, c.heads_kv = 2;
    Problem p(c);
    const std::vector<Gradients> runs = run_cuda(p, repeats);
    for (int r = 1; r < repeats; ++r) {
      EXPECT_TRUE(runs[r].dk.bitwise_equal(runs[0].dk)) << "d" << d << ": dk differs in run " << r;
      EXPECT_TRUE(runs[r].dv.bitwise_equal(runs[0].dv)) << "d" << d << ": dv differs in run " << r;
    }
  }
}

// Deterministic mode: dQ (and dK, dV) bitwise identical over repeated runs, each run
// within the oracle's tolerance, and equal to the default mode's gradients up to the
// fp32 summation order of dQ (a few units in the last place of the output dtype).
void check_deterministic(const Case& deterministic_case, int repeats, bool with_oracle) {
  SCOPED_TRACE(deterministic_case.name());
  Problem p(deterministic_case);
  const std::vector<Gradients> runs = run_cuda(p, repeats);
  int dq_differs = 0;
  for (int r = 1; r < repeats; ++r) {
    dq_differs += runs[r].dq.bitwise_equal(runs[0].dq) ? 0 : 1;
    EXPECT_TRUE(runs[r].dk.bitwise_equal(runs[0].dk)) << "dk differs in run " << r;
    EXPECT_TRUE(runs[r].dv.bitwise_equal(runs[0].dv)) << "dv differs in run " << r;
  }
  EXPECT_EQ(dq_differs, 0) << "deterministic dq differs in " << dq_differs << " of " << repeats - 1 << " runs";
  if (with_oracle) {
    const ReferencePair ref = reference_gradients(p);
    expect_close("dq", runs[0].dq, ref.exact.dq, ref.lowprec.dq, deterministic_case.name());
    expect_close("dk", runs[0].dk, ref.exact.dk, ref.lowprec.dk, deterministic_case.name());
    expect_close("dv", runs[0].dv, ref.exact.dv, ref.lowprec.dv, deterministic_case.name());
  }
  p.c.deterministic = false;
  const std::vector<Gradients> fast = run_cuda(p, 1);
  // dK/dV do not depend on the mode at all.
  EXPECT_TRUE(fast[0].dk.bitwise_equal(runs[0].dk)) << "dk differs from the default mode";
  EXPECT_TRUE(fast[0].dv.bitwise_equal(runs[0].dv)) << "dv differs from the default mode";
  const HostTensor& ours = runs[0].dq;
  const HostTensor& theirs = fast[0].dq;
  double magnitude = 0;
  for (std::int64_t i = 0; i < theirs.numel(); ++i) magnitude = std::max(magnitude, std::abs(static_cast<double>(theirs.get(i))));
  const double relative = deterministic_case.dtype == DType::bfloat16 ? 1.0 / 64 : 1.0 / 512;  // 2 ulp
  std::int64_t worst = -1;
  double worst_excess = 0;
  for (std::int64_t i = 0; i < ours.numel(); ++i) {
    const double a = static_cast<double>(ours.get(i)), b = static_cast<double>(theirs.get(i));
    const double excess = std::abs(a - b) - (relative * std::abs(b) + 1e-3 * magnitude);
    if (!(excess <= worst_excess)) worst_excess = excess, worst = i;
  }
  EXPECT_EQ(worst, -1) << "dq differs from the default mode at " << worst << ": "
                       << (worst >= 0 ? ours.get(worst) : 0) << " vs " << (worst >= 0 ? theirs.get(worst) : 0)
                       << " (max|dq| " << magnitude << ")";
}

TEST_F(CudaBackwardHopper, DeterministicModeIsBitwiseRepeatable) {
  const int repeats = 20;
  // Causal, GQA 8/2 (four query heads per CTA), both kernel head dims, tails.
  for (std::int64_t d : kDeterministicHeadDims) {
    Case c = hopper_case(DType::bfloat16, 300, 257, true, d);
    c.deterministic = true, c.batch = 2, c.heads_q = 8, c.heads_kv = 2;
    check_deterministic(c, repeats, true);
    c.causal = false, c.seqlen_q = 257, c.seqlen_k = 300, c.dtype = DType::float16;
    check_deterministic(c, repeats, true);
  }
  // Sliding windows (the visiting key blocks of a query block start past 0), including
  // a left-only and a right-only window.
  for (auto [left, right] : {std::pair<std::int64_t, std::int64_t>{32, 0}, {100, 20}, {-1, 40}, {70, -1}, {0, 0}}) {
    Case c = hopper_case(DType::bfloat16, 400, 430, false);
    c.deterministic = true, c.heads_q = 4, c.heads_kv = 2, c.window_left = left, c.window_right = right;
    check_deterministic(c, repeats, true);
  }
  // The wide kernel (64-key blocks: other visitor ranges) under windows.
  for (auto [left, right] : {std::pair<std::int64_t, std::int64_t>{32, 0}, {70, -1}, {-1, 40}}) {
    Case c = hopper_case(DType::bfloat16, 400, 430, false, 256);
    c.deterministic = true, c.heads_q = 4, c.heads_kv = 2, c.window_left = left, c.window_right = right;
    check_deterministic(c, repeats, true);
  }
  // Varlen: empty and single-token sequences, key blocks past a sequence's keys.
  for (bool causal : {false, true})
    for (std::int64_t d : {causal ? std::int64_t{64} : std::int64_t{128}, std::int64_t{256}}) {
      Case c = hopper_case(DType::float16, 0, 0, causal, d);
      c.varlen_q = {0, 1, 70, 129, 5, 0, 300};
      c.varlen_k = {3, 1, 200, 64, 0, 0, 290};
      c.deterministic = true, c.batch = 7, c.heads_q = 8, c.heads_kv = 2;
      check_deterministic(c, repeats, true);
    }
}

// More CTAs than an H100 has SMs (360 CTAs: waits across waves of CTAs): no deadlock,
// still bitwise repeatable. No gradient oracle (the forward one builds the inputs).
TEST_F(CudaBackwardHopper, DeterministicModeManyWaves) {
  for (std::int64_t d : kDeterministicHeadDims)
    for (bool causal : {true, false}) {
      Case c = hopper_case(DType::bfloat16, 384, 384, causal, d);
      c.deterministic = true, c.batch = 30, c.heads_q = 4, c.heads_kv = 4;
      check_deterministic(c, 5, false);
    }
}

// ---- ALiBi and dropout -------------------------------------------------------------

Case variant_case(DType dtype, std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t head_dim, Case::Alibi alibi,
                  double dropout_p) {
  Case c = hopper_case(dtype, seqlen_q, seqlen_k, false, head_dim);
  c.alibi = alibi, c.dropout_p = dropout_p;
  c.dropout_seed = 0x1234'5678'9abc'def0ULL + static_cast<std::uint64_t>(seqlen_q);
  c.dropout_offset = 0x2'0000'0040ULL;  // high word set: both halves reach the generator
  return c;
}

// How far `ours` is from the oracle, in units of the tolerance of expect_close (> 1: fails).
double error_over_tolerance(const HostTensor& ours, const std::vector<double>& exact, const std::vector<double>& lowprec) {
  double error = 0, lowprec_error = 0, magnitude = 0;
  for (std::int64_t i = 0; i < ours.numel(); ++i) {
    const double ref = exact[static_cast<std::size_t>(i)];
    error = std::max(error, std::abs(ours.get(i) - ref));
    lowprec_error = std::max(lowprec_error, std::abs(lowprec[static_cast<std::size_t>(i)] - ref));
    magnitude = std::max(magnitude, std::abs(ref));
  }
  return error / (3 * lowprec_error + 1e-4 * std::max(1.0, magnitude));
}

// The case against the oracle; with dropout also: the same inputs under another seed
// are far outside the tolerance (so the mask agreement is what the check measures).
void check_variant_case(const Case& c) {
  SCOPED_TRACE(c.name());
  check_case(c);
  if (c.dropout_p == 0.0) return;
  Problem p(c);
  const ReferencePair ref = reference_gradients(p);
  Problem other_seed = p;
  other_seed.set_dropout_seed_offset(c.dropout_seed ^ 1, c.dropout_offset);
  const std::vector<Gradients> runs = run_cuda(other_seed, 1);
  EXPECT_GT(error_over_tolerance(runs[0].dv, ref.exact.dv, ref.lowprec.dv), 3.0)
      << "dv under another dropout seed is within the tolerance of this seed's oracle: the test cannot see the mask";
}

TEST_F(CudaBackwardHopper, AlibiMatchesTheOracle) {
  using Alibi = Case::Alibi;
  for (std::int64_t d : kHeadDims)
    for (Alibi alibi : {Alibi::per_head, Alibi::per_batch_head})
      for (bool causal : {false, true})
        for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{113, 203}, {203, 113}}) {
          Case c = variant_case(d == 128 ? DType::bfloat16 : DType::float16, sq, sk, d, alibi, 0.0);
          c.causal = causal, c.heads_q = 4, c.heads_kv = 4;
          check_variant_case(c);
        }
  for (std::int64_t d : kHeadDims) {
    // GQA (slopes per query head), a window, softcap (the bias after the cap).
    Case c = variant_case(DType::bfloat16, 150, 230, d, Alibi::per_batch_head, 0.0);
    c.heads_q = 6, c.heads_kv = 2;
    check_variant_case(c);
    c.window_left = 40, c.window_right = 10;
    check_variant_case(c);
    c.window_left = c.window_right = -1, c.softcap = 5.0, c.q_scale = 3.0f, c.causal = true;
    check_variant_case(c);
  }
  for (std::int64_t d : kHeadDims) {
    // Many query blocks on each side of the keys' diagonal (ALiBi's affine form there,
    // the per-element form across it), and window_left 0 (every block on the right).
    Case c = variant_case(DType::bfloat16, 700, 900, d, Alibi::per_head, 0.0);
    c.heads_q = 2, c.heads_kv = 2;
    check_variant_case(c);
    c.window_left = 0, c.window_right = 40;
    check_variant_case(c);
  }
  for (std::int64_t d : kHeadDims) {
    Case c = variant_case(DType::float16, 0, 0, d, Alibi::per_batch_head, 0.0);
    c.varlen_q = {0, 1, 70, 129, 5, 0, 200};
    c.varlen_k = {3, 1, 200, 64, 0, 0, 190};
    c.batch = 7, c.heads_q = 4, c.heads_kv = 2, c.causal = d == 64;
    check_variant_case(c);
    if (d != 64) {  // the affine form (d128, d256) with sequence offsets under a causal mask
      c.varlen_q = {0, 1, 300, 129, 5, 0, 700};
      c.varlen_k = {3, 1, 300, 200, 0, 0, 900};
      c.causal = true;
      check_variant_case(c);
    }
  }
}

TEST_F(CudaBackwardHopper, DropoutMatchesTheOracle) {
  for (std::int64_t d : kHeadDims)
    for (double p : {0.1, 0.5})
      for (bool causal : {false, true})
        for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{113, 203}, {203, 113}}) {
          Case c = variant_case(d == 128 ? DType::bfloat16 : DType::float16, sq, sk, d, Case::Alibi::none, p);
          c.causal = causal;
          check_variant_case(c);
        }
  for (std::int64_t d : kHeadDims) {
    // GQA, window, softcap, ALiBi with dropout, the seed/offset from device memory.
    Case c = variant_case(DType::bfloat16, 150, 230, d, Case::Alibi::none, 0.1);
    c.heads_q = 6, c.heads_kv = 2;
    check_variant_case(c);
    c.window_left = 40, c.window_right = 10;
    check_variant_case(c);
    c.window_left = c.window_right = -1, c.softcap = 5.0, c.q_scale = 3.0f, c.causal = true;
    check_variant_case(c);
    c.softcap = 0.0, c.q_scale = 1.0f, c.alibi = Case::Alibi::per_head, c.dropout_p = 0.5;
    check_variant_case(c);
    c.seed_offset_in_memory = true;
    check_variant_case(c);
  }
  for (std::int64_t d : kHeadDims) {
    Case c = variant_case(DType::float16, 0, 0, d, Case::Alibi::none, 0.5);
    c.varlen_q = {0, 1, 70, 129, 5, 0, 200};
    c.varlen_k = {3, 1, 200, 64, 0, 0, 190};
    c.batch = 7, c.heads_q = 4, c.heads_kv = 2, c.causal = d != 128;
    check_variant_case(c);
  }
}

// Same seed and offset: bitwise-identical gradients (dQ too in deterministic mode), and
// the seed/offset read from device memory give the same bits as the host values.
TEST_F(CudaBackwardHopper, DropoutIsBitwiseRepeatable) {
  for (std::int64_t d : kHeadDims)
    for (bool deterministic : {false, true}) {
      Case c = variant_case(DType::bfloat16, 300, 257, d, Case::Alibi::none, 0.1);
      c.causal = true, c.batch = 2, c.heads_q = 8, c.heads_kv = 2, c.deterministic = deterministic;
      SCOPED_TRACE(c.name());
      Problem p(c);
      const std::vector<Gradients> runs = run_cuda(p, 3);
      Problem in_memory = p;
      in_memory.c.seed_offset_in_memory = true;
      const std::vector<Gradients> from_memory = run_cuda(in_memory, 1);
      for (const Gradients* g : {&runs[1], &runs[2], &from_memory[0]}) {
        const char* which = g == &from_memory[0] ? "seed/offset from memory" : "a repeated run";
        EXPECT_TRUE(g->dk.bitwise_equal(runs[0].dk)) << "dk differs in " << which;
        EXPECT_TRUE(g->dv.bitwise_equal(runs[0].dv)) << "dv differs in " << which;
        if (deterministic) EXPECT_TRUE(g->dq.bitwise_equal(runs[0].dq)) << "dq differs in " << which;
      }
      Problem other_offset = p;
      other_offset.set_dropout_seed_offset(c.dropout_seed, c.dropout_offset + 1);
      EXPECT_FALSE(run_cuda(other_offset, 1)[0].dv.bitwise_equal(runs[0].dv)) << "dv does not depend on the offset";
    }
}

// Deterministic mode with ALiBi and dropout: bitwise repeatable, within the oracle's
// tolerance, equal to the default mode up to dQ's summation order.
TEST_F(CudaBackwardHopper, DeterministicModeWithAlibiAndDropout) {
  for (std::int64_t d : kDeterministicHeadDims) {
    Case c = variant_case(DType::bfloat16, 300, 257, d, Case::Alibi::per_batch_head, 0.1);
    c.deterministic = true, c.causal = true, c.batch = 2, c.heads_q = 8, c.heads_kv = 2;
    check_deterministic(c, 5, true);
    c.causal = false, c.window_left = 70, c.window_right = 20, c.alibi = Case::Alibi::none, c.dropout_p = 0.5;
    check_deterministic(c, 5, true);
  }
}

}  // namespace
}  // namespace flashattn
