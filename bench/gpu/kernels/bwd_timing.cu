// bench/gpu/kernels/bwd_timing.cu — times flashattn::backward alone (CUDA events, median
// of repeats) on the shapes of shared/BENCHMARKS.md, default and deterministic;
// with --configs, alternative tile configs of the same kernels against the table's.
// Not a test: it prints CSV; the anchors (FA2/cuDNN backward) come from
// BENCHMARKS.md or a side-by-side PyTorch run. FLOPs = 2.5 x forward
// (forward = 4 B H Nq Nk d, halved for causal).
//
// Inputs are random (a hash of the index, never zeros); O is random too and LSE is
// set to ln(seqlen_k) + 0.5, what random unit-variance scores give, so P has the
// magnitudes of a real backward pass. The kernels' speed does not depend on
// whether O matches Q, K, V.
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

// Times the unmasked kernels only; without the masked ones this file compiles in half the time.
#define FLASHATTN_BWD_MASKED_KERNELS 0

#include "bench/gpu/kernels/gradient_difference.hpp"
#include "flashattn/flashattn.hpp"
#include "src/core/validate.hpp"
#include "src/cuda/bwd/launch_main.cuh"
#include "src/cuda/bwd/workspace.hpp"

namespace {

void check(cudaError_t code, const char* what) {
  if (code != cudaSuccess) {
    std::fprintf(stderr, "CUDA error %s in %s\n", cudaGetErrorString(code), what);
    std::exit(1);
  }
}

template <class Element>
__global__ void fill_random(Element* data, std::int64_t n, std::uint32_t seed, float scale) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    const float uniform = (x >> 8) * (1.0f / 16777216.0f);  // [0, 1)
    data[i] = static_cast<Element>((uniform * 2.0f - 1.0f) * 1.7320508f * scale);  // unit variance * scale
  }
}

__global__ void fill_value(float* data, std::int64_t n, float value) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    data[i] = value;
}

struct Shape {
  const char* sweep;
  flashattn::DType dtype;
  std::int64_t batch, heads, seqlen, head_dim;
  bool causal;
};

template <class Element>
void fill(void* data, std::int64_t n, std::uint32_t seed) {
  fill_random<Element><<<1024, 256>>>(static_cast<Element*>(data), n, seed, 1.0f);
  check(cudaGetLastError(), "fill_random");
}

// Device tensors and BackwardArgs of one benchmark shape (contiguous [b, n, h, d]).
struct Problem {
  Shape shape;
  std::int64_t elements = 0;
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *dout = nullptr, *dq = nullptr, *dk = nullptr,
       *dv = nullptr, *workspace = nullptr;
  float* lse = nullptr;
  flashattn::BackwardArgs args;

