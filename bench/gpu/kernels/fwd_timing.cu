// bench/gpu/kernels/fwd_timing.cu — times the CUDA forward with CUDA events on random
// inputs for the key shapes of ../shared/BENCHMARKS.md (not a test: no assertions on
// timing). The full harness against PyTorch lives in bench/gpu; this is the kernel
// engineer's loop: the production path (flashattn::forward) plus a few alternative
// tile configs, so one device run can compare them.
//
// Usage: flashattn_fwd_timing [--quick | --profile]   prints CSV: kind,sweep,dtype,batch,heads,seqlen,head_dim,causal,
//   config,ms,tflops,max_abs_diff_vs_table,unwritten (outputs are poisoned with NaN and
//   checked written; a variant is compared with the production kernel on the same inputs)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "src/core/validate.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/fwd/kernel.cuh"

namespace flashattn::cuda::fwd {
namespace {

// Normal-ish random values (sum of uniforms) from a counter hash: never zeros.
template <class T>
__global__ void fill_random(T* data, std::int64_t count, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    float sum = 0.0f;
    for (int r = 0; r < 4; ++r) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      sum += static_cast<float>(x & 0xffffff) / 16777216.0f;
    }
    data[i] = Numeric<T>::from_float((sum - 2.0f) * 1.7f);
  }
}

// Elements of `out` still holding the NaN poison, and max |out - reference| over the rest.
template <class T>
__global__ void compare_outputs(const T* out, const T* reference, std::int64_t count, unsigned long long* unwritten,
                                int* max_difference_bits) {
  unsigned long long local_unwritten = 0;
  float local_max = 0.0f;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float value = Numeric<T>::to_float(out[i]);
    if (value != value) {
      ++local_unwritten;
    } else {
      local_max = fmaxf(local_max, fabsf(value - Numeric<T>::to_float(reference[i])));
    }
  }
  if (local_unwritten != 0) atomicAdd(unwritten, local_unwritten);
  atomicMax(max_difference_bits, __float_as_int(local_max));  // non-negative floats order like their bits
}

struct Shape {
  const char* sweep;
  DType dtype;
  std::int64_t batch, heads, seqlen, head_dim;
  bool causal;
};

