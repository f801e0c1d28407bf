// bench/gpu/kernels/fp8_timing.cu — times the FP8 (e4m3) Hopper forward
// (src/cuda/hopper_fp8) against our bf16 Hopper kernel (src/cuda/hopper, what flash3
// runs), both called directly, on the same inputs, with CUDA events, at the ../shared/BENCHMARKS.md shapes (16k tokens
// per batch, 2048 / head_dim heads). Not a test: no assertions on timing.
//
// Inputs: random bf16 q, k, v, quantised to e4m3 on the device (descale 1); the bf16 run
// reads the dequantised values (e4m3 ⊂ bf16, exact), so the two outputs differ only by
// the FP8 kernel's P quantisation and output rounding: max_abs_diff_vs_bf16 and
// rms_diff_vs_bf16 are a smoke check at full size (expect ~1e-2 max, ~1e-3 rms on these
// N(0, 1)-like inputs), `unwritten` counts output elements still NaN-poisoned.
//
// Usage: flashattn_fp8_timing [--quick] [--head-dims 64,128,256]
//          [--schedules copy,in_place,ping_pong,overlap,overlap_ping_pong,overlap_n192,overlap_n224,overlap_n160,
//                       overlap_n224_ping_pong]
//   prints CSV: kernel,batch,heads,seqlen,head_dim,causal,ms,tflops,speedup_vs_bf16,
//   max_abs_diff_vs_bf16,rms_diff_vs_bf16,unwritten
// Without --schedules one FP8 row per shape, kernel flash3_fp8, the process's default
// schedule (FLASHATTN_CUDA_FP8_SCHEDULE); with it one row per listed schedule,
// kernel flash3_fp8_<schedule>, all timed in this process beside the same bf16 run (d64
// has no ping-pong kernel: its ping_pong row runs in_place, its overlap_ping_pong row overlap;
// overlap_n192/_n224 are d128's wide key tiles, overlap_n160 d64's: the other head dims'
// rows of these run overlap; overlap_n224_ping_pong is n224 taking turns, overlap_ping_pong
// at d64/d256).
// --head-dims: only these head dims' shapes (default all three).
// FLASHATTN_CUDA_FP8_RESCALE=when_max_moves: the overlap rows skip unit rescales (their
// kernel names end in _when_max_moves; the other schedules always rescale).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/core/params.hpp"
#include "src/cuda/common/check.cuh"
#include "src/cuda/hopper/launch.hpp"
#include "src/cuda/hopper_fp8/launch.hpp"

namespace flashattn::cuda::hopper_fp8 {
namespace {

struct Shape {
  std::int64_t batch, heads, seqlen, head_dim;
  bool causal;
};

// Normal-ish random values (sum of uniforms) from a counter hash, as hopper_timing.cu;
// each value rounded to e4m3 (bytes) and back to bf16 (the dequantised copy).
__global__ void fill_random_fp8(std::uint8_t* bytes, __nv_bfloat16* dequantised, std::int64_t count,
                                std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    float sum = 0.0f;
    for (int r = 0; r < 4; ++r) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      sum += static_cast<float>(x & 0xffffff) / 16777216.0f;
    }
    const __nv_fp8_e4m3 quantised((sum - 2.0f) * 1.7f);
    bytes[i] = quantised.__x;
    dequantised[i] = __float2bfloat16_rn(static_cast<float>(quantised));
  }
}

// max |a - b|, sum (a - b)^2 and NaN count of a over `count` bf16 elements.
__global__ void compare_outputs(const __nv_bfloat16* a, const __nv_bfloat16* b, std::int64_t count,
                                unsigned long long* unwritten, int* max_difference_bits, double* sum_squares) {
  unsigned long long local_unwritten = 0;
  float local_max = 0.0f;
  double local_sum = 0.0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float value = __bfloat162float(a[i]);
    if (value != value) {
      ++local_unwritten;
    } else {
      const float difference = fabsf(value - __bfloat162float(b[i]));
      local_max = fmaxf(local_max, difference);
      local_sum += static_cast<double>(difference) * difference;
    }
  }
  if (local_unwritten != 0) atomicAdd(unwritten, local_unwritten);
  atomicMax(max_difference_bits, __float_as_int(local_max));
  atomicAdd(sum_squares, local_sum);
}

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