  Problem(const Shape& s, bool deterministic) : shape(s) {
    using flashattn::TensorView;
    const auto device = flashattn::Device::cuda(0);
    const std::int64_t b = s.batch, h = s.heads, n = s.seqlen, d = s.head_dim;
    elements = b * n * h * d;
    for (void** p : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) check(cudaMalloc(p, elements * 2), "cudaMalloc");
    check(cudaMalloc(&lse, b * h * n * sizeof(float)), "cudaMalloc lse");
    std::uint32_t seed = 1;
    for (void* p : {q, k, v, o, dout, dq, dk, dv}) {
      if (s.dtype == flashattn::DType::float16) fill<__half>(p, elements, seed++);
      else fill<__nv_bfloat16>(p, elements, seed++);
    }
    fill_value<<<1024, 256>>>(lse, b * h * n, std::log(static_cast<float>(n)) + 0.5f);
    check(cudaGetLastError(), "fill_value");
    auto view = [&](void* data) { return TensorView::contiguous(data, s.dtype, {b, n, h, d}, device); };
    args.q = view(q), args.k = view(k), args.v = view(v), args.out = view(o), args.dout = view(dout);
    args.dq = view(dq), args.dk = view(dk), args.dv = view(dv);
    args.lse = TensorView::contiguous(lse, flashattn::DType::float32, {b, h, n}, device);
    args.options.causal = s.causal;
    args.options.deterministic = deterministic;
    const std::size_t workspace_bytes = flashattn::backward_workspace_bytes(args);
    if (workspace_bytes > 0) check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc workspace");
    args.maybe_workspace = TensorView::contiguous(
        workspace, flashattn::DType::uint8, {static_cast<std::int64_t>(std::max<std::size_t>(workspace_bytes, 1))}, device);
  }
  ~Problem() {
    for (void* p : {q, k, v, o, dout, dq, dk, dv, static_cast<void*>(lse), workspace}) cudaFree(p);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  double forward_flops() const {
    return 4.0 * shape.batch * shape.heads * shape.seqlen * shape.seqlen * shape.head_dim * (shape.causal ? 0.5 : 1.0);
  }
  // dq, dk, dv as floats (for comparing tile configs).
  std::vector<float> gradients() const {
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(elements));
    std::vector<float> values;
    for (void* p : {dq, dk, dv}) {
      check(cudaMemcpy(bits.data(), p, elements * 2, cudaMemcpyDeviceToHost), "download");
      for (std::uint16_t x : bits) {
        std::uint32_t u;
        if (shape.dtype == flashattn::DType::bfloat16) {
          u = static_cast<std::uint32_t>(x) << 16;
        } else {
          const __half h = *reinterpret_cast<const __half*>(&x);
          const float f = __half2float(h);
          std::memcpy(&u, &f, 4);
        }
        float f;
        std::memcpy(&f, &u, 4);
        values.push_back(f);
      }
    }
    return values;
  }
};

// Median milliseconds of `run` over `repeats` after 3 warm-ups.
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

// The library's backward with an alternative tile config (same kernels, other traits).
template <class T, class D>
void run_with_traits(const flashattn::BackwardArgs& args) {
  namespace bwd = flashattn::cuda::bwd;
  const flashattn::BackwardParams params = flashattn::validate_backward(args);
  const bwd::Workspace workspace = bwd::carve_workspace(params);
  bwd::launch_preprocess(params, workspace, nullptr);
  bwd::launch_kernels<T, D>(params, workspace, bwd::allows_vector_access(params), nullptr);
  if (!params.deterministic) bwd::launch_convert_dq(params, workspace, nullptr);
}

void print_row(const Problem& p, bool deterministic, const char* config, double ms, double max_difference) {
  const Shape& s = p.shape;
  std::printf("%s,%s,%lld,%lld,%lld,%lld,%d,%d,%s,%.4f,%.1f,%.3g\n", s.sweep, flashattn::dtype_name(s.dtype),
              static_cast<long long>(s.batch), static_cast<long long>(s.heads), static_cast<long long>(s.seqlen),
              static_cast<long long>(s.head_dim), s.causal ? 1 : 0, deterministic ? 1 : 0, config, ms,
              2.5 * p.forward_flops() / (ms * 1e-3) / 1e12, max_difference);
  std::fflush(stdout);
}

// Times tile config `kConfig` against the table's on one shape; max_difference is
// max|grad - grad_table| / max|grad_table| over dq, dk, dv (a broken config shows).
template <class Element, int kHeadDim, flashattn::cuda::bwd::DkdvConfig kConfig>
void compare_config(const Shape& shape, int repeats, const char* name) {
  for (bool deterministic : {false, true}) {
    Problem p(shape, deterministic);
    flashattn::backward(p.args);
    const std::vector<float> reference = p.gradients();
    using T = flashattn::cuda::bwd::DkdvTraits<Element, kHeadDim, kConfig>;
    using D = flashattn::cuda::bwd::DqTraits<Element, kHeadDim>;
    try {
      run_with_traits<T, D>(p.args);
    } catch (const std::exception& e) {
      std::printf("# %s: %s\n", name, e.what());
      continue;
    }
    const double relative = max_relative_difference(p.gradients(), reference);
    const double ms = median_ms([&] { run_with_traits<T, D>(p.args); }, repeats);
    print_row(p, deterministic, name, ms, relative);
  }
}

