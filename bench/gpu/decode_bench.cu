// bench/gpu/decode_bench.cu — bandwidth of forward_with_kvcache (issue 6, seed 002).
//
// Method (shared/BENCHMARKS.md, decode section): random bf16 inputs (never zeros),
// one query token per sequence, 32 query heads on 8 KV heads, head dim 128; the
// cache rotated among kSets independent sets so a timed call never finds its K/V in
// the 50 MB L2. The calls are captured in a CUDA graph (as serving engines run
// decode steps), so host-side validation and launch latency are not in the timing;
// warm-up replay, then the median over replays of (graph time / calls in it).
// Bandwidth = bytes of K and V read / time. The device-to-device copy rate is
// measured in the same run as the ceiling. Outputs are poisoned before the runs and
// checked finite after. Writes CSV (argv[1], default decode_bench.csv).
// DECODE_BENCH_KERNELS (comma-separated, default "auto") lists the kernels each shape
// runs with, back to back in one process: "auto" (the library's choice,
// src/cuda/decode/kernel_choice.hpp), "cp_async" or "tma" (forced through
// FLASHATTN_DECODE_KERNEL, read by the library at every call, so each captured graph
// keeps its kernel), "tma_prefetch<N>" (the TMA kernel prefetching N
// tiles per CTA into L2 before the PDL wait; FLASHATTN_DECODE_TMA_PREFETCH_TILES),
// each optionally with "+nopdl" (the launch chain's ablation knob, launch_kernel.cuh) and
// "+alibi" (ALiBi slopes 2^(-8 (h + 1) / 32) per query head: the bias's cost, e.g.
// DECODE_BENCH_KERNELS=auto,auto+alibi; FLASHATTN_CUDA_ALIBI_PATH=generic for its per-element form);
// "fp8" runs the same shape over an FP8 (e4m3) cache (kernel_mma_fp8.cuh, per-tensor
// descales): its bandwidth counts the cache's bytes (1 per element), so against "auto"
// the time ratio is the tokens-per-second gain, e.g. DECODE_BENCH_KERNELS=auto,fp8.
// DECODE_BENCH_SKIP_MAIN=1 runs only the split sweep; DECODE_BENCH_POOL_GIB sizes the cache pool (CachePool; default: batch 8 / KV 64k);
// DECODE_BENCH_SWEEP="batch:kv:page:splits,..." replaces the sweep's configurations.
// Every row is flushed as soon as it is measured: a run cut short keeps its rows.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu/graph_timing.hpp"
#include "flashattn/kvcache.hpp"