template <class T>
struct Buffers {
  T *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  float* lse = nullptr;
  explicit Buffers(const Shape& s) {
    const std::int64_t n = s.batch * s.seqlen * s.heads * s.head_dim;
    FLASHATTN_CUDA_CHECK(cudaMalloc(&q, n * sizeof(T)));
    FLASHATTN_CUDA_CHECK(cudaMalloc(&k, n * sizeof(T)));
    FLASHATTN_CUDA_CHECK(cudaMalloc(&v, n * sizeof(T)));
    FLASHATTN_CUDA_CHECK(cudaMalloc(&out, n * sizeof(T)));
    FLASHATTN_CUDA_CHECK(cudaMalloc(&lse, s.batch * s.heads * s.seqlen * sizeof(float)));
    fill_random<<<1024, 256>>>(q, n, 1);
    fill_random<<<1024, 256>>>(k, n, 2);
    fill_random<<<1024, 256>>>(v, n, 3);
    FLASHATTN_CUDA_CHECK(cudaMemset(out, 0xff, n * sizeof(T)));  // NaN poison
    FLASHATTN_CUDA_CHECK_LAUNCH();
    FLASHATTN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~Buffers() {
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(lse);
  }
  ForwardArgs args(const Shape& s) const {
    const Device gpu = Device::cuda(0);
    ForwardArgs a;
    a.q = TensorView::contiguous(q, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, gpu);
    a.k = TensorView::contiguous(k, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, gpu);
    a.v = TensorView::contiguous(v, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, gpu);
    a.out = TensorView::contiguous(out, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, gpu);
    a.maybe_lse = TensorView::contiguous(lse, DType::float32, {s.batch, s.heads, s.seqlen}, gpu);
    a.options.causal = s.causal;
    return a;
  }
};

// Median of `reps` CUDA-event timings after `warmup` runs, in milliseconds.
double median_ms(const std::function<void()>& run, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) run();
  cudaEvent_t start, stop;
  FLASHATTN_CUDA_CHECK(cudaEventCreate(&start));
  FLASHATTN_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    FLASHATTN_CUDA_CHECK(cudaEventRecord(start));
    run();
    FLASHATTN_CUDA_CHECK(cudaEventRecord(stop));
    FLASHATTN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FLASHATTN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  cudaEventDestroy(start), cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double tflops(const Shape& s, double ms) {
  const double flops = 4.0 * s.batch * s.heads * s.seqlen * s.seqlen * s.head_dim * (s.causal ? 0.5 : 1.0);
  return flops / (ms * 1e-3) / 1e12;
}

void report(const char* kind, const Shape& s, const std::string& config, double ms, double max_difference,
            unsigned long long unwritten) {
  std::printf("%s,%s,%s,%lld,%lld,%lld,%lld,%d,%s,%.4f,%.1f,%.3g,%llu\n", kind, s.sweep, dtype_name(s.dtype),
              static_cast<long long>(s.batch), static_cast<long long>(s.heads), static_cast<long long>(s.seqlen),
              static_cast<long long>(s.head_dim), s.causal ? 1 : 0, config.c_str(), ms, tflops(s, ms), max_difference,
              unwritten);
  std::fflush(stdout);
}

// Poisons out, runs `run` once, and compares out with `reference` (or with itself
// when reference is null: then only the unwritten count is meaningful).
template <class T>
void check_output(const Shape& s, T* out, const T* reference, const std::function<void()>& run,
                  double& max_difference, unsigned long long& unwritten) {
  const std::int64_t n = s.batch * s.seqlen * s.heads * s.head_dim;
  FLASHATTN_CUDA_CHECK(cudaMemset(out, 0xff, n * sizeof(T)));
  run();
  unsigned long long* device_unwritten = nullptr;
  int* device_max_bits = nullptr;
  FLASHATTN_CUDA_CHECK(cudaMalloc(&device_unwritten, sizeof(unsigned long long)));
  FLASHATTN_CUDA_CHECK(cudaMalloc(&device_max_bits, sizeof(int)));
  FLASHATTN_CUDA_CHECK(cudaMemset(device_unwritten, 0, sizeof(unsigned long long)));
  FLASHATTN_CUDA_CHECK(cudaMemset(device_max_bits, 0, sizeof(int)));
  compare_outputs<<<1024, 256>>>(out, reference != nullptr ? reference : out, n, device_unwritten, device_max_bits);
  FLASHATTN_CUDA_CHECK_LAUNCH();
  int max_bits = 0;
  FLASHATTN_CUDA_CHECK(cudaMemcpy(&unwritten, device_unwritten, sizeof unwritten, cudaMemcpyDeviceToHost));
  FLASHATTN_CUDA_CHECK(cudaMemcpy(&max_bits, device_max_bits, sizeof max_bits, cudaMemcpyDeviceToHost));
  cudaFree(device_unwritten), cudaFree(device_max_bits);
  float max_float = 0.0f;
  std::memcpy(&max_float, &max_bits, sizeof max_float);
  max_difference = max_float;
}

std::string name_of(const TileConfig& c) {
  return "M" + std::to_string(c.block_m) + "_N" + std::to_string(c.block_n) + "_W" + std::to_string(c.warps) + "_S" +
         std::to_string(c.stages) + "_B" + std::to_string(c.min_blocks_per_sm);
}

// A variant is timed, then checked against the production kernel on the same inputs
// (max |difference| should be a few units of the dtype's rounding; unwritten 0).
template <class T, TileConfig kConfig>
void time_variant(const Shape& s, int warmup, int reps) {
  if (s.head_dim != kConfig.kernel_head_dim || Numeric<T>::kDType != s.dtype) return;
  Buffers<T> buffers(s);
  const AttentionParams params = validate_forward(buffers.args(s));
  const double ms = median_ms([&] { launch_forward<T, kConfig>(params, nullptr); }, warmup, reps);
  const std::int64_t n = s.batch * s.seqlen * s.heads * s.head_dim;
  T* production_out = nullptr;
  FLASHATTN_CUDA_CHECK(cudaMalloc(&production_out, n * sizeof(T)));
  ForwardArgs production_args = buffers.args(s);
  production_args.out.data = production_out;
  forward(production_args);
  double max_difference = 0;
  unsigned long long unwritten = 0;
  check_output<T>(s, buffers.out, production_out, [&] { launch_forward<T, kConfig>(params, nullptr); },
                  max_difference, unwritten);
  FLASHATTN_CUDA_CHECK(cudaDeviceSynchronize());
  cudaFree(production_out);
  report("variant", s, name_of(kConfig), ms, max_difference, unwritten);
}

template <class T>
void time_production(const Shape& s, int warmup, int reps) {
  Buffers<T> buffers(s);
  const ForwardArgs args = buffers.args(s);
  const double ms = median_ms([&] { forward(args); }, warmup, reps);
  double max_difference = 0;
  unsigned long long unwritten = 0;
  check_output<T>(s, buffers.out, nullptr, [&] { forward(args); }, max_difference, unwritten);
  FLASHATTN_CUDA_CHECK(cudaDeviceSynchronize());
  report("production", s, "table", ms, max_difference, unwritten);
}

}  // namespace
}  // namespace flashattn::cuda::fwd