// An empty `schedules`: the default schedule, reported as flash3_fp8.
void time_shape(const Shape& s, const std::vector<Fp8Schedule>& schedules, int warmup, int reps) {
  const std::int64_t elements = s.batch * s.seqlen * s.heads * s.head_dim;
  std::uint8_t *q8 = nullptr, *k8 = nullptr, *v8 = nullptr;
  __nv_bfloat16 *q = nullptr, *k = nullptr, *v = nullptr, *out_fp8 = nullptr, *out_bf16 = nullptr;
  float* lse = nullptr;
  for (std::uint8_t** buffer : {&q8, &k8, &v8}) FLASHATTN_CUDA_CHECK(cudaMalloc(buffer, elements));
  for (__nv_bfloat16** buffer : {&q, &k, &v, &out_fp8, &out_bf16})
    FLASHATTN_CUDA_CHECK(cudaMalloc(buffer, elements * sizeof(__nv_bfloat16)));
  FLASHATTN_CUDA_CHECK(cudaMalloc(&lse, s.batch * s.heads * s.seqlen * sizeof(float)));
  fill_random_fp8<<<1024, 256>>>(q8, q, elements, 1);
  fill_random_fp8<<<1024, 256>>>(k8, k, elements, 2);
  fill_random_fp8<<<1024, 256>>>(v8, v, elements, 3);
  FLASHATTN_CUDA_CHECK_LAUNCH();
  FLASHATTN_CUDA_CHECK(cudaDeviceSynchronize());

  // Both kernels called directly on hand-built params (the FP8 dispatch and validation
  // are another piece of work; the bf16 one is the kernel flash3 runs).
  const Device gpu = Device::cuda(0);
  AttentionParams params;
  params.dtype = DType::bfloat16;
  params.input_dtype = DType::float8_e4m3;
  params.device = gpu;
  params.q = q8, params.k = k8, params.v = v8, params.out = out_fp8, params.maybe_lse = lse;
  params.batch = s.batch, params.seqlen_q = params.seqlen_k = s.seqlen;
  params.heads_q = params.heads_kv = s.heads, params.head_dim = s.head_dim;
  params.total_q = params.total_k = s.batch * s.seqlen;
  params.q_row_stride = params.k_row_stride = params.v_row_stride = params.out_row_stride = s.heads * s.head_dim;
  params.q_head_stride = params.k_head_stride = params.v_head_stride = params.out_head_stride = s.head_dim;
  params.q_batch_stride = params.k_batch_stride = params.v_batch_stride = params.out_batch_stride =
      s.seqlen * s.heads * s.head_dim;
  params.lse_batch_stride = s.heads * s.seqlen, params.lse_head_stride = s.seqlen, params.lse_row_stride = 1;
  params.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  params.softmax_scale_log2 = static_cast<float>(params.softmax_scale * 1.4426950408889634);
  params.is_causal = s.causal;
  params.window_right = s.causal ? 0 : -1;
  AttentionParams bf16_params = params;  // the dequantised copies, same layout
  bf16_params.input_dtype = DType::bfloat16;
  bf16_params.q = q, bf16_params.k = k, bf16_params.v = v, bf16_params.out = out_bf16;
  const std::string why_not_bf16 = hopper::why_unsupported(bf16_params);
  if (!why_not_bf16.empty()) throw std::runtime_error("bf16 Hopper kernel: " + why_not_bf16);
  auto run_bf16 = [&] { hopper::forward(bf16_params, nullptr); };

  run_bf16();
  const double bf16_ms = median_ms(run_bf16, warmup, reps);
  const double flops = 4.0 * s.batch * s.heads * s.seqlen * s.seqlen * s.head_dim * (s.causal ? 0.5 : 1.0);
  auto print = [&](const std::string& kernel, double ms, double speedup, double max_diff, double rms_diff,
                   unsigned long long unwritten_count) {
    std::printf("%s,%lld,%lld,%lld,%lld,%d,%.4f,%.1f,%.3f,%.3g,%.3g,%llu\n", kernel.c_str(),
                static_cast<long long>(s.batch), static_cast<long long>(s.heads), static_cast<long long>(s.seqlen),
                static_cast<long long>(s.head_dim), s.causal ? 1 : 0, ms, flops / (ms * 1e-3) / 1e12, speedup,
                max_diff, rms_diff, unwritten_count);
    std::fflush(stdout);
  };
  print("flash3_bf16", bf16_ms, 1.0, 0.0, 0.0, 0);
  unsigned long long* device_unwritten = nullptr;
  int* device_max_bits = nullptr;
  double* device_sum = nullptr;
  FLASHATTN_CUDA_CHECK(cudaMalloc(&device_unwritten, sizeof(unsigned long long)));
  FLASHATTN_CUDA_CHECK(cudaMalloc(&device_max_bits, sizeof(int)));
  FLASHATTN_CUDA_CHECK(cudaMalloc(&device_sum, sizeof(double)));
  const bool is_default = schedules.empty();
  for (const Fp8Schedule schedule : is_default ? std::vector<Fp8Schedule>{default_schedule(hopper_fp8::kernel_head_dim_for(params.head_dim), params.seqlen_k)} : schedules) {
    auto run_fp8 = [&] { hopper_fp8::forward(params, nullptr, schedule); };
    FLASHATTN_CUDA_CHECK(cudaMemset(out_fp8, 0xff, elements * sizeof(__nv_bfloat16)));
    run_fp8();
    FLASHATTN_CUDA_CHECK(cudaDeviceSynchronize());
    FLASHATTN_CUDA_CHECK(cudaMemset(device_unwritten, 0, sizeof(unsigned long long)));
    FLASHATTN_CUDA_CHECK(cudaMemset(device_max_bits, 0, sizeof(int)));
    FLASHATTN_CUDA_CHECK(cudaMemset(device_sum, 0, sizeof(double)));
    compare_outputs<<<1024, 256>>>(out_fp8, out_bf16, elements, device_unwritten, device_max_bits, device_sum);
    FLASHATTN_CUDA_CHECK_LAUNCH();
    unsigned long long unwritten = 0;
    int max_bits = 0;
    double sum_squares = 0;
    FLASHATTN_CUDA_CHECK(cudaMemcpy(&unwritten, device_unwritten, sizeof unwritten, cudaMemcpyDeviceToHost));
    FLASHATTN_CUDA_CHECK(cudaMemcpy(&max_bits, device_max_bits, sizeof max_bits, cudaMemcpyDeviceToHost));
    FLASHATTN_CUDA_CHECK(cudaMemcpy(&sum_squares, device_sum, sizeof sum_squares, cudaMemcpyDeviceToHost));
    float max_difference = 0.0f;
    std::memcpy(&max_difference, &max_bits, sizeof max_difference);
    const double fp8_ms = median_ms(run_fp8, warmup, reps);
    // The overlap kernels' rescale (FLASHATTN_CUDA_FP8_RESCALE, read by forward) when not the default.
    const bool reads_rescale = fp8_tile_config(hopper_fp8::kernel_head_dim_for(params.head_dim), schedule).has_rotated_loop();
    std::string name = is_default ? std::string("flash3_fp8") : std::string("flash3_fp8_") + fp8_schedule_name(schedule);
    const Fp8Rescale rescale = default_rescale(hopper_fp8::kernel_head_dim_for(params.head_dim));
    if (!is_default && reads_rescale && rescale != Fp8Rescale::every_block)
      name += std::string("_") + fp8_rescale_name(rescale);
    print(name, fp8_ms, bf16_ms / fp8_ms, max_difference, std::sqrt(sum_squares / elements), unwritten);
  }

  cudaFree(device_unwritten), cudaFree(device_max_bits), cudaFree(device_sum);
  cudaFree(q8), cudaFree(k8), cudaFree(v8), cudaFree(q), cudaFree(k), cudaFree(v);
  cudaFree(out_fp8), cudaFree(out_bf16), cudaFree(lse);
}

}  // namespace
}  // namespace flashattn::cuda::hopper_fp8

