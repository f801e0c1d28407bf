// bench/gpu/kernels/hopper_timing.cu — times the Hopper forward kernel's variants with CUDA
// events on random inputs at the benchmark shapes of ../shared/BENCHMARKS.md (not a
// test: no assertions on timing). The kernel engineer's loop: the production kernel
// (algorithm flash3 through the public API), the FA2 kernel (flash2) on the same
// inputs, and alternative HopperTileConfigs — the mainloop without overlap, with the
// intra-warpgroup overlap only, more stages — each checked against the production
// output (max |difference|) and for unwritten (NaN-poisoned) elements.
// The variant rows time the production kernel with dropout p = 0.1 (config
// flash3_dropout0.1) and with ALiBi slopes per head (flash3_alibi) in the same run as
// the plain forward; their max_abs_diff_vs_production is against the plain output, so
// nonzero by design (only `unwritten` is a check there). The TFLOP/s count the plain
// attention FLOPs, so the ratio to the plain row is the throughput ratio.
//
// Usage: flashattn_hopper_timing [--quick] [--variants]   prints CSV: kind,dtype,batch,heads,seqlen,head_dim,causal,config,
//   ms,tflops,max_abs_diff_vs_production,unwritten
//   --variants: only flash3 plain / dropout / ALiBi, bf16 d64/d128/d256 at seqlen 1k, 4k, 16k.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "flashattn/attention.hpp"
#include "src/core/validate.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/hopper/kernel.cuh"

