// tests/cuda/test_masks_hopper_bwd.cpp — the Hopper backward kernels (src/cuda/hopper_bwd)
// under device masks, the cases specific to them beside masks-core's test_masks.cpp:
// both tile shapes of kernel.cuh (d64: 128 x 128, dQ split by rows; d128: 64 x 128, dQ
// split by columns) and the wide kernel (d256: 64 x 64), GQA (dK/dV summed over the
// group, the lists walked per query head: a bias that differs per query head), a float
// attn_mask with masked (-inf) elements and a fully masked row (zero gradients, never
// NaN), a boolean mask, softcap (partial tiles through the score loop), dBias (summed over
// the broadcast batch), and deterministic mode (the turns from the by-query-tile lists:
// bitwise repeatable, no hang). Against the float64 oracle with the 3x rule of
// backward_case.hpp. On a GPU without the Hopper kernels the same cases run on the
// FA2-class kernels. Skips without a GPU.
#include "tests/cuda/backward_case.hpp"

#include <string>

#include "src/cuda/hopper_bwd/launch.hpp"

namespace flashattn {
namespace {

class CudaMasksHopperBackward : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

struct MaskCase {
  DType dtype = DType::bfloat16;
  std::int64_t batch = 2, seqlen_q = 203, seqlen_k = 317, heads_q = 4, heads_kv = 2, head_dim = 128;
  bool causal = false;
  double softcap = 0.0;
  bool is_bias = true;   // float32 bias [1, heads_q, Sq, Sk] (with dBias), else bool [B, 1, Sq, Sk]
  bool deterministic = false;

  std::string name() const {
    return std::string(dtype_name(dtype)) + " sq" + std::to_string(seqlen_q) + " sk" + std::to_string(seqlen_k) + " h" +
           std::to_string(heads_q) + "/" + std::to_string(heads_kv) + " d" + std::to_string(head_dim) +
           (causal ? " causal" : "") + (softcap > 0 ? " softcap" : "") + (is_bias ? " bias+dbias" : " bool") +
           (deterministic ? " deterministic" : "");
  }
};

// Inputs, the masked forward's O/LSE from the oracle, and the args builders.
struct MaskProblem {
  MaskCase c;
  std::vector<std::int64_t> q_shape, k_shape, mask_shape;
  HostTensor q, k, v, out, dout, lse, mask;

  explicit MaskProblem(const MaskCase& test_case)
      : c(test_case),
        q_shape{c.batch, c.seqlen_q, c.heads_q, c.head_dim},
        k_shape{c.batch, c.seqlen_k, c.heads_kv, c.head_dim},
        mask_shape{c.is_bias ? 1 : c.batch, c.is_bias ? c.heads_q : 1, c.seqlen_q, c.seqlen_k},
        q(c.dtype, q_shape), k(c.dtype, k_shape), v(c.dtype, k_shape), out(c.dtype, q_shape), dout(c.dtype, q_shape),
        lse(DType::float32, {c.batch, c.heads_q, c.seqlen_q}),
        mask(c.is_bias ? DType::float32 : DType::boolean, mask_shape) {
    const auto seed = static_cast<std::uint64_t>(c.head_dim * 7 + c.seqlen_q);
    q.fill_random(seed * 4 + 0), k.fill_random(seed * 4 + 1), v.fill_random(seed * 4 + 2), dout.fill_random(seed * 4 + 3);
    // Element (b|h, i, j): masked on a sparse pattern that leaves whole 64/128 tiles
    // free and others partial; row 5 sees no key at all. The bias differs per query head
    // (so a walk mixing up the group's heads fails) and spans a few units.
    const std::int64_t outer = mask_shape[0] * mask_shape[1];
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t i = 0; i < c.seqlen_q; ++i)
        for (std::int64_t j = 0; j < c.seqlen_k; ++j) {
          const std::int64_t index = (o * c.seqlen_q + i) * c.seqlen_k + j;
          const bool is_masked = i == 5 || (j / 64 == 2 && (i + j + o) % 3 == 0) || (i / 64 == 1 && j % 7 == o % 7);
          if (c.is_bias)
            mask.set(index, is_masked ? -INFINITY : static_cast<float>(std::sin(0.37 * (i + 3 * o)) + std::cos(0.11 * j)));
          else
            static_cast<std::uint8_t*>(mask.data())[index] = is_masked ? 0 : 1;
        }
    ForwardArgs forward_args;
    forward_args.q = q.view(), forward_args.k = k.view(), forward_args.v = v.view(), forward_args.out = out.view();
    forward_args.maybe_lse = lse.view();
    forward_args.options = options(mask.data(), Device::cpu());
    const AttentionParams params = validate_forward(forward_args);
    const cpu::ReferenceResult reference = cpu::reference_forward(params);
    for (std::int64_t i = 0; i < out.numel(); ++i) out.set(i, static_cast<float>(reference.out[static_cast<std::size_t>(i)]));
    for (std::int64_t row = 0; row < c.batch * c.seqlen_q; ++row)
      for (std::int64_t h = 0; h < c.heads_q; ++h)
        static_cast<float*>(lse.data())[((row / c.seqlen_q) * c.heads_q + h) * c.seqlen_q + row % c.seqlen_q] =
            static_cast<float>(reference.lse_at(row, h));
  }

