// src/cuda/bwd/bwd_timing.cu — times flashattn::backward alone (CUDA events, median
// of repeats) on the shapes of shared/BENCHMARKS.md, default and deterministic.
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
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"

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

double time_backward(const Shape& shape, bool deterministic, int repeats) {
  using flashattn::TensorView;
  const auto device = flashattn::Device::cuda(0);
  const std::int64_t b = shape.batch, h = shape.heads, n = shape.seqlen, d = shape.head_dim;
  const std::int64_t elements = b * n * h * d;
  void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float* lse;
  for (void** p : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) check(cudaMalloc(p, elements * 2), "cudaMalloc");
  check(cudaMalloc(&lse, b * h * n * sizeof(float)), "cudaMalloc lse");
  std::uint32_t seed = 1;
  for (void* p : {q, k, v, o, dout, dq, dk, dv}) {
    if (shape.dtype == flashattn::DType::float16) fill<__half>(p, elements, seed++);
    else fill<__nv_bfloat16>(p, elements, seed++);
  }
  fill_value<<<1024, 256>>>(lse, b * h * n, std::log(static_cast<float>(n)) + 0.5f);
  check(cudaGetLastError(), "fill_value");

  flashattn::BackwardArgs args;
  auto view = [&](void* data) { return TensorView::contiguous(data, shape.dtype, {b, n, h, d}, device); };
  args.q = view(q), args.k = view(k), args.v = view(v), args.out = view(o), args.dout = view(dout);
  args.dq = view(dq), args.dk = view(dk), args.dv = view(dv);
  args.lse = TensorView::contiguous(lse, flashattn::DType::float32, {b, h, n}, device);
  args.options.causal = shape.causal;
  args.options.deterministic = deterministic;
  const std::size_t workspace_bytes = flashattn::backward_workspace_bytes(args);
  void* workspace = nullptr;
  if (workspace_bytes > 0) check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc workspace");
  args.maybe_workspace = TensorView::contiguous(workspace, flashattn::DType::uint8,
                                                {static_cast<std::int64_t>(std::max<std::size_t>(workspace_bytes, 1))}, device);

  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  for (int i = 0; i < 3; ++i) flashattn::backward(args);
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<float> times;
  for (int i = 0; i < repeats; ++i) {
    check(cudaEventRecord(start), "record");
    flashattn::backward(args);
    check(cudaEventRecord(stop), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    times.push_back(ms);
  }
  check(cudaGetLastError(), "backward");
  std::sort(times.begin(), times.end());
  for (void* p : {q, k, v, o, dout, dq, dk, dv, static_cast<void*>(lse), workspace}) cudaFree(p);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 20;
  if (!flashattn::cuda_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  std::vector<Shape> shapes;
  for (std::int64_t n : {1024, 2048, 4096, 8192, 16384})
    for (bool causal : {false, true}) shapes.push_back({"seed004_fp16_b4h48_d64", flashattn::DType::float16, 4, 48, n, 64, causal});
  for (std::int64_t d : {64, 128, 256})
    for (std::int64_t n : {512, 1024, 2048, 4096, 8192, 16384})
      for (bool causal : {false, true})
        shapes.push_back({"fa3_bf16_16k_tokens", flashattn::DType::bfloat16, 16384 / n, 2048 / d, n, d, causal});
  std::printf("sweep,dtype,batch,heads,seqlen,head_dim,causal,deterministic,ms,tflops\n");
  for (const Shape& shape : shapes) {
    for (bool deterministic : {false, true}) {
      double ms = 0;
      try {
        ms = time_backward(shape, deterministic, repeats);
      } catch (const std::exception& e) {
        std::printf("# %s d%lld: %s\n", shape.sweep, static_cast<long long>(shape.head_dim), e.what());
        continue;
      }
      const double forward_flops = 4.0 * shape.batch * shape.heads * shape.seqlen * shape.seqlen * shape.head_dim *
                                   (shape.causal ? 0.5 : 1.0);
      std::printf("%s,%s,%lld,%lld,%lld,%lld,%d,%d,%.4f,%.1f\n", shape.sweep, flashattn::dtype_name(shape.dtype),
                  static_cast<long long>(shape.batch), static_cast<long long>(shape.heads),
                  static_cast<long long>(shape.seqlen), static_cast<long long>(shape.head_dim), shape.causal ? 1 : 0,
                  deterministic ? 1 : 0, ms, 2.5 * forward_flops / (ms * 1e-3) / 1e12);
      std::fflush(stdout);
    }
  }
  return 0;
}