namespace flashattn::cuda::hopper {
namespace {

struct Shape {
  DType dtype;
  std::int64_t batch, heads, seqlen, head_dim;
  bool causal;
};

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
  atomicMax(max_difference_bits, __float_as_int(local_max));  // non-negative floats order like ints
}

template <class T>
struct Buffers {
  T *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *production_out = nullptr;
  float* lse = nullptr;
  float* alibi_slopes = nullptr;  // [heads]: flash_attn's geometric slopes 2^(-8 (h + 1) / heads)
  std::int64_t elements = 0;
  explicit Buffers(const Shape& s) : elements(s.batch * s.seqlen * s.heads * s.head_dim) {
    for (T** buffer : {&q, &k, &v, &out, &production_out})
      FLASHATTN_CUDA_CHECK(cudaMalloc(buffer, elements * sizeof(T)));
    FLASHATTN_CUDA_CHECK(cudaMalloc(&lse, s.batch * s.heads * s.seqlen * sizeof(float)));
    std::vector<float> slopes(static_cast<std::size_t>(s.heads));
    for (std::int64_t h = 0; h < s.heads; ++h)
      slopes[static_cast<std::size_t>(h)] = std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(s.heads));
    FLASHATTN_CUDA_CHECK(cudaMalloc(&alibi_slopes, slopes.size() * sizeof(float)));
    FLASHATTN_CUDA_CHECK(
        cudaMemcpy(alibi_slopes, slopes.data(), slopes.size() * sizeof(float), cudaMemcpyHostToDevice));
    fill_random<<<1024, 256>>>(q, elements, 1);
    fill_random<<<1024, 256>>>(k, elements, 2);
    fill_random<<<1024, 256>>>(v, elements, 3);
    FLASHATTN_CUDA_CHECK_LAUNCH();
    FLASHATTN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~Buffers() {
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(production_out), cudaFree(lse);
    cudaFree(alibi_slopes);
  }
  ForwardArgs args(const Shape& s, T* destination, Algorithm algorithm) const {
    const Device gpu = Device::cuda(0);
    ForwardArgs a;
    a.q = TensorView::contiguous(q, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, gpu);
    a.k = TensorView::contiguous(k, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, gpu);
    a.v = TensorView::contiguous(v, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, gpu);
    a.out = TensorView::contiguous(destination, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, gpu);
    a.maybe_lse = TensorView::contiguous(lse, DType::float32, {s.batch, s.heads, s.seqlen}, gpu);
    a.options.causal = s.causal;
    a.options.algorithm = algorithm;
    return a;
  }
  // Poisons `out`, runs once, compares with the production output.
  void check(const std::function<void()>& run, double& max_difference, unsigned long long& unwritten) {
    FLASHATTN_CUDA_CHECK(cudaMemset(out, 0xff, elements * sizeof(T)));
    run();
    FLASHATTN_CUDA_CHECK_LAUNCH();
    unsigned long long* device_unwritten = nullptr;
    int* device_max_bits = nullptr;
    FLASHATTN_CUDA_CHECK(cudaMalloc(&device_unwritten, sizeof(unsigned long long)));
    FLASHATTN_CUDA_CHECK(cudaMalloc(&device_max_bits, sizeof(int)));
    FLASHATTN_CUDA_CHECK(cudaMemset(device_unwritten, 0, sizeof(unsigned long long)));
    FLASHATTN_CUDA_CHECK(cudaMemset(device_max_bits, 0, sizeof(int)));
    compare_outputs<<<1024, 256>>>(out, production_out, elements, device_unwritten, device_max_bits);
    FLASHATTN_CUDA_CHECK_LAUNCH();
    int max_bits = 0;
    FLASHATTN_CUDA_CHECK(cudaMemcpy(&unwritten, device_unwritten, sizeof unwritten, cudaMemcpyDeviceToHost));
    FLASHATTN_CUDA_CHECK(cudaMemcpy(&max_bits, device_max_bits, sizeof max_bits, cudaMemcpyDeviceToHost));
    cudaFree(device_unwritten), cudaFree(device_max_bits);
    float max_float = 0.0f;
    std::memcpy(&max_float, &max_bits, sizeof max_float);
    max_difference = max_float;
  }
};

double median_ms(const std::function<void()>& run, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) run();
  FLASHATTN_CUDA_CHECK_LAUNCH();
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
  FLASHATTN_CUDA_CHECK_LAUNCH();
  cudaEventDestroy(start), cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void report(const char* kind, const Shape& s, const std::string& config, double ms, double max_difference,
            unsigned long long unwritten) {
  const double flops = 4.0 * s.batch * s.heads * s.seqlen * s.seqlen * s.head_dim * (s.causal ? 0.5 : 1.0);
  std::printf("%s,%s,%lld,%lld,%lld,%lld,%d,%s,%.4f,%.1f,%.3g,%llu\n", kind, dtype_name(s.dtype),
              static_cast<long long>(s.batch), static_cast<long long>(s.heads), static_cast<long long>(s.seqlen),
              static_cast<long long>(s.head_dim), s.causal ? 1 : 0, config.c_str(), ms, flops / (ms * 1e-3) / 1e12,
              max_difference, unwritten);
  std::fflush(stdout);
}

std::string name_of(const HopperTileConfig& c) {
  return "M" + std::to_string(c.block_m) + "_N" + std::to_string(c.block_n) + "_S" + std::to_string(c.stages) +
         (c.is_intra_overlap ? "_overlap" : "_plain") + (c.is_ping_pong ? "_pingpong" : "") +
         (c.is_persistent ? "_persistent" : "");
}

template <class T>
void time_algorithms(const Shape& s, Buffers<T>& buffers, int warmup, int reps) {
  const ForwardArgs production = buffers.args(s, buffers.production_out, Algorithm::flash3);
  forward(production);
  FLASHATTN_CUDA_CHECK(cudaDeviceSynchronize());
  for (Algorithm algorithm : {Algorithm::flash3, Algorithm::flash2}) {
    const ForwardArgs args = buffers.args(s, buffers.out, algorithm);
    const double ms = median_ms([&] { forward(args); }, warmup, reps);
    double max_difference = 0;
    unsigned long long unwritten = 0;
    buffers.check([&] { forward(args); }, max_difference, unwritten);
    report("production", s, algorithm_name(algorithm), ms, max_difference, unwritten);
  }
}

// The production flash3 kernel plain, with dropout p = 0.1 and with ALiBi, timed in the
// same run on the same inputs (the issue's budgets: dropout <= 15%, ALiBi <= 5%).
template <class T>
void time_dropout_and_alibi(const Shape& s, Buffers<T>& buffers, int warmup, int reps) {
  forward(buffers.args(s, buffers.production_out, Algorithm::flash3));  // the plain output
  FLASHATTN_CUDA_CHECK(cudaDeviceSynchronize());
  const ForwardArgs plain = buffers.args(s, buffers.out, Algorithm::flash3);
  ForwardArgs with_dropout = plain;
  with_dropout.options.dropout_p = 0.1;
  with_dropout.options.dropout_seed = 42;
  ForwardArgs with_alibi = plain;
  with_alibi.options.maybe_alibi_slopes =
      TensorView::contiguous(buffers.alibi_slopes, DType::float32, {s.heads}, Device::cuda(0));
  const std::pair<const char*, const ForwardArgs*> runs[] = {
      {"flash3", &plain}, {"flash3_dropout0.1", &with_dropout}, {"flash3_alibi", &with_alibi}};
  for (const auto& [name, args] : runs) {
    const double ms = median_ms([&] { forward(*args); }, warmup, reps);
    double max_difference = 0;
    unsigned long long unwritten = 0;
    buffers.check([&] { forward(*args); }, max_difference, unwritten);
    report("variant", s, name, ms, max_difference, unwritten);
  }
}

template <class T, HopperTileConfig kConfig>
void time_variant(const Shape& s, Buffers<T>& buffers, int warmup, int reps) {
  if (s.head_dim != kConfig.kernel_head_dim || Numeric<T>::kDType != s.dtype) return;
  const AttentionParams params = validate_forward(buffers.args(s, buffers.out, Algorithm::flash3));
  const HopperForwardParams hopper_params = make_forward_params(params, kConfig);
  auto run = [&] { launch_forward_sm90<T, kConfig, false>(hopper_params, nullptr); };
  const double ms = median_ms(run, warmup, reps);
  double max_difference = 0;
  unsigned long long unwritten = 0;
  buffers.check(run, max_difference, unwritten);
  report("variant", s, name_of(kConfig), ms, max_difference, unwritten);
}

template <class T>
void time_shape(const Shape& s, int warmup, int reps) {
  Buffers<T> buffers(s);
  time_algorithms<T>(s, buffers, warmup, reps);
  time_dropout_and_alibi<T>(s, buffers, warmup, reps);
  // Performance exploration only: alternative shapes and schedules of the same kernel.
  // A variant must not repeat a production entry of tile_config.hpp: the same kernel
  // instantiated in two translation units is registered twice with the runtime, and
  // the opt-in to large shared memory may reach the other copy (launch fails).
  time_variant<T, HopperTileConfig{64, 128, 128, 2, true, false, true}>(s, buffers, warmup, reps);
  time_variant<T, HopperTileConfig{128, 128, 128, 2, true, true, true}>(s, buffers, warmup, reps);
  time_variant<T, HopperTileConfig{128, 128, 176, 2, true, false, true}>(s, buffers, warmup, reps);
  time_variant<T, HopperTileConfig{256, 128, 80, 2, true, true, true}>(s, buffers, warmup, reps);
}

}  // namespace
}  // namespace flashattn::cuda::hopper