namespace {

using flashattn::bench::check;

// Deterministic pseudo-random N(0,1)-ish values (sum of uniforms), never all zeros.
__global__ void fill_random(__nv_bfloat16* data, std::int64_t count, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint64_t x = (static_cast<std::uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    float sum = 0.0f;
    for (int k = 0; k < 4; ++k) {
      x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
      sum += static_cast<float>(x >> 40) / static_cast<float>(1ull << 24);
    }
    data[i] = __float2bfloat16((sum - 2.0f) * 1.7f);
  }
}

// The same values as e4m3 bytes (saturating), for an FP8 cache.
__global__ void fill_random_e4m3(std::uint8_t* data, std::int64_t count, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint64_t x = (static_cast<std::uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    float sum = 0.0f;
    for (int k = 0; k < 4; ++k) {
      x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
      sum += static_cast<float>(x >> 40) / static_cast<float>(1ull << 24);
    }
    data[i] = __nv_cvt_float_to_fp8((sum - 2.0f) * 1.7f, __NV_SATFINITE, __NV_E4M3);
  }
}

struct DeviceArray {
  void* data = nullptr;
  std::size_t bytes = 0;
  explicit DeviceArray(std::size_t n) : bytes(n) { check(cudaMalloc(&data, n ? n : 16), "cudaMalloc"); }
  ~DeviceArray() { cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

flashattn::TensorView view(void* data, flashattn::DType dtype, std::initializer_list<std::int64_t> shape) {
  return flashattn::TensorView::contiguous(data, dtype, shape, flashattn::Device::cuda(0));
}

// The K/V caches of every shape live in one pool allocated before anything else, as a
// serving engine allocates its cache once: measured on the H100 (2026-11-25), paged
// caches read from memory allocated after a large allocation had been freed ran 10-17%
// slower at batch 8 / KV 1k than from fresh memory (contiguous ones did not move), so
// per-shape allocations made the paged/contiguous comparison depend on the shape order.
struct CachePool {
  char* base = nullptr;
  std::size_t bytes = 0, used = 0;
  void* take(std::size_t n) {
    n = (n + 4095) / 4096 * 4096;
    if (used + n > bytes) {
      std::fprintf(stderr, "cache pool: %zu bytes needed, %zu left\n", n, bytes - used);
      std::exit(1);
    }
    void* p = base + used;
    used += n;
    return p;
  }
};
CachePool g_pool;

constexpr int kSets = 4;
constexpr int kCallsPerGraph = 16;  // a multiple of kSets
constexpr int kWarmup = 3;
constexpr int kRepeats = 15;

struct Config {
  std::int64_t batch, kv_len;
  std::int64_t page_size;  // 0 = contiguous
  int num_splits = 0;      // 0 = the library's heuristic
  std::string kernel = "auto";  // a DECODE_BENCH_KERNELS entry
  bool is_fp8_cache() const { return kernel.rfind("fp8", 0) == 0; }
  std::size_t cache_element_bytes() const { return is_fp8_cache() ? 1 : 2; }
};

constexpr std::int64_t kHeadsQ = 32, kHeadsKv = 8, kHeadDim = 128;

// Bytes of one K (or V) cache of a shape: whole pages when paged.
std::size_t cache_bytes_of(const Config& c) {
  const std::int64_t pages_per_seq = c.page_size ? (c.kv_len + c.page_size - 1) / c.page_size : 0;
  const std::int64_t rows = c.page_size ? c.batch * pages_per_seq * c.page_size : c.batch * c.kv_len;
  return static_cast<std::size_t>(rows * kHeadsKv * kHeadDim) * c.cache_element_bytes();
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double copy_bandwidth_tbps() {
  const std::size_t bytes = std::size_t{1} << 30;
  DeviceArray a(bytes), b(bytes);
  check(cudaMemset(a.data, 1, bytes), "memset");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  std::vector<float> times;
  for (int i = 0; i < 20; ++i) {
    check(cudaEventRecord(start), "record");
    check(cudaMemcpy(b.data, a.data, bytes, cudaMemcpyDeviceToDevice), "copy");
    check(cudaEventRecord(stop), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    if (i >= 5) times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * bytes / (median(times) * 1e-3) / 1e12;  // read + written
}

void run(const Config& c, std::FILE* csv) {
  using flashattn::DType;
  // "kernel+flag+flag": the flags set the launch chain's ablation knobs (launch_kernel.cuh).
  std::string kernel = c.kernel.substr(0, c.kernel.find('+'));
  unsetenv("FLASHATTN_DECODE_KERNEL");
  unsetenv("FLASHATTN_DECODE_TMA_PREFETCH_TILES");
  unsetenv("FLASHATTN_DECODE_PDL");
  bool has_alibi = false;
  for (std::size_t plus = c.kernel.find('+'); plus != std::string::npos;) {
    const std::size_t next = c.kernel.find('+', plus + 1);
    const std::string flag = c.kernel.substr(plus + 1, next == std::string::npos ? std::string::npos : next - plus - 1);
    if (flag == "nopdl") {
      setenv("FLASHATTN_DECODE_PDL", "0", 1);
    } else if (flag == "alibi") {
      has_alibi = true;
    } else {
      std::fprintf(stderr, "unknown flag %s in %s (known: nopdl, alibi)\n", flag.c_str(), c.kernel.c_str());
      std::exit(1);
    }
    plus = next;
  }
  if (kernel.rfind("tma_prefetch", 0) == 0) {
    setenv("FLASHATTN_DECODE_KERNEL", "tma", 1);
    setenv("FLASHATTN_DECODE_TMA_PREFETCH_TILES", kernel.substr(12).c_str(), 1);
  } else if (kernel != "auto" && kernel != "fp8") {
    setenv("FLASHATTN_DECODE_KERNEL", kernel.c_str(), 1);
  }
  const std::int64_t pages_per_seq = c.page_size ? (c.kv_len + c.page_size - 1) / c.page_size : 0;
  const std::size_t cache_bytes = cache_bytes_of(c);
  std::vector<void*> k_sets, v_sets;
  std::vector<std::unique_ptr<DeviceArray>> table_sets;
  g_pool.used = 0;
  std::mt19937_64 rng(42);
  for (int s = 0; s < kSets; ++s) {
    k_sets.push_back(g_pool.take(cache_bytes));
    v_sets.push_back(g_pool.take(cache_bytes));
    const std::int64_t elements = static_cast<std::int64_t>(cache_bytes / c.cache_element_bytes());
    if (c.is_fp8_cache()) {
      fill_random_e4m3<<<1024, 256>>>(static_cast<std::uint8_t*>(k_sets.back()), elements, 2 * s + 1);
      fill_random_e4m3<<<1024, 256>>>(static_cast<std::uint8_t*>(v_sets.back()), elements, 2 * s + 2);
    } else {
      fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(k_sets.back()), elements, 2 * s + 1);
      fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(v_sets.back()), elements, 2 * s + 2);
    }
    check(cudaGetLastError(), "fill_random");
    if (c.page_size) {  // pages in a random order, as an allocator that has run a while hands them out
      std::vector<std::int32_t> table(static_cast<std::size_t>(c.batch * pages_per_seq));
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), rng);
      table_sets.push_back(std::make_unique<DeviceArray>(table.size() * 4));
      check(cudaMemcpy(table_sets.back()->data, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "table");
    }
  }
  DeviceArray q(static_cast<std::size_t>(c.batch * kHeadsQ * kHeadDim) * 2), out(q.bytes);
  DeviceArray lse(static_cast<std::size_t>(c.batch * kHeadsQ) * 4), seqlens(static_cast<std::size_t>(c.batch) * 4);
  fill_random<<<64, 256>>>(static_cast<__nv_bfloat16*>(q.data), c.batch * kHeadsQ * kHeadDim, 99);
  check(cudaGetLastError(), "fill_random");
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(c.batch), static_cast<std::int32_t>(c.kv_len));
  check(cudaMemcpy(seqlens.data, lengths.data(), lengths.size() * 4, cudaMemcpyHostToDevice), "seqlens");
  // FP8 cache: one descale per tensor (a [1, 1] float32), 1/64 so the scores stay O(1).
  DeviceArray descale(4);
  const float descale_value = 1.0f / 64;
  check(cudaMemcpy(descale.data, &descale_value, 4, cudaMemcpyHostToDevice), "descale");
  const DType cache_dtype = c.is_fp8_cache() ? DType::float8_e4m3 : DType::bfloat16;
  DeviceArray slopes(kHeadsQ * 4);  // ALiBi, with +alibi
  {
    std::vector<float> values(kHeadsQ);
    for (std::int64_t h = 0; h < kHeadsQ; ++h)
      values[static_cast<std::size_t>(h)] = std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(kHeadsQ));
    check(cudaMemcpy(slopes.data, values.data(), slopes.bytes, cudaMemcpyHostToDevice), "slopes");
  }

