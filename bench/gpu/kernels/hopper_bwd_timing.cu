// bench/gpu/kernels/hopper_bwd_timing.cu — times the whole backward pass
// (preprocess + main kernel + dQ conversion) with the Hopper wgmma kernel
// (flashattn::backward's dispatch) and with the FA2-class kernel (src/cuda/bwd),
// same inputs, CUDA events, median of repeats. Not a test: it prints CSV; the
// anchors (PyTorch SDPA FLASH = FA2, cuDNN) come from hopper_bwd_anchors.py in the
// same device call, which joins both into ratios. FLOPs = 2.5 x forward (forward =
// 4 B H N² d, halved for causal).
//
// Inputs are random (a hash of the index, never zeros); LSE = ln(seqlen) + 0.5, what
// unit-variance scores give. Gradients are poisoned (NaN) before each checked run;
// max_rel_diff compares the two kernels' dq/dk/dv (a broken kernel shows as NaN or a
// large value).
//
// flashattn_hopper_bwd_timing [repeats] [--quick]      the sweeps, Hopper vs FA2-class kernel
// flashattn_hopper_bwd_timing [repeats] --variants     tile configs other than the table's
// flashattn_hopper_bwd_timing [repeats] --head-dim D   the sweeps of head dim D only (64, 128, 256)
// flashattn_hopper_bwd_timing [repeats] --schedules [--quick] [--deterministic]
//     kernel.cuh's schedules (lockstep, overlapped, deferred_dk: tile_config.hpp) side by
//     side on the d64/d128 sweeps, whatever FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE says;
//     max_rel_diff compares the others' gradients with lockstep's (deterministic: dQ/dK/dV
//     must be bitwise equal, 0). deferred_dk runs only at d128 in the default mode
//     (elsewhere it is the overlapped kernel again).
// flashattn_hopper_bwd_timing [repeats] --grids [--quick] [--deterministic]
//     kernel.cuh's grids side by side on the d64/d128 sweeps, in the schedule
//     FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE selects: one CTA per tile (the default), the
//     persistent grid's static walk (one CTA per SM, FLASHATTN_CUDA_HOPPER_BWD_GRID=persistent)
//     and its dynamic claims (=dynamic, in the L2-section order unless
//     FLASHATTN_CUDA_HOPPER_BWD_ORDER=flat), whatever FLASHATTN_CUDA_HOPPER_BWD_GRID says;
//     the max_rel_diff columns compare each persistent grid's gradients with the per-tile
//     grid's (deterministic: must be 0, bitwise equal).
// flashattn_hopper_bwd_timing [repeats] --dq-handoff|--epilogues [--quick] [--deterministic]
//     one of kernel.cuh's two-way switches off and on, side by side on the d64/d128 sweeps, in
//     the schedule and grid the library picks (FLASHATTN_CUDA_HOPPER_BWD_SCHEDULE selects),
//     whatever the environment says of the switch: --dq-handoff the dQ hand-off early
//     (FLASHATTN_CUDA_HOPPER_BWD_DQ_HANDOFF=early) / late (the default), --epilogues the dK/dV
//     stores from registers / through shared memory with TMA stores (=tma).
//     max_rel_diff compares the "on" run's gradients with the "off" run's (dK/dV bitwise equal
//     for both switches; deterministic: all 0).
// Anywhere after [repeats]: --dropout P (dropout probability P on every shape) and
// --alibi (ALiBi, one slope per head); sm90_plain_ms is then the same shape without
// them (same call, so their cost is sm90_ms / sm90_plain_ms), and the anchors run
// SDPA with the same dropout (SDPA has no ALiBi that keeps its fused kernels).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/gpu/kernels/gradient_difference.hpp"
#include "flashattn/flashattn.hpp"
#include "src/core/validate.hpp"
#include "src/cuda/bwd/launch.hpp"
#include "src/cuda/bwd/workspace.hpp"
#include "src/cuda/hopper_bwd/kernel.cuh"