int main(int argc, char** argv) {
  using namespace flashattn;
  using namespace flashattn::cuda::hopper;
  bool quick = false, variants_only = false;
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::strcmp(argv[i], "--quick") == 0;
    variants_only = variants_only || std::strcmp(argv[i], "--variants") == 0;
  }
  const int warmup = 5, reps = quick ? 10 : 30;
  std::printf("kind,dtype,batch,heads,seqlen,head_dim,causal,config,ms,tflops,max_abs_diff_vs_production,unwritten\n");
  if (variants_only) {
    for (std::int64_t d : {64, 128, 256})
      for (std::int64_t n : {1024, 4096, 16384})
        for (bool c : {false, true}) {
          const Shape s{DType::bfloat16, 16384 / n, 2048 / d, n, d, c};
          Buffers<__nv_bfloat16> buffers(s);
          time_dropout_and_alibi<__nv_bfloat16>(s, buffers, warmup, reps);
        }
    return 0;
  }
  std::vector<Shape> shapes;
  for (std::int64_t n : {1024, 4096, 16384})
    for (bool c : {false, true}) shapes.push_back({DType::float16, 4, 48, n, 64, c});
  for (std::int64_t d : {64, 128, 256})
    for (std::int64_t n : {1024, 4096, 16384})
      for (bool c : {false, true}) shapes.push_back({DType::bfloat16, 16384 / n, 2048 / d, n, d, c});
  for (const Shape& s : shapes) {
    if (s.dtype == DType::float16) {
      time_shape<__half>(s, warmup, reps);
    } else {
      time_shape<__nv_bfloat16>(s, warmup, reps);
    }
  }
  return 0;
}