// Config names: m<block_m>_n<block_n>_w<warps>_s<stages>_<sdp_warps_m>.<dkdv_warps_n>.<dq_warps_m>
// [_atomics: dQ by vector atomics][_prefetch: fragments of the next k-step loaded early].
void sweep_configs(int repeats, std::int64_t only_head_dim) {
  using flashattn::cuda::bwd::DkdvConfig;
  std::printf("sweep,dtype,batch,heads,seqlen,head_dim,causal,deterministic,config,ms,tflops,max_rel_diff_vs_table\n");
  const auto wants = [&](std::int64_t head_dim) { return only_head_dim == 0 || only_head_dim == head_dim; };
  for (bool causal : {false, true}) {
    if (wants(64)) {
      const Shape d64{"seed004_fp16_b4h48_d64", flashattn::DType::float16, 4, 48, 4096, 64, causal};
      compare_config<__half, 64, DkdvConfig{128, 128, 8, 2, 2, 4, 4}>(d64, repeats, "m128_n128_w8_s2_2.4.4");
      compare_config<__half, 64, DkdvConfig{128, 128, 8, 2, 2, 4, 4, true}>(d64, repeats, "m128_n128_w8_s2_2.4.4_atomics");
      compare_config<__half, 64, DkdvConfig{128, 128, 8, 2, 2, 4, 4, false, true}>(d64, repeats, "m128_n128_w8_s2_2.4.4_prefetch");
      compare_config<__half, 64, DkdvConfig{128, 128, 8, 2, 2, 4, 4, true, true}>(d64, repeats, "m128_n128_w8_s2_2.4.4_atomics_prefetch");
      compare_config<__half, 64, DkdvConfig{64, 128, 8, 2, 2, 4, 4, false, true}>(d64, repeats, "m64_n128_w8_s2_2.4.4_prefetch");
      compare_config<__half, 64, DkdvConfig{128, 128, 8, 2, 4, 4, 4, false, true}>(d64, repeats, "m128_n128_w8_s2_4.4.4_prefetch");
      compare_config<__half, 64, DkdvConfig{128, 128, 16, 2, 4, 8, 8}>(d64, repeats, "m128_n128_w16_s2_4.8.8");
    }
    if (wants(128)) {
      const Shape d128{"fa3_bf16_16k_tokens", flashattn::DType::bfloat16, 4, 16, 4096, 128, causal};
      compare_config<__nv_bfloat16, 128, DkdvConfig{64, 128, 8, 2, 2, 4, 2}>(d128, repeats, "m64_n128_w8_s2_2.4.2");
      compare_config<__nv_bfloat16, 128, DkdvConfig{64, 128, 8, 2, 2, 4, 2, true}>(d128, repeats, "m64_n128_w8_s2_2.4.2_atomics");
      compare_config<__nv_bfloat16, 128, DkdvConfig{64, 128, 8, 2, 2, 4, 2, false, true}>(d128, repeats, "m64_n128_w8_s2_2.4.2_prefetch");
      compare_config<__nv_bfloat16, 128, DkdvConfig{64, 128, 8, 2, 2, 4, 2, true, true}>(d128, repeats, "m64_n128_w8_s2_2.4.2_atomics_prefetch");
      compare_config<__nv_bfloat16, 128, DkdvConfig{32, 128, 8, 2, 2, 8, 2, false, true}>(d128, repeats, "m32_n128_w8_s2_2.8.2_prefetch");
      compare_config<__nv_bfloat16, 128, DkdvConfig{64, 128, 8, 2, 2, 4, 4, false, true}>(d128, repeats, "m64_n128_w8_s2_2.4.4_prefetch");
      compare_config<__nv_bfloat16, 128, DkdvConfig{64, 128, 16, 2, 2, 8, 4}>(d128, repeats, "m64_n128_w16_s2_2.8.4");
    }
    if (wants(256)) {
      const Shape d256{"fa3_bf16_16k_tokens", flashattn::DType::bfloat16, 4, 8, 4096, 256, causal};
      compare_config<__nv_bfloat16, 256, DkdvConfig{64, 64, 8, 1, 4, 2, 2}>(d256, repeats, "m64_n64_w8_s1_4.2.2");
      compare_config<__nv_bfloat16, 256, DkdvConfig{64, 64, 8, 1, 4, 2, 2, true}>(d256, repeats, "m64_n64_w8_s1_4.2.2_atomics");
      compare_config<__nv_bfloat16, 256, DkdvConfig{64, 64, 8, 1, 4, 2, 2, false, true}>(d256, repeats, "m64_n64_w8_s1_4.2.2_prefetch");
      compare_config<__nv_bfloat16, 256, DkdvConfig{64, 64, 8, 1, 4, 2, 2, true, true}>(d256, repeats, "m64_n64_w8_s1_4.2.2_atomics_prefetch");
      compare_config<__nv_bfloat16, 256, DkdvConfig{32, 64, 8, 2, 2, 4, 2, false, true}>(d256, repeats, "m32_n64_w8_s2_2.4.2_prefetch");
      compare_config<__nv_bfloat16, 256, DkdvConfig{32, 64, 8, 2, 2, 4, 2, true}>(d256, repeats, "m32_n64_w8_s2_2.4.2_atomics");
      // FA2's own d256 tiles on sm80/sm90 (64 x 64, 8 warps, Q/dO double-buffered, dQ by
      // atomics): 209 KB, which fits only without the fp32 dQ staging tile.
      compare_config<__nv_bfloat16, 256, DkdvConfig{64, 64, 8, 2, 4, 2, 2, true}>(d256, repeats, "m64_n64_w8_s2_4.2.2_atomics");
      compare_config<__nv_bfloat16, 256, DkdvConfig{64, 64, 8, 2, 4, 2, 2, true, true}>(d256, repeats, "m64_n64_w8_s2_4.2.2_atomics_prefetch");
    }
  }
}

}  // namespace