namespace {

void check(cudaError_t code, const char* what) {
  if (code != cudaSuccess) {
    std::fprintf(stderr, "CUDA error %s in %s\n", cudaGetErrorString(code), what);
    std::exit(1);
  }
}

template <class Element>
__global__ void fill_random(Element* data, std::int64_t n, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    const float uniform = (x >> 8) * (1.0f / 16777216.0f);            // [0, 1)
    data[i] = static_cast<Element>((uniform * 2.0f - 1.0f) * 1.7320508f);  // unit variance
  }
}

__global__ void fill_value(float* data, std::int64_t n, float value) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    data[i] = value;
}

struct Shape {
  const char* sweep;
  flashattn::DType dtype;
  std::int64_t batch, heads, seqlen, head_dim;
  bool causal;
};

// The variant options of the whole run (--dropout P, --alibi).
struct Variants {
  double dropout_p = 0.0;
  bool alibi = false;
  bool deterministic = false;  // --schedules --deterministic
};

// Device tensors and BackwardArgs of one shape (contiguous [b, n, h, d]).
struct Problem {
  Shape shape;
  std::int64_t elements = 0;
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *dout = nullptr, *dq = nullptr, *dk = nullptr,
       *dv = nullptr, *workspace = nullptr;
  float* lse = nullptr;
  float* alibi_slopes = nullptr;  // [heads], with --alibi
  flashattn::BackwardArgs args;

  explicit Problem(const Shape& s, const Variants& variants = {}) : shape(s) {
    using flashattn::TensorView;
    const auto device = flashattn::Device::cuda(0);
    const std::int64_t b = s.batch, h = s.heads, n = s.seqlen, d = s.head_dim;
    elements = b * n * h * d;
    for (void** p : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) check(cudaMalloc(p, elements * 2), "cudaMalloc");
    check(cudaMalloc(&lse, b * h * n * sizeof(float)), "cudaMalloc lse");
    std::uint32_t seed = 1;
    for (void* p : {q, k, v, o, dout}) {
      if (s.dtype == flashattn::DType::float16) fill_random<<<1024, 256>>>(static_cast<__half*>(p), elements, seed++);
      else fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), elements, seed++);
      check(cudaGetLastError(), "fill_random");
    }
    fill_value<<<1024, 256>>>(lse, b * h * n, std::log(static_cast<float>(n)) + 0.5f);
    check(cudaGetLastError(), "fill_value");
    auto view = [&](void* data) { return TensorView::contiguous(data, s.dtype, {b, n, h, d}, device); };
    args.q = view(q), args.k = view(k), args.v = view(v), args.out = view(o), args.dout = view(dout);
    args.dq = view(dq), args.dk = view(dk), args.dv = view(dv);
    args.lse = TensorView::contiguous(lse, flashattn::DType::float32, {b, h, n}, device);
    args.options.causal = s.causal;
    if (variants.alibi) {
      std::vector<float> slopes(static_cast<std::size_t>(h));
      for (std::int64_t head = 0; head < h; ++head)
        slopes[static_cast<std::size_t>(head)] = std::exp2(-8.0f * static_cast<float>(head + 1) / static_cast<float>(h));
      check(cudaMalloc(&alibi_slopes, h * sizeof(float)), "cudaMalloc alibi");
      check(cudaMemcpy(alibi_slopes, slopes.data(), h * sizeof(float), cudaMemcpyHostToDevice), "alibi upload");
      args.options.maybe_alibi_slopes = TensorView::contiguous(alibi_slopes, flashattn::DType::float32, {h}, device);
    }
    args.options.dropout_p = variants.dropout_p;
    args.options.deterministic = variants.deterministic;
    args.options.dropout_seed = 0x5eed;
    args.options.dropout_offset = 7;
    const std::size_t workspace_bytes = flashattn::backward_workspace_bytes(args);
    check(cudaMalloc(&workspace, std::max<std::size_t>(workspace_bytes, 1)), "cudaMalloc workspace");
    args.maybe_workspace = TensorView::contiguous(
        workspace, flashattn::DType::uint8, {static_cast<std::int64_t>(std::max<std::size_t>(workspace_bytes, 1))},
        device);
  }
  ~Problem() {
    for (void* p : {q, k, v, o, dout, dq, dk, dv, static_cast<void*>(lse), workspace, static_cast<void*>(alibi_slopes)})
      cudaFree(p);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  double forward_flops() const {
    return 4.0 * shape.batch * shape.heads * shape.seqlen * shape.seqlen * shape.head_dim *
           (shape.causal ? 0.5 : 1.0);
  }
  void poison_gradients() const {
    for (void* p : {dq, dk, dv}) check(cudaMemset(p, 0xFF, elements * 2), "poison");  // NaN in fp16 and bf16
  }
  std::vector<float> gradients() const {
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(elements));
    std::vector<float> values;
    values.reserve(3 * bits.size());
    for (void* p : {dq, dk, dv}) {
      check(cudaMemcpy(bits.data(), p, elements * 2, cudaMemcpyDeviceToHost), "download");
      for (std::uint16_t x : bits) {
        float f;
        if (shape.dtype == flashattn::DType::bfloat16) {
          const std::uint32_t u = static_cast<std::uint32_t>(x) << 16;
          std::memcpy(&f, &u, 4);
        } else {
          __half half;
          std::memcpy(&half, &x, 2);
          f = __half2float(half);
        }
        values.push_back(f);
      }
    }
    return values;
  }
};