  auto args_for = [&](int s) {
    flashattn::KVCacheArgs a;
    a.q = view(q.data, DType::bfloat16, {c.batch, 1, kHeadsQ, kHeadDim});
    const std::int64_t dim0 = c.page_size ? c.batch * pages_per_seq : c.batch;
    const std::int64_t dim1 = c.page_size ? c.page_size : c.kv_len;
    a.k_cache = view(k_sets[static_cast<std::size_t>(s)], cache_dtype, {dim0, dim1, kHeadsKv, kHeadDim});
    a.v_cache = view(v_sets[static_cast<std::size_t>(s)], cache_dtype, {dim0, dim1, kHeadsKv, kHeadDim});
    if (c.is_fp8_cache()) {
      a.options.maybe_k_descale = view(descale.data, DType::float32, {1, 1});
      a.options.maybe_v_descale = view(descale.data, DType::float32, {1, 1});
    }
    if (has_alibi) a.options.maybe_alibi_slopes = view(slopes.data, DType::float32, {kHeadsQ});
    if (c.page_size) a.maybe_block_table = view(table_sets[static_cast<std::size_t>(s)]->data, DType::int32, {c.batch, pages_per_seq});
    a.maybe_cache_seqlens = view(seqlens.data, DType::int32, {c.batch});
    a.out = view(out.data, DType::bfloat16, {c.batch, 1, kHeadsQ, kHeadDim});
    a.maybe_lse = view(lse.data, DType::float32, {c.batch, kHeadsQ, 1});
    a.num_splits = c.num_splits;
    return a;
  };
  flashattn::KVCacheArgs probe = args_for(0);
  const int num_splits = flashattn::kvcache_num_splits(probe);
  const std::size_t workspace_bytes = flashattn::kvcache_workspace_bytes(probe);
  DeviceArray workspace(workspace_bytes);

  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  flashattn::ExecutionContext context;
  context.stream = stream;
  flashattn::forward_with_kvcache([&] {  // once outside the capture: one-time kernel attributes
    flashattn::KVCacheArgs a = args_for(0);
    if (workspace_bytes) a.maybe_workspace = view(workspace.data, DType::uint8, {static_cast<std::int64_t>(workspace_bytes)});
    return a;
  }(), context);
  check(cudaStreamSynchronize(stream), "first call");
  check(cudaMemset(out.data, 0xFF, out.bytes), "poison out");  // NaN in bf16: the timed calls must overwrite it
  check(cudaMemset(lse.data, 0xFF, lse.bytes), "poison lse");
  const std::vector<float> times = flashattn::bench::time_graph_replays(stream, kCallsPerGraph, kWarmup, kRepeats, [&](int i) {
    flashattn::KVCacheArgs a = args_for(i % kSets);
    if (workspace_bytes) a.maybe_workspace = view(workspace.data, DType::uint8, {static_cast<std::int64_t>(workspace_bytes)});
    flashattn::forward_with_kvcache(a, context);
  });
  cudaStreamDestroy(stream);
  std::vector<__nv_bfloat16> host_out(static_cast<std::size_t>(c.batch * kHeadsQ * kHeadDim));
  check(cudaMemcpy(host_out.data(), out.data, out.bytes, cudaMemcpyDeviceToHost), "download");
  bool finite = true;
  for (const auto& x : host_out) finite = finite && std::isfinite(__bfloat162float(x));