// flashattn_bwd_timing [repeats]                 the BENCHMARKS.md shapes, default + deterministic
// flashattn_bwd_timing [repeats] --head-dim D    only the shapes of head dim D
// flashattn_bwd_timing [repeats] --configs [D]   alternative tile configs on a few shapes (of head dim D)
int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 20;
  const bool is_config_sweep = argc > 2 && std::string(argv[2]) == "--configs";
  const std::int64_t only_head_dim =
      argc > 3 && (std::string(argv[2]) == "--head-dim" || is_config_sweep) ? std::atoll(argv[3]) : 0;
  if (!flashattn::cuda_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  if (is_config_sweep) {
    sweep_configs(repeats, only_head_dim);
    return 0;
  }
  std::vector<Shape> shapes;
  for (std::int64_t n : {1024, 2048, 4096, 8192, 16384})
    for (bool causal : {false, true}) shapes.push_back({"seed004_fp16_b4h48_d64", flashattn::DType::float16, 4, 48, n, 64, causal});
  for (std::int64_t d : {64, 128, 256})
    for (std::int64_t n : {512, 1024, 2048, 4096, 8192, 16384})
      for (bool causal : {false, true})
        shapes.push_back({"fa3_bf16_16k_tokens", flashattn::DType::bfloat16, 16384 / n, 2048 / d, n, d, causal});
  std::printf("sweep,dtype,batch,heads,seqlen,head_dim,causal,deterministic,config,ms,tflops,max_rel_diff_vs_table\n");
  for (const Shape& shape : shapes) {
    if (only_head_dim != 0 && shape.head_dim != only_head_dim) continue;
    for (bool deterministic : {false, true}) {
      try {
        Problem p(shape, deterministic);
        const double ms = median_ms([&] { flashattn::backward(p.args); }, repeats);
        print_row(p, deterministic, "table", ms, 0.0);
      } catch (const std::exception& e) {
        std::printf("# %s d%lld: %s\n", shape.sweep, static_cast<long long>(shape.head_dim), e.what());
      }
    }
  }
  return 0;
}