  AttentionOptions options(void* mask_data, Device device) const {
    AttentionOptions o;
    o.causal = c.causal;
    o.softcap = c.softcap;
    o.deterministic = c.deterministic;
    o.maybe_attn_mask = Problem::on(mask, mask_data, device);
    return o;
  }
};

struct MaskGradients {
  HostTensor dq, dk, dv, dbias;
};

MaskGradients run_cuda(MaskProblem& p) {
  const Device gpu = Device::cuda(0);
  const std::size_t element = dtype_size(p.c.dtype);
  DeviceCopy q(p.q.data(), p.q.numel() * element), k(p.k.data(), p.k.numel() * element),
      v(p.v.data(), p.v.numel() * element), out(p.out.data(), p.out.numel() * element),
      dout(p.dout.data(), p.dout.numel() * element), lse(p.lse.data(), p.lse.numel() * sizeof(float)),
      mask(p.mask.data(), p.mask.numel() * dtype_size(p.mask.dtype()));
  MaskGradients g{HostTensor(p.c.dtype, p.q_shape), HostTensor(p.c.dtype, p.k_shape), HostTensor(p.c.dtype, p.k_shape),
                  HostTensor(DType::float32, p.mask_shape)};
  DeviceCopy dq(p.q.numel() * element), dk(p.k.numel() * element), dv(p.k.numel() * element),
      dbias(g.dbias.numel() * sizeof(float));
  dq.poison(), dk.poison(), dv.poison(), dbias.poison();
  BackwardArgs args;
  args.q = Problem::on(p.q, q.data(), gpu), args.k = Problem::on(p.k, k.data(), gpu);
  args.v = Problem::on(p.v, v.data(), gpu), args.out = Problem::on(p.out, out.data(), gpu);
  args.dout = Problem::on(p.dout, dout.data(), gpu), args.lse = Problem::on(p.lse, lse.data(), gpu);
  args.dq = Problem::on(g.dq, dq.data(), gpu), args.dk = Problem::on(g.dk, dk.data(), gpu);
  args.dv = Problem::on(g.dv, dv.data(), gpu);
  if (p.c.is_bias) args.maybe_dbias = Problem::on(g.dbias, dbias.data(), gpu);
  args.options = p.options(mask.data(), gpu);
  const std::size_t workspace_bytes = backward_workspace_bytes(args);
  DeviceCopy workspace(workspace_bytes);
  workspace.poison();
  args.maybe_workspace = TensorView::contiguous(workspace.data(), DType::uint8,
                                                {static_cast<std::int64_t>(std::max<std::size_t>(workspace_bytes, 1))}, gpu);
  backward(args);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("backward failed on the device");
  dq.download(g.dq.data()), dk.download(g.dk.data()), dv.download(g.dv.data());
  if (p.c.is_bias) dbias.download(g.dbias.data());
  return g;
}

void check_mask_case(const MaskCase& c) {
  SCOPED_TRACE(c.name());
  MaskProblem p(c);
  HostTensor dq(c.dtype, p.q_shape), dk(c.dtype, p.k_shape), dv(c.dtype, p.k_shape), dbias(DType::float32, p.mask_shape);
  BackwardArgs args;
  args.q = p.q.view(), args.k = p.k.view(), args.v = p.v.view(), args.out = p.out.view();
  args.dout = p.dout.view(), args.lse = p.lse.view();
  args.dq = dq.view(), args.dk = dk.view(), args.dv = dv.view();
  if (c.is_bias) args.maybe_dbias = dbias.view();
  args.options = p.options(p.mask.data(), Device::cpu());
  const BackwardParams params = validate_backward(args);
  const cpu::ReferenceGradients exact = cpu::reference_backward(params);
  const cpu::ReferenceGradients lowprec = cpu::naive_backward_in_precision(params, c.dtype);

  const MaskGradients ours = run_cuda(p);
  expect_close("dq", ours.dq, exact.dq, lowprec.dq, c.name());
  expect_close("dk", ours.dk, exact.dk, lowprec.dk, c.name());
  expect_close("dv", ours.dv, exact.dv, lowprec.dv, c.name());
  if (c.is_bias) expect_close("dbias", ours.dbias, exact.dbias, lowprec.dbias, c.name());
  // Row 5 of every (batch, head) sees no key: its dQ is exactly 0.
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.heads_q; ++h)
      for (std::int64_t d = 0; d < c.head_dim; ++d)
        ASSERT_EQ(ours.dq.get(((b * c.seqlen_q + 5) * c.heads_q + h) * c.head_dim + d), 0.0f) << "b" << b << " h" << h;
  if (c.deterministic) {
    const MaskGradients again = run_cuda(p);
    EXPECT_TRUE(again.dq.bitwise_equal(ours.dq)) << "dq not bitwise repeatable";
    EXPECT_TRUE(again.dk.bitwise_equal(ours.dk)) << "dk not bitwise repeatable";
    EXPECT_TRUE(again.dv.bitwise_equal(ours.dv)) << "dv not bitwise repeatable";
  }
}