  const double ms = median(times);
  const double bytes_read =  // K and V, bf16 or e4m3
      2.0 * static_cast<double>(c.batch * c.kv_len * kHeadsKv * kHeadDim) * static_cast<double>(c.cache_element_bytes());
  const double tbps = bytes_read / (ms * 1e-3) / 1e12;
  const std::string layout = c.page_size ? "paged" : "contiguous";
  std::printf("%-22s %-10s page %3lld batch %3lld kv %7lld splits %2d: %8.2f us  %5.2f TB/s%s\n", c.kernel.c_str(), layout.c_str(),
              static_cast<long long>(c.page_size), static_cast<long long>(c.batch), static_cast<long long>(c.kv_len), num_splits,
              ms * 1e3, tbps, finite ? "" : "  NON-FINITE OUTPUT");
  std::fprintf(csv, "%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%.3f,%.4f,%d,%s\n", layout.c_str(), static_cast<long long>(c.page_size),
               static_cast<long long>(c.batch), static_cast<long long>(kHeadsQ), static_cast<long long>(kHeadsKv),
               static_cast<long long>(kHeadDim), static_cast<long long>(c.kv_len), num_splits, ms * 1e3, tbps, finite ? 1 : 0, c.kernel.c_str());
  std::fflush(csv);
  std::fflush(stdout);
  if (!finite) std::exit(2);
}

std::FILE* open_csv(const char* path) {
  std::FILE* csv = std::fopen(path, "w");
  if (!csv) {
    std::perror(path);
    std::exit(1);
  }
  return csv;
}

}  // namespace