// The backward pass with the FA2-class main kernel, whatever the dispatch would pick.
template <class Element, int kHeadDim>
void run_fa2_class(const flashattn::BackwardArgs& args) {
  namespace bwd = flashattn::cuda::bwd;
  const flashattn::BackwardParams params = flashattn::validate_backward(args);
  const bwd::Workspace workspace = bwd::carve_workspace(params);
  bwd::launch_preprocess(params, workspace, nullptr);
  bwd::launch_main<Element, kHeadDim>(params, workspace, bwd::allows_vector_access(params), nullptr);
  bwd::launch_convert_dq(params, workspace, nullptr);
}

template <class Run>
double median_ms(Run run, int repeats) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  for (int i = 0; i < 3; ++i) run();
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<float> times;
  for (int i = 0; i < repeats; ++i) {
    check(cudaEventRecord(start), "record");
    run();
    check(cudaEventRecord(stop), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    times.push_back(ms);
  }
  check(cudaGetLastError(), "backward");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <class Element, int kHeadDim>
void measure(const Shape& shape, int repeats, const Variants& variants) {
  Problem p(shape, variants);
  const flashattn::BackwardParams params = flashattn::validate_backward(p.args);
  const std::string reason = flashattn::cuda::hopper_bwd::why_unsupported(params);
  p.poison_gradients();
  run_fa2_class<Element, kHeadDim>(p.args);
  check(cudaDeviceSynchronize(), "fa2-class run");
  const std::vector<float> reference = p.gradients();
  p.poison_gradients();
  flashattn::backward(p.args);
  check(cudaDeviceSynchronize(), "sm90 run");
  const std::vector<float> ours = p.gradients();
  const double relative = max_relative_difference(ours, reference);
  const double sm90_ms = median_ms([&] { flashattn::backward(p.args); }, repeats);
  const double fa2_class_ms = median_ms([&] { run_fa2_class<Element, kHeadDim>(p.args); }, repeats);
  double plain_ms = sm90_ms;
  if (variants.dropout_p > 0 || variants.alibi) {
    flashattn::BackwardArgs plain = p.args;
    plain.options.dropout_p = 0.0;
    plain.options.maybe_alibi_slopes = {};
    plain_ms = median_ms([&] { flashattn::backward(plain); }, repeats);
  }
  const double flops = 2.5 * p.forward_flops();
  std::printf("%s,%s,%lld,%lld,%lld,%lld,%d,%g,%d,%s,%.4f,%.1f,%.4f,%.4f,%.1f,%.3g\n", shape.sweep,
              flashattn::dtype_name(shape.dtype), static_cast<long long>(shape.batch),
              static_cast<long long>(shape.heads), static_cast<long long>(shape.seqlen),
              static_cast<long long>(shape.head_dim), shape.causal ? 1 : 0, variants.dropout_p, variants.alibi ? 1 : 0,
              reason.empty() ? "sm90" : "fallback", sm90_ms, flops / (sm90_ms * 1e-3) / 1e12, plain_ms, fa2_class_ms,
              flops / (fa2_class_ms * 1e-3) / 1e12, relative);
  std::fflush(stdout);
}

// The backward pass with the Hopper kernel compiled for tile config kConfig.
template <class Element, flashattn::cuda::hopper_bwd::HopperBwdTileConfig kConfig>
void run_variant(const flashattn::BackwardArgs& args) {
  namespace bwd = flashattn::cuda::bwd;
  namespace hopper_bwd = flashattn::cuda::hopper_bwd;
  const flashattn::BackwardParams params = flashattn::validate_backward(args);
  const bwd::Workspace workspace = bwd::carve_workspace(params);
  bwd::launch_preprocess(params, workspace, nullptr);
  // The lockstep schedule (the variants' extra stages leave little room for the overlapped one's second dS^T).
  hopper_bwd::launch_backward_sm90<Element, kConfig>(
      hopper_bwd::make_backward_params(params, workspace, kConfig, hopper_bwd::BackwardSchedule::lockstep), nullptr);
  bwd::launch_convert_dq(params, workspace, nullptr);
}

// Times variant kConfig against the table's config on one shape; max_rel_diff against the table's gradients.
template <class Element, flashattn::cuda::hopper_bwd::HopperBwdTileConfig kConfig>
void compare_variant(const Shape& shape, int repeats, const char* name) {
  Problem p(shape);
  p.poison_gradients();
  flashattn::backward(p.args);
  check(cudaDeviceSynchronize(), "table run");
  const std::vector<float> reference = p.gradients();
  p.poison_gradients();
  run_variant<Element, kConfig>(p.args);
  check(cudaDeviceSynchronize(), "variant run");
  const std::vector<float> ours = p.gradients();
  const double table_ms = median_ms([&] { flashattn::backward(p.args); }, repeats);
  const double variant_ms = median_ms([&] { run_variant<Element, kConfig>(p.args); }, repeats);
  const double flops = 2.5 * p.forward_flops();
  std::printf("%s,%s,%lld,%lld,%lld,%lld,%d,%s,%.4f,%.1f,%.4f,%.1f,%.3g\n", shape.sweep,
              flashattn::dtype_name(shape.dtype), static_cast<long long>(shape.batch),
              static_cast<long long>(shape.heads), static_cast<long long>(shape.seqlen),
              static_cast<long long>(shape.head_dim), shape.causal ? 1 : 0, name, table_ms,
              flops / (table_ms * 1e-3) / 1e12, variant_ms, flops / (variant_ms * 1e-3) / 1e12,
              max_relative_difference(ours, reference));
  std::fflush(stdout);
}

// The backward pass with the library's Hopper kernels, kernel.cuh in `schedule` (no
// kernel compiled here: backward_main dispatches to the library's instantiations).
void run_schedule(const flashattn::BackwardArgs& args, flashattn::cuda::hopper_bwd::BackwardSchedule schedule) {
  namespace bwd = flashattn::cuda::bwd;
  const flashattn::BackwardParams params = flashattn::validate_backward(args);
  const bwd::Workspace workspace = bwd::carve_workspace(params);
  bwd::launch_preprocess(params, workspace, nullptr);
  flashattn::cuda::hopper_bwd::backward_main(params, workspace, nullptr, schedule);
  bwd::launch_convert_dq(params, workspace, nullptr);
}

// Times the schedules on one shape.
void compare_schedules(const Shape& shape, int repeats, const Variants& variants) {
  using flashattn::cuda::hopper_bwd::BackwardSchedule;
  Problem p(shape, variants);
  const std::string reason = flashattn::cuda::hopper_bwd::why_unsupported(flashattn::validate_backward(p.args));
  if (!reason.empty()) {
    std::printf("# %s n%lld: not on the Hopper kernel: %s\n", shape.sweep, static_cast<long long>(shape.seqlen),
                reason.c_str());
    return;
  }
  auto run = [&](BackwardSchedule schedule) { run_schedule(p.args, schedule); };
  // Max |difference| / max |lockstep gradient| over dQ, dK, dV (NaN if either has a NaN).
  p.poison_gradients();
  run(BackwardSchedule::lockstep);
  check(cudaDeviceSynchronize(), "lockstep run");
  const std::vector<float> reference = p.gradients();
  auto difference_to_lockstep = [&](BackwardSchedule schedule) {
    p.poison_gradients();
    run(schedule);
    check(cudaDeviceSynchronize(), "schedule run");
    return max_relative_difference(p.gradients(), reference);
  };
  const double overlapped_diff = difference_to_lockstep(BackwardSchedule::overlapped);
  const double deferred_diff = difference_to_lockstep(BackwardSchedule::deferred_dk);
  const double lockstep_ms = median_ms([&] { run(BackwardSchedule::lockstep); }, repeats);
  const double overlapped_ms = median_ms([&] { run(BackwardSchedule::overlapped); }, repeats);
  const double deferred_ms = median_ms([&] { run(BackwardSchedule::deferred_dk); }, repeats);
  const double flops = 2.5 * p.forward_flops();
  auto tflops = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
  std::printf("%s,%s,%lld,%lld,%lld,%lld,%d,%d,%.4f,%.1f,%.4f,%.1f,%.4f,%.1f,%.3f,%.3f,%.3g,%.3g\n", shape.sweep,
              flashattn::dtype_name(shape.dtype), static_cast<long long>(shape.batch),
              static_cast<long long>(shape.heads), static_cast<long long>(shape.seqlen),
              static_cast<long long>(shape.head_dim), shape.causal ? 1 : 0, variants.deterministic ? 1 : 0, lockstep_ms,
              tflops(lockstep_ms), overlapped_ms, tflops(overlapped_ms), deferred_ms, tflops(deferred_ms),
              lockstep_ms / overlapped_ms, lockstep_ms / deferred_ms, overlapped_diff, deferred_diff);
  std::fflush(stdout);
}

void sweep_schedules(int repeats, bool quick, const Variants& variants) {
  std::printf("sweep,dtype,batch,heads,seqlen,head_dim,causal,deterministic,lockstep_ms,lockstep_tflops,"
              "overlapped_ms,overlapped_tflops,deferred_dk_ms,deferred_dk_tflops,overlapped_speedup,"
              "deferred_dk_speedup,overlapped_max_rel_diff,deferred_dk_max_rel_diff\n");
  const std::vector<std::int64_t> seqlens =
      quick ? std::vector<std::int64_t>{1024, 4096, 16384} : std::vector<std::int64_t>{512, 1024, 2048, 4096, 8192, 16384};
  for (std::int64_t n : seqlens)
    for (bool causal : {false, true}) {
      if (n >= 1024)
        compare_schedules({"seed004_fp16_b4h48_d64", flashattn::DType::float16, 4, 48, n, 64, causal}, repeats,
                          variants);
      for (std::int64_t d : {64, 128})
        compare_schedules({"fa3_bf16_16k_tokens", flashattn::DType::bfloat16, 16384 / n, 2048 / d, n, d, causal},
                          repeats, variants);
    }
}

// Times kernel.cuh's grids on one shape (the library's dispatch, its schedule).
void compare_grids(const Shape& shape, int repeats, const Variants& variants) {
  namespace hopper_bwd = flashattn::cuda::hopper_bwd;
  Problem p(shape, variants);
  const std::string reason = hopper_bwd::why_unsupported(flashattn::validate_backward(p.args));
  if (!reason.empty()) {
    std::printf("# %s n%lld: not on the Hopper kernel: %s\n", shape.sweep, static_cast<long long>(shape.seqlen),
                reason.c_str());
    return;
  }
  constexpr int kPerTile = 0, kEverySm = 1 << 30;  // persistent_grid_ctas caps it at the SM count
  auto run_with = [&](int ctas, bool is_dynamic) {
    hopper_bwd::override_persistent_grid_ctas(ctas, is_dynamic);
    flashattn::backward(p.args);
  };
  p.poison_gradients();
  run_with(kPerTile, false);
  check(cudaDeviceSynchronize(), "per-tile grid run");
  const std::vector<float> reference = p.gradients();
  p.poison_gradients();
  run_with(kEverySm, false);
  check(cudaDeviceSynchronize(), "persistent grid run");
  const double difference = max_relative_difference(p.gradients(), reference);
  p.poison_gradients();
  run_with(kEverySm, true);
  check(cudaDeviceSynchronize(), "dynamic grid run");
  const double dynamic_difference = max_relative_difference(p.gradients(), reference);
  const double per_tile_ms = median_ms([&] { run_with(kPerTile, false); }, repeats);
  const double persistent_ms = median_ms([&] { run_with(kEverySm, false); }, repeats);
  const double dynamic_ms = median_ms([&] { run_with(kEverySm, true); }, repeats);
  hopper_bwd::override_persistent_grid_ctas(-1);
  const double flops = 2.5 * p.forward_flops();
  auto tflops = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
  std::printf("%s,%s,%lld,%lld,%lld,%lld,%d,%d,%.4f,%.1f,%.4f,%.1f,%.3f,%.3g,%.4f,%.1f,%.3f,%.3g\n", shape.sweep,
              flashattn::dtype_name(shape.dtype), static_cast<long long>(shape.batch),
              static_cast<long long>(shape.heads), static_cast<long long>(shape.seqlen),
              static_cast<long long>(shape.head_dim), shape.causal ? 1 : 0, variants.deterministic ? 1 : 0, per_tile_ms,
              tflops(per_tile_ms), persistent_ms, tflops(persistent_ms), per_tile_ms / persistent_ms, difference,
              dynamic_ms, tflops(dynamic_ms), per_tile_ms / dynamic_ms, dynamic_difference);
  std::fflush(stdout);
}

void sweep_grids(int repeats, bool quick, const Variants& variants) {
  std::printf("sweep,dtype,batch,heads,seqlen,head_dim,causal,deterministic,per_tile_ms,per_tile_tflops,"
              "persistent_ms,persistent_tflops,persistent_speedup,max_rel_diff,dynamic_ms,dynamic_tflops,"
              "dynamic_speedup,dynamic_max_rel_diff\n");
  const std::vector<std::int64_t> seqlens =
      quick ? std::vector<std::int64_t>{1024, 4096, 16384} : std::vector<std::int64_t>{512, 1024, 2048, 4096, 8192, 16384};
  for (std::int64_t n : seqlens)
    for (bool causal : {false, true}) {
      if (n >= 1024)
        compare_grids({"seed004_fp16_b4h48_d64", flashattn::DType::float16, 4, 48, n, 64, causal}, repeats, variants);
      for (std::int64_t d : {64, 128})
        compare_grids({"fa3_bf16_16k_tokens", flashattn::DType::bfloat16, 16384 / n, 2048 / d, n, d, causal},
                      repeats, variants);
    }
}

// A two-way switch of kernel.cuh that the timing overrides in-process: its name in the CSV
// columns (off_ms, on_ms) and the override (0 off, 1 on, negative: the environment's again).
struct KernelSwitch {
  const char* off;
  const char* on;
  void (*override_with)(int);
};

// Times the switch off and on on one shape (the library's dispatch).
void compare_switch(const KernelSwitch& knob, const Shape& shape, int repeats, const Variants& variants) {
  namespace hopper_bwd = flashattn::cuda::hopper_bwd;
  Problem p(shape, variants);
  const std::string reason = hopper_bwd::why_unsupported(flashattn::validate_backward(p.args));
  if (!reason.empty()) {
    std::printf("# %s n%lld: not on the Hopper kernel: %s\n", shape.sweep, static_cast<long long>(shape.seqlen),
                reason.c_str());
    return;
  }
  auto run_with = [&](int is_on) {
    knob.override_with(is_on);
    flashattn::backward(p.args);
  };
  p.poison_gradients();
  run_with(0);
  check(cudaDeviceSynchronize(), knob.off);
  const std::vector<float> reference = p.gradients();
  p.poison_gradients();
  run_with(1);
  check(cudaDeviceSynchronize(), knob.on);
  const double difference = max_relative_difference(p.gradients(), reference);
  const double off_ms = median_ms([&] { run_with(0); }, repeats);
  const double on_ms = median_ms([&] { run_with(1); }, repeats);
  knob.override_with(-1);
  const double flops = 2.5 * p.forward_flops();
  auto tflops = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
  std::printf("%s,%s,%lld,%lld,%lld,%lld,%d,%d,%.4f,%.1f,%.4f,%.1f,%.3f,%.3g\n", shape.sweep,
              flashattn::dtype_name(shape.dtype), static_cast<long long>(shape.batch),
              static_cast<long long>(shape.heads), static_cast<long long>(shape.seqlen),
              static_cast<long long>(shape.head_dim), shape.causal ? 1 : 0, variants.deterministic ? 1 : 0, off_ms,
              tflops(off_ms), on_ms, tflops(on_ms), off_ms / on_ms, difference);
  std::fflush(stdout);
}

void sweep_switch(const KernelSwitch& knob, int repeats, bool quick, const Variants& variants) {
  std::printf("sweep,dtype,batch,heads,seqlen,head_dim,causal,deterministic,%s_ms,%s_tflops,%s_ms,%s_tflops,"
              "%s_speedup,max_rel_diff\n", knob.off, knob.off, knob.on, knob.on, knob.on);
  const std::vector<std::int64_t> seqlens =
      quick ? std::vector<std::int64_t>{1024, 4096, 16384} : std::vector<std::int64_t>{512, 1024, 2048, 4096, 8192, 16384};
  for (std::int64_t n : seqlens)
    for (bool causal : {false, true}) {
      if (n >= 1024)
        compare_switch(knob, {"seed004_fp16_b4h48_d64", flashattn::DType::float16, 4, 48, n, 64, causal}, repeats,
                       variants);
      for (std::int64_t d : {64, 128})
        compare_switch(knob, {"fa3_bf16_16k_tokens", flashattn::DType::bfloat16, 16384 / n, 2048 / d, n, d, causal},
                       repeats, variants);
    }
}

// Variant names: m<block_m>_n<block_n>_s<stages>.
void sweep_variants(int repeats) {
  using flashattn::cuda::hopper_bwd::HopperBwdTileConfig;
  std::printf("sweep,dtype,batch,heads,seqlen,head_dim,causal,variant,table_ms,table_tflops,variant_ms,"
              "variant_tflops,max_rel_diff\n");
  for (bool causal : {false, true}) {
    const Shape d64{"seed004_fp16_b4h48_d64", flashattn::DType::float16, 4, 48, 4096, 64, causal};
    compare_variant<__half, HopperBwdTileConfig{64, 128, 128, 3}>(d64, repeats, "m128_n128_s3");
    const Shape d128{"fa3_bf16_16k_tokens", flashattn::DType::bfloat16, 4, 16, 4096, 128, causal};
    compare_variant<__nv_bfloat16, HopperBwdTileConfig{128, 64, 128, 3}>(d128, repeats, "m64_n128_s3");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 20;
  const bool quick = argc > 2 && std::string(argv[2]) == "--quick";
  // --head-dim D: only the shapes of head dim D (full seqlen sweep).
  const std::int64_t only_head_dim = argc > 3 && std::string(argv[2]) == "--head-dim" ? std::atoll(argv[3]) : 0;
  Variants variants;
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "--dropout" && i + 1 < argc) variants.dropout_p = std::atof(argv[i + 1]);
    if (std::string(argv[i]) == "--alibi") variants.alibi = true;
    if (std::string(argv[i]) == "--deterministic") variants.deterministic = true;
  }
  if (!flashattn::cuda_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  if (argc > 2 && std::string(argv[2]) == "--variants") {
    sweep_variants(repeats);
    return 0;
  }
  if (argc > 2 && std::string(argv[2]) == "--grids") {
    bool quick_grids = false;
    for (int i = 3; i < argc; ++i) quick_grids = quick_grids || std::string(argv[i]) == "--quick";
    sweep_grids(repeats, quick_grids, variants);
    return 0;
  }
  if (argc > 2 && (std::string(argv[2]) == "--dq-handoff" || std::string(argv[2]) == "--epilogues")) {
    namespace hopper_bwd = flashattn::cuda::hopper_bwd;
    const KernelSwitch knob = std::string(argv[2]) == "--dq-handoff"
                                  ? KernelSwitch{"early", "late", hopper_bwd::override_dq_handoff}
                                  : KernelSwitch{"registers", "tma", hopper_bwd::override_epilogue_tma};
    bool quick_switch = false;
    for (int i = 3; i < argc; ++i) quick_switch = quick_switch || std::string(argv[i]) == "--quick";
    sweep_switch(knob, repeats, quick_switch, variants);
    return 0;
  }
  if (argc > 2 && std::string(argv[2]) == "--schedules") {
    bool quick_schedules = false;
    for (int i = 3; i < argc; ++i) quick_schedules = quick_schedules || std::string(argv[i]) == "--quick";
    sweep_schedules(repeats, quick_schedules, variants);
    return 0;
  }
  // The sweeps of shared/BENCHMARKS.md at the kernel's head dims: seed 004 (fp16 B4 H48
  // d64) and the FA3 sweep (bf16, 16k tokens, 2048 / d heads); --quick: 3 lengths.
  std::vector<Shape> shapes;
  const std::vector<std::int64_t> seqlens =
      quick ? std::vector<std::int64_t>{1024, 4096, 16384} : std::vector<std::int64_t>{512, 1024, 2048, 4096, 8192, 16384};
  for (std::int64_t n : seqlens)
    if (n >= 1024)
      for (bool causal : {false, true}) shapes.push_back({"seed004_fp16_b4h48_d64", flashattn::DType::float16, 4, 48, n, 64, causal});
  for (std::int64_t d : {64, 128, 256})
    for (std::int64_t n : seqlens)
      for (bool causal : {false, true})
        shapes.push_back({"fa3_bf16_16k_tokens", flashattn::DType::bfloat16, 16384 / n, 2048 / d, n, d, causal});
  std::printf("sweep,dtype,batch,heads,seqlen,head_dim,causal,dropout_p,alibi,path,sm90_ms,sm90_tflops,sm90_plain_ms,"
              "fa2_class_ms,fa2_class_tflops,max_rel_diff\n");
  for (const Shape& shape : shapes) {
    if (only_head_dim != 0 && shape.head_dim != only_head_dim) continue;
    try {
      const bool is_half = shape.dtype == flashattn::DType::float16;
      if (shape.head_dim == 64) {
        if (is_half) measure<__half, 64>(shape, repeats, variants);
        else measure<__nv_bfloat16, 64>(shape, repeats, variants);
      } else if (shape.head_dim == 256) {
        if (is_half) measure<__half, 256>(shape, repeats, variants);
        else measure<__nv_bfloat16, 256>(shape, repeats, variants);
      } else {
        if (is_half) measure<__half, 128>(shape, repeats, variants);
        else measure<__nv_bfloat16, 128>(shape, repeats, variants);
      }
    } catch (const std::exception& e) {
      std::printf("# %s n%lld: %s\n", shape.sweep, static_cast<long long>(shape.seqlen), e.what());
    }
  }
  return 0;
}