MaskCase mask_case(std::int64_t head_dim) {
  MaskCase c;
  c.head_dim = head_dim;
  return c;
}

TEST_F(CudaMasksHopperBackward, BiasAndDbiasEveryTileShape) {
  for (const std::int64_t d : {64, 128, 256}) check_mask_case(mask_case(d));
}

TEST_F(CudaMasksHopperBackward, BoolMaskCausalFp16) {
  for (const std::int64_t d : {64, 128, 256}) {
    MaskCase c = mask_case(d);
    c.dtype = DType::float16, c.is_bias = false, c.causal = true;
    check_mask_case(c);
  }
}

TEST_F(CudaMasksHopperBackward, SoftcapWithBias) {
  for (const std::int64_t d : {64, 256}) {
    MaskCase c = mask_case(d);
    c.softcap = 5.0;
    check_mask_case(c);
  }
}

TEST_F(CudaMasksHopperBackward, DeterministicWithMasks) {
  for (const std::int64_t d : {64, 128, 256}) {
    MaskCase c = mask_case(d);
    c.deterministic = true;
    check_mask_case(c);
    c.is_bias = false, c.causal = true;
    check_mask_case(c);
  }
}

// The persistent grids (kernel.cuh: CTAs looping over tiles; the static walk and the dynamic
// claims) under device masks: GQA, causal, deterministic, grids of 1 and 3 CTAs (many tiles
// each) against the per-tile grid
// in one process: dQ, dK, dV (and dBias: its atomic adds are per element, in no fixed
// order, so within the oracle's tolerance only) bitwise equal in deterministic mode, and
// within the oracle's tolerance.
TEST_F(CudaMasksHopperBackward, PersistentGridMatchesThePerTileGrid) {
  struct GridOverride {  // the process's own grid again when the test ends, even on failure
    ~GridOverride() { cuda::hopper_bwd::override_persistent_grid_ctas(-1); }
  } restore;
  for (const std::int64_t d : {64, 128})
    for (const bool is_bias : {true, false}) {
      MaskCase c = mask_case(d);
      c.heads_q = 8, c.heads_kv = 2, c.batch = 3, c.deterministic = true, c.is_bias = is_bias, c.causal = !is_bias;
      SCOPED_TRACE(c.name());
      MaskProblem p(c);
      cuda::hopper_bwd::override_persistent_grid_ctas(0);
      const MaskGradients per_tile = run_cuda(p);
      for (const bool is_dynamic : {false, true})
      for (const int ctas : {1, 3}) {
        SCOPED_TRACE(std::string(is_dynamic ? "dynamic" : "static") + " persistent grid of " +
                     std::to_string(ctas) + " CTAs");
        cuda::hopper_bwd::override_persistent_grid_ctas(ctas, is_dynamic);
        const MaskGradients persistent = run_cuda(p);
        EXPECT_TRUE(persistent.dq.bitwise_equal(per_tile.dq)) << "dq differs from the per-tile grid";
        EXPECT_TRUE(persistent.dk.bitwise_equal(per_tile.dk)) << "dk differs from the per-tile grid";
        EXPECT_TRUE(persistent.dv.bitwise_equal(per_tile.dv)) << "dv differs from the per-tile grid";
      }
      check_mask_case(c);  // under the dynamic 3-CTA grid (the override stays until the end)
    }
}

// GQA 8/1 over a long key range: one CTA walks eight query heads' lists (each of the
// bias's heads differs), the ring wraps many times.
TEST_F(CudaMasksHopperBackward, GqaGroupOfEight) {
  MaskCase c = mask_case(128);
  c.heads_q = 8, c.heads_kv = 1, c.batch = 1, c.seqlen_q = 517, c.seqlen_k = 260;
  check_mask_case(c);
}

}  // namespace
}  // namespace flashattn