int main(int argc, char** argv) {
  using namespace flashattn;
  using namespace flashattn::cuda::fwd;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (argc > 1 && std::strcmp(argv[1], "--profile") == 0) {
    // One launch of the production kernel for a profiler (ncu --launch-count 1).
    const Shape s{"profile", DType::bfloat16, 4, 16, 4096, 128, false};
    time_production<__nv_bfloat16>(s, 0, 1);
    return 0;
  }
  const int warmup = 5, reps = quick ? 10 : 30;
  std::vector<Shape> shapes;
  for (std::int64_t n : {1024, 2048, 4096, 8192, 16384})
    for (bool c : {false, true}) shapes.push_back({"seed004", DType::float16, 4, 48, n, 64, c});
  for (std::int64_t d : {64, 128, 256})
    for (std::int64_t n : {512, 1024, 2048, 4096, 8192, 16384})
      for (bool c : {false, true}) shapes.push_back({"fa3", DType::bfloat16, 16384 / n, 2048 / d, n, d, c});
  // Head dims outside the benchmark sweeps, one size each.
  for (std::int64_t d : {32, 96, 192})
    for (std::int64_t n : {4096})
      for (bool c : {false, true}) shapes.push_back({"extra", DType::bfloat16, 16384 / n, 2048 / d, n, d, c});
  std::printf("kind,sweep,dtype,batch,heads,seqlen,head_dim,causal,config,ms,tflops,max_abs_diff_vs_table,unwritten\n");
  for (const Shape& s : shapes) {
    if (s.dtype == DType::float16) time_production<__half>(s, warmup, reps);
    else time_production<__nv_bfloat16>(s, warmup, reps);
  }
  // Alternative tile configs (performance exploration only) at the sizes that matter most.
  for (const Shape& s : shapes) {
    if (s.seqlen != 4096 && s.seqlen != 16384) continue;
    time_variant<__half, TileConfig{64, 128, 64, 4, 3, 2}>(s, warmup, reps);
    time_variant<__half, TileConfig{64, 128, 128, 4, 2, 1}>(s, warmup, reps);
    time_variant<__nv_bfloat16, TileConfig{128, 64, 64, 4, 2, 2}>(s, warmup, reps);
    time_variant<__nv_bfloat16, TileConfig{256, 128, 64, 8, 2, 1}>(s, warmup, reps);
    time_variant<__nv_bfloat16, TileConfig{256, 64, 64, 4, 2, 1}>(s, warmup, reps);
    time_variant<__nv_bfloat16, TileConfig{192, 64, 32, 4, 2, 2}>(s, warmup, reps);
  }
  return 0;
}