// decode_bench [out.csv [sweep.csv]]: the issue-6 shapes with the library's split
// heuristic into out.csv; with sweep.csv, also forced split counts on some of them and
// a 64-key cache (the step's fixed cost: launches, prologue, combine), for tuning.
int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<std::string> kernels;
  {
    const char* list = std::getenv("DECODE_BENCH_KERNELS");
    std::string rest = list && *list ? list : "auto";
    for (std::size_t comma; (comma = rest.find(',')) != std::string::npos; rest = rest.substr(comma + 1)) kernels.push_back(rest.substr(0, comma));
    kernels.push_back(rest);
  }
  // The cache pool first (CachePool): the largest shape's sets, batch 8 / KV 64k.
  g_pool.bytes = std::size_t{2} * kSets * cache_bytes_of({8, 65536, 0});
  if (const char* gib = std::getenv("DECODE_BENCH_POOL_GIB"); gib && *gib) g_pool.bytes = static_cast<std::size_t>(std::atof(gib) * (1 << 30));
  check(cudaMalloc(reinterpret_cast<void**>(&g_pool.base), g_pool.bytes), "cudaMalloc cache pool");
  std::FILE* csv = open_csv(argc > 1 ? argv[1] : "decode_bench.csv");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  const double copy = copy_bandwidth_tbps();
  std::printf("%s, %d SMs; device copy %.2f TB/s (read + written)\n", prop.name, prop.multiProcessorCount, copy);
  std::fprintf(csv, "# device=%s copy_tbps=%.3f\n", prop.name, copy);
  const char* kHeader = "layout,page_size,batch,heads_q,heads_kv,head_dim,kv_len,num_splits,time_us,bandwidth_tbps,finite,kernel\n";
  std::fprintf(csv, "%s", kHeader);
  std::vector<Config> shapes;
  for (std::int64_t page : {0, 16, 256})
    for (std::int64_t kv : {1024, 4096, 16384, 65536}) shapes.push_back({8, kv, page});
  for (std::int64_t page : {0, 16, 256}) {
    shapes.push_back({1, 65536, page});
    shapes.push_back({1, 131072, page});
    shapes.push_back({64, 1024, page});
  }
  const char* skip_main = std::getenv("DECODE_BENCH_SKIP_MAIN");  // "1": the sweep only
  if (skip_main == nullptr || std::string(skip_main) != "1")
    for (Config c : shapes)
      for (const std::string& kernel : kernels) {
        c.kernel = kernel;
        run(c, csv);
      }
  std::fclose(csv);
  if (argc > 2) {
    std::FILE* sweep = open_csv(argv[2]);
    std::fprintf(sweep, "%s", kHeader);
    std::printf("split sweep:\n");
    std::vector<Config> sweeps;
    // DECODE_BENCH_SWEEP="batch:kv:page:splits,...": these configurations instead.
    if (const char* list = std::getenv("DECODE_BENCH_SWEEP"); list && *list) {
      std::string rest = list;
      while (!rest.empty()) {
        const std::size_t comma = rest.find(',');
        const std::string item = rest.substr(0, comma);
        long long batch = 0, kv = 0, page = 0;
        int splits = 0;
        if (std::sscanf(item.c_str(), "%lld:%lld:%lld:%d", &batch, &kv, &page, &splits) != 4) {
          std::fprintf(stderr, "DECODE_BENCH_SWEEP: expected batch:kv:page:splits, got %s\n", item.c_str());
          return 1;
        }
        sweeps.push_back({batch, kv, page, splits});
        rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
      }
    } else {
      for (int splits : {1, 2, 3, 4}) sweeps.push_back({8, 64, 0, splits});
      for (int splits : {1, 2, 3, 4, 6, 8}) sweeps.push_back({8, 1024, 0, splits});
      for (int splits : {2, 3, 4, 6, 8}) sweeps.push_back({8, 4096, 0, splits});
      for (int splits : {2, 4}) sweeps.push_back({8, 16384, 0, splits});
      for (std::int64_t kv : {1024, 4096})
        for (int splits : {2, 4}) sweeps.push_back({8, kv, 16, splits});
      for (int splits : {16, 28, 31}) sweeps.push_back({1, 65536, 0, splits});
    }
    for (Config c : sweeps)
      for (const std::string& kernel : kernels) {
        c.kernel = kernel;
        run(c, sweep);
      }
    std::fclose(sweep);
  }
  cudaFree(g_pool.base);
  return 0;
}
