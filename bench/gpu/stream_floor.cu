// bench/gpu/stream_floor.cu — the floor under a decode step: how fast one kernel that
// only reads N bytes (and does nothing else) runs when launched the way decode_bench
// launches the library's decode steps (CUDA graph of 16 back-to-back launches, caches
// rotated among 4 buffers so the L2 holds none of them, PDL on or off).
//
// The decode goals of issue 6 are bandwidths (bytes of K and V / time per step); this
// separates what any single-kernel step pays — the launch gap, the ramp to full
// bandwidth, the drain at the end — from what our kernels add. N = 0 is the bare launch
// chain. Sizes: the K/V bytes of batch 8, 8 kv heads, d128, bf16 at KV 1k / 4k / 16k.
// Method as decode_bench: random data (never zeros), warm-up replay, median over replays
// of graph time / launches. Writes CSV (argv[1], default stream_floor.csv).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/gpu/graph_timing.hpp"

namespace {

using flashattn::bench::check;

constexpr int kThreads = 512;
constexpr int kUnroll = 8;  // independent 16-byte loads in flight per thread: 64 KiB per CTA
constexpr int kBuffers = 4;
constexpr int kLaunchesPerGraph = 16;
constexpr int kWarmup = 3;
constexpr int kRepeats = 15;

__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Reads count 16-byte chunks grid-stride, kUnroll independent loads per thread at a time.
// The XOR of everything decides a store that never happens for random data, so the
// loads stay. Waits for the previous grid before reading (the PDL contract).
__global__ void __launch_bounds__(kThreads) read_kernel(const uint4* __restrict__ data, std::int64_t count, unsigned* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + (kUnroll - 1) * stride < count; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_streaming(data + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < count; i += stride) {
    const uint4 v = load_streaming(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) sink[blockIdx.x] = acc;
}

__global__ void fill_random(std::uint32_t* data, std::int64_t count, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint64_t x = (static_cast<std::uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
    data[i] = static_cast<std::uint32_t>(x) | 1u;
  }
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// us per launch of read_kernel over `bytes`, in a graph of kLaunchesPerGraph launches.
double time_per_launch_us(std::int64_t bytes, bool pdl, int sm_count, const std::vector<void*>& buffers, unsigned* sink) {
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  const std::int64_t count = bytes / 16;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(sm_count * 2));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = pdl ? 1 : 0;
  const std::vector<float> times = flashattn::bench::time_graph_replays(stream, kLaunchesPerGraph, kWarmup, kRepeats, [&](int i) {
    check(cudaLaunchKernelEx(&config, read_kernel, static_cast<const uint4*>(buffers[i % kBuffers]), count, sink), "launch");
  });
  cudaStreamDestroy(stream);
  return median(times) * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  std::FILE* csv = std::fopen(argc > 1 ? argv[1] : "stream_floor.csv", "w");
  if (!csv) {
    std::perror("csv");
    return 1;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::fprintf(csv, "# device=%s\nlabel,bytes,pdl,time_us,bandwidth_tbps\n", prop.name);
  const std::int64_t kv_bytes_per_key = 8 * 8 * 128 * 2 * 2;  // batch 8 x 8 kv heads x d128 x bf16 x (K, V)
  struct Size {
    const char* label;
    std::int64_t bytes;
  };
  const Size sizes[] = {{"empty", 0}, {"kv1k", 1024 * kv_bytes_per_key}, {"kv4k", 4096 * kv_bytes_per_key}, {"kv16k", 16384 * kv_bytes_per_key}};
  std::vector<void*> buffers(kBuffers);
  const std::int64_t largest = 16384 * kv_bytes_per_key;
  for (auto& buffer : buffers) {
    check(cudaMalloc(&buffer, static_cast<std::size_t>(largest)), "cudaMalloc");
    fill_random<<<1024, 256>>>(static_cast<std::uint32_t*>(buffer), largest / 4, reinterpret_cast<std::uintptr_t>(buffer));
    check(cudaGetLastError(), "fill");
  }
  unsigned* sink = nullptr;
  check(cudaMalloc(&sink, 4096 * sizeof(unsigned)), "cudaMalloc sink");
  check(cudaDeviceSynchronize(), "fill");
  std::printf("%s, %d SMs: one read-only kernel per step, graph of %d launches, %d buffers\n", prop.name, prop.multiProcessorCount,
              kLaunchesPerGraph, kBuffers);
  for (const Size& size : sizes)
    for (bool pdl : {true, false}) {
      const double us = time_per_launch_us(size.bytes, pdl, prop.multiProcessorCount, buffers, sink);
      const double tbps = size.bytes / (us * 1e-6) / 1e12;
      std::printf("%-6s %11lld bytes  pdl %d: %8.2f us  %5.2f TB/s\n", size.label, static_cast<long long>(size.bytes), pdl ? 1 : 0, us, tbps);
      std::fprintf(csv, "%s,%lld,%d,%.3f,%.4f\n", size.label, static_cast<long long>(size.bytes), pdl ? 1 : 0, us, tbps);
    }
  std::fclose(csv);
  for (void* buffer : buffers) cudaFree(buffer);
  cudaFree(sink);
  return 0;
}