int main(int argc, char** argv) {
  using namespace flashattn::cuda::hopper_fp8;
  bool quick = false;
  std::vector<Fp8Schedule> schedules;  // empty: the default schedule
  std::vector<std::int64_t> head_dims = {64, 128, 256};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--schedules") == 0 && i + 1 < argc) {
      const std::string list = argv[++i];
      for (std::size_t begin = 0; begin <= list.size();) {
        const std::size_t end = std::min(list.find(',', begin), list.size());
        const std::string name = list.substr(begin, end - begin);
        bool found = false;
        for (const Fp8Schedule schedule : kFp8Schedules)
          if (name == fp8_schedule_name(schedule)) {
            schedules.push_back(schedule);
            found = true;
          }
        if (!found) {
          std::fprintf(stderr,
                       "--schedules: unknown schedule '%s' (copy, in_place, ping_pong, overlap, overlap_ping_pong, "
                       "overlap_n192, overlap_n224, overlap_n160, overlap_n224_ping_pong)\n",
                       name.c_str());
          return 2;
        }
        begin = end + 1;
      }
    } else if (std::strcmp(argv[i], "--head-dims") == 0 && i + 1 < argc) {
      head_dims.clear();
      const std::string list = argv[++i];
      for (std::size_t begin = 0; begin <= list.size();) {
        const std::size_t end = std::min(list.find(',', begin), list.size());
        const std::string name = list.substr(begin, end - begin);
        if (name != "64" && name != "128" && name != "256") {
          std::fprintf(stderr, "--head-dims: unknown head dim '%s' (64, 128, 256)\n", name.c_str());
          return 2;
        }
        head_dims.push_back(std::stoll(name));
        begin = end + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--head-dims 64,128,256] [--schedules "
                   "copy,in_place,ping_pong,overlap,overlap_ping_pong,overlap_n192,overlap_n224,overlap_n160,"
                   "overlap_n224_ping_pong]\n",
                   argv[0]);
      return 2;
    }
  }
  const int warmup = 5, reps = quick ? 10 : 30;
  std::printf(
      "kernel,batch,heads,seqlen,head_dim,causal,ms,tflops,speedup_vs_bf16,max_abs_diff_vs_bf16,rms_diff_vs_bf16,"
      "unwritten\n");
  for (std::int64_t d : head_dims)
    for (std::int64_t n : {1024, 4096, 16384})
      for (bool c : {false, true}) time_shape(Shape{16384 / n, 2048 / d, n, d, c}, schedules, warmup, reps);
  return 0;
}
