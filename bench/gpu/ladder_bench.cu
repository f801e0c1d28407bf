// bench/gpu/ladder_bench.cu — the seeds' ladder, measured: naive (three kernels,
// S and P in HBM) -> FA1 (K/V outer loop, O/l/m in HBM, float32) -> ours
// (flashattn::forward on CUDA tensors, the FA2-class kernel), on the same random
// inputs. For each sequence length and variant it
//   1. allocates the variant's buffers and measures the extra device memory both by
//      counting its allocations and by the drop in cudaMemGetInfo's free bytes;
//   2. poisons the output (all bits set: NaN in fp16/bf16), runs once, checks that
//      every output element was written and that sampled rows match the float64
//      CPU reference (src/cpu/reference.hpp) in O and LSE;
//   3. times it: warm-up, then the median of per-run cudaEvent timings.
// --profile runs each variant once with no checks, for ncu (bench/gpu/ladder_ncu.sh).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/gpu/ladder/cuda_check.hpp"
#include "bench/gpu/ladder/element.cuh"
#include "bench/gpu/ladder/fa1_attention.hpp"
#include "bench/gpu/ladder/naive_attention.hpp"
#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "src/core/numeric.hpp"
#include "src/core/validate.hpp"
#include "src/cpu/reference.hpp"

namespace {

using flashattn::DType;

struct Options {
  std::vector<std::int64_t> seqlens{512, 1024, 2048, 4096, 8192};
  std::int64_t batch = 1;
  std::int64_t heads = 16;
  std::int64_t head_dim = 64;
  DType dtype = DType::float16;
  bool causal = false;
  std::vector<std::string> variants{"naive", "fa1", "ours"};
  int warmup = 3;
  int max_reps = 30;
  double time_budget_ms = 1500.0;  // per (seqlen, variant) timing loop; at least 3 runs
  bool check = true;
  bool profile = false;
  std::string csv_path;
  std::string md_path;
};

[[noreturn]] void usage(const char* message) {
  std::fprintf(stderr,
               "ladder_bench: %s\n"
               "usage: ladder_bench [--seqlens 512,1024,...] [--batch 1] [--heads 16] [--head-dim 64|128]\n"
               "       [--dtype fp16|bf16] [--causal] [--variants naive,fa1,ours] [--warmup 3] [--reps 30]\n"
               "       [--time-budget-ms 1500] [--no-check] [--profile] [--csv FILE] [--md FILE]\n",
               message);
  std::exit(2);
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + arg).c_str());
      return argv[++i];
    };
    if (arg == "--seqlens") {
      options.seqlens.clear();
      for (const std::string& s : split(value())) options.seqlens.push_back(std::stoll(s));
    } else if (arg == "--batch") {
      options.batch = std::stoll(value());
    } else if (arg == "--heads") {
      options.heads = std::stoll(value());
    } else if (arg == "--head-dim") {
      options.head_dim = std::stoll(value());
    } else if (arg == "--dtype") {
      const std::string d = value();
      if (d == "fp16") options.dtype = DType::float16;
      else if (d == "bf16") options.dtype = DType::bfloat16;
      else usage("--dtype must be fp16 or bf16");
    } else if (arg == "--causal") {
      options.causal = true;
    } else if (arg == "--variants") {
      options.variants = split(value());
    } else if (arg == "--warmup") {
      options.warmup = std::stoi(value());
    } else if (arg == "--reps") {
      options.max_reps = std::stoi(value());
    } else if (arg == "--time-budget-ms") {
      options.time_budget_ms = std::stod(value());
    } else if (arg == "--no-check") {
      options.check = false;
    } else if (arg == "--profile") {
      options.profile = true;
      options.check = false;
    } else if (arg == "--csv") {
      options.csv_path = value();
    } else if (arg == "--md") {
      options.md_path = value();
    } else {
      usage(("unknown argument " + arg).c_str());
    }
  }
  for (const std::string& v : options.variants)
    if (v != "naive" && v != "fa1" && v != "ours") usage(("unknown variant " + v).c_str());
  return options;
}

// Standard normal values from a counter-based hash (splitmix64 + Box-Muller), so the
// inputs are random (never zeros) and reproducible without a host-side copy.
__device__ std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class Element>
__global__ void fill_randn_kernel(Element* data, std::int64_t count, std::uint64_t seed) {
  const std::int64_t index = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (index >= count) return;
  const std::uint64_t bits = splitmix64(seed * 0x2545f4914f6cdd1dull + static_cast<std::uint64_t>(index));
  const float u1 = (static_cast<float>(bits >> 40) + 1.0f) * (1.0f / 16777217.0f);  // (0, 1]
  const float u2 = static_cast<float>((bits >> 16) & 0xffffffu) * (1.0f / 16777216.0f);
  data[index] = ladder::from_float<Element>(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
}

void fill_randn(void* data, DType dtype, std::int64_t count, std::uint64_t seed, cudaStream_t stream) {
  constexpr int kThreads = 256;
  ladder::dispatch_element(dtype, [&](auto element) {
    using Element = decltype(element);
    fill_randn_kernel<Element><<<(count + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        static_cast<Element*>(data), count, seed);
    LADDER_CHECK_LAUNCH("fill_randn_kernel");
  });
}

struct DeviceBuffer {
  void* data = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t size) : bytes(size) { LADDER_CUDA_CHECK(cudaMalloc(&data, size)); }
  ~DeviceBuffer() { cudaFree(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

std::size_t free_device_bytes() {
  std::size_t free_bytes = 0, total_bytes = 0;
  LADDER_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

// One rung of the ladder behind a common face: run() writes params.out and lse().
class Variant {
 public:
  virtual ~Variant() = default;
  virtual void run() = 0;
  virtual const float* lse() const = 0;  // [batch, heads, seqlen_q]
  virtual std::size_t extra_bytes() const = 0;
};

class NaiveVariant final : public Variant {
 public:
  NaiveVariant(const flashattn::AttentionParams& p, cublasHandle_t h, cudaStream_t s) : impl_(p, h, s) {}
  void run() override { impl_.run(); }
  const float* lse() const override { return impl_.lse(); }
  std::size_t extra_bytes() const override { return impl_.extra_bytes(); }

 private:
  ladder::NaiveAttention impl_;
};

class Fa1Variant final : public Variant {
 public:
  Fa1Variant(const flashattn::AttentionParams& p, cudaStream_t s) : impl_(p, s) {}
  void run() override { impl_.run(); }
  const float* lse() const override { return impl_.lse(); }
  std::size_t extra_bytes() const override { return impl_.extra_bytes(); }

 private:
  ladder::Fa1Attention impl_;
};

// Ours: the library's public entry point on CUDA tensor views.
class OursVariant final : public Variant {
 public:
  OursVariant(const flashattn::ForwardArgs& device_args, std::int64_t lse_count, cudaStream_t stream)
      : args_(device_args), lse_(static_cast<std::size_t>(lse_count) * sizeof(float)), stream_(stream) {
    const flashattn::TensorView& q = device_args.q;
    args_.maybe_lse = flashattn::TensorView::contiguous(lse_.data, DType::float32, {q.size(0), q.size(2), q.size(1)},
                                                        flashattn::Device::cuda());
  }
  void run() override { flashattn::forward(args_, flashattn::ExecutionContext{stream_, 0}); }
  const float* lse() const override { return static_cast<const float*>(lse_.data); }
  std::size_t extra_bytes() const override { return lse_.bytes; }

 private:
  flashattn::ForwardArgs args_;
  DeviceBuffer lse_;
  cudaStream_t stream_;
};

struct Result {
  std::int64_t seqlen = 0;
  std::string variant;
  std::string status;  // ok, WRONG (...), unavailable (...)
  double time_ms = NAN;
  double tflops = NAN;
  int runs = 0;
  std::size_t extra_bytes_counted = 0;
  std::int64_t extra_bytes_measured = 0;  // drop of cudaMemGetInfo's free bytes, 2 MiB granularity
  double max_error_out = NAN;
  double max_error_lse = NAN;
};

struct ReferenceRow {
  std::int64_t head = 0, row = 0;
  std::vector<double> out;
  double lse = 0.0;
};

double output_tolerance(DType dtype) { return dtype == DType::bfloat16 ? 1.6e-2 : 2.0e-3; }
constexpr double kLseTolerance = 2.0e-3;

double median(std::vector<float> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::string human_bytes(double bytes) {
  char text[32];
  if (bytes >= 1024.0 * 1024.0 * 1024.0) std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  else if (bytes >= 1024.0 * 1024.0) std::snprintf(text, sizeof text, "%.2f MiB", bytes / (1024.0 * 1024.0));
  else std::snprintf(text, sizeof text, "%.1f KiB", bytes / 1024.0);
  return text;
}

class Ladder {
 public:
  explicit Ladder(Options options) : options_(std::move(options)) {
    LADDER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LADDER_CUBLAS_CHECK(cublasCreate(&cublas_));
    // cuBLAS gets a fixed workspace up front, so none of its allocations land inside
    // a variant's memory measurement.
    cublas_workspace_ = std::make_unique<DeviceBuffer>(std::size_t{32} << 20);
    LADDER_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_->data, cublas_workspace_->bytes));
    LADDER_CUDA_CHECK(cudaEventCreate(&start_));
    LADDER_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Ladder() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cublas_workspace_.reset();
    cublasDestroy(cublas_);
    cudaStreamDestroy(stream_);
  }

  // Appends one result per variant for this sequence length.
  void run_seqlen(std::int64_t seqlen, std::vector<Result>& results) {
    const Options& o = options_;
    const std::int64_t count = o.batch * seqlen * o.heads * o.head_dim;
    const std::size_t bytes = static_cast<std::size_t>(count) * flashattn::dtype_size(o.dtype);
    DeviceBuffer q(bytes), k(bytes), v(bytes), out(bytes);
    fill_randn(q.data, o.dtype, count, 3 * static_cast<std::uint64_t>(seqlen) + 0, stream_);
    fill_randn(k.data, o.dtype, count, 3 * static_cast<std::uint64_t>(seqlen) + 1, stream_);
    fill_randn(v.data, o.dtype, count, 3 * static_cast<std::uint64_t>(seqlen) + 2, stream_);
    LADDER_CUDA_CHECK(cudaStreamSynchronize(stream_));

    // Host copies: the reference reads them, and validation builds the params from them.
    std::vector<std::uint16_t> q_host(static_cast<std::size_t>(count)), k_host(q_host.size()), v_host(q_host.size()),
        out_host(q_host.size());
    LADDER_CUDA_CHECK(cudaMemcpy(q_host.data(), q.data, bytes, cudaMemcpyDeviceToHost));
    LADDER_CUDA_CHECK(cudaMemcpy(k_host.data(), k.data, bytes, cudaMemcpyDeviceToHost));
    LADDER_CUDA_CHECK(cudaMemcpy(v_host.data(), v.data, bytes, cudaMemcpyDeviceToHost));

    auto view = [&](void* data, flashattn::Device device) {
      return flashattn::TensorView::contiguous(data, o.dtype, {o.batch, seqlen, o.heads, o.head_dim}, device);
    };
    flashattn::ForwardArgs host_args;
    host_args.q = view(q_host.data(), flashattn::Device::cpu());
    host_args.k = view(k_host.data(), flashattn::Device::cpu());
    host_args.v = view(v_host.data(), flashattn::Device::cpu());
    host_args.out = view(out_host.data(), flashattn::Device::cpu());
    host_args.options.causal = o.causal;
    // Validated once on the host views; the device params differ only in pointers.
    const flashattn::AttentionParams host_params = flashattn::validate_forward(host_args);
    flashattn::AttentionParams device_params = host_params;
    device_params.device = flashattn::Device::cuda();
    device_params.q = q.data;
    device_params.k = k.data;
    device_params.v = v.data;
    device_params.out = out.data;
    device_params.maybe_lse = nullptr;

    flashattn::ForwardArgs device_args = host_args;
    device_args.q = view(q.data, flashattn::Device::cuda());
    device_args.k = view(k.data, flashattn::Device::cuda());
    device_args.v = view(v.data, flashattn::Device::cuda());
    device_args.out = view(out.data, flashattn::Device::cuda());

    const std::vector<ReferenceRow> reference = o.check ? reference_rows(host_params) : std::vector<ReferenceRow>{};
    const std::int64_t lse_count = o.batch * o.heads * seqlen;

    for (const std::string& name : o.variants) {
      Result result;
      result.seqlen = seqlen;
      result.variant = name;
      try {
        const std::size_t free_before = free_device_bytes();
        std::unique_ptr<Variant> variant;
        if (name == "naive") variant = std::make_unique<NaiveVariant>(device_params, cublas_, stream_);
        else if (name == "fa1") variant = std::make_unique<Fa1Variant>(device_params, stream_);
        else variant = std::make_unique<OursVariant>(device_args, lse_count, stream_);
        result.extra_bytes_counted = variant->extra_bytes();

        LADDER_CUDA_CHECK(cudaMemsetAsync(out.data, 0xff, bytes, stream_));
        LADDER_CUDA_CHECK(cudaMemsetAsync(const_cast<float*>(variant->lse()), 0xff,
                                          static_cast<std::size_t>(lse_count) * sizeof(float), stream_));
        variant->run();
        LADDER_CUDA_CHECK(cudaStreamSynchronize(stream_));
        // After the first run, so memory a variant allocates inside run() counts too.
        result.extra_bytes_measured =
            static_cast<std::int64_t>(free_before) - static_cast<std::int64_t>(free_device_bytes());

        result.status = "ok";
        if (o.check) check(*variant, out, out_host, host_params, reference, result);
        if (!o.profile) time(*variant, seqlen, result);
      } catch (const flashattn::NotSupported& e) {
        result.status = std::string("unavailable (") + e.what() + ")";
      } catch (const std::exception& e) {
        result.status = std::string("unavailable (") + e.what() + ")";
        // A failed CUDA call may leave a sticky error; clear what can be cleared.
        cudaGetLastError();
      }
      print(result);
      results.push_back(result);
    }
  }

 private:
  std::vector<ReferenceRow> reference_rows(const flashattn::AttentionParams& params) const {
    // First, last and interior rows of a few heads: covers the first/last Q and K/V blocks.
    const std::int64_t n = params.seqlen_q;
    const std::int64_t rows[] = {0, 1, n / 3, n / 2 + 7, n - 2, n - 1};
    const std::int64_t heads[] = {0, params.heads_q / 2, params.heads_q - 1};
    std::vector<ReferenceRow> reference;
    for (std::int64_t h : heads)
      for (std::int64_t i : rows) {
        if (i < 0 || i >= n) continue;
        ReferenceRow row;
        row.head = h;
        row.row = i;
        row.out.resize(static_cast<std::size_t>(params.head_dim));
        row.lse = flashattn::cpu::reference_forward_row(params, 0, h, i, row.out.data());
        reference.push_back(std::move(row));
      }
    return reference;
  }

  void check(const Variant& variant, const DeviceBuffer& out, std::vector<std::uint16_t>& out_host,
             const flashattn::AttentionParams& params, const std::vector<ReferenceRow>& reference, Result& result) {
    LADDER_CUDA_CHECK(cudaMemcpy(out_host.data(), out.data, out.bytes, cudaMemcpyDeviceToHost));
    std::vector<float> lse_host(static_cast<std::size_t>(params.batch * params.heads_q * params.seqlen_q));
    LADDER_CUDA_CHECK(cudaMemcpy(lse_host.data(), variant.lse(), lse_host.size() * sizeof(float), cudaMemcpyDeviceToHost));
    // Every element written: the poison is NaN and attention over finite inputs is finite.
    std::int64_t unwritten = 0;
    for (std::size_t index = 0; index < out_host.size(); ++index)
      if (!std::isfinite(flashattn::numeric::load_as_float(out_host.data(), params.dtype, static_cast<std::int64_t>(index))))
        ++unwritten;
    for (float x : lse_host)
      if (std::isnan(x)) ++unwritten;
    double error_out = 0.0, error_lse = 0.0;
    for (const ReferenceRow& row : reference) {
      for (std::int64_t d = 0; d < params.head_dim; ++d) {
        const std::int64_t index = params.out_offset(0, row.head) + row.row * params.out_row_stride + d;
        const double value = flashattn::numeric::load_as_float(out_host.data(), params.dtype, index);
        error_out = std::max(error_out, std::abs(value - row.out[static_cast<std::size_t>(d)]));
      }
      const double lse = lse_host[static_cast<std::size_t>(row.head * params.seqlen_q + row.row)];
      error_lse = std::max(error_lse, std::isinf(row.lse) && lse == row.lse ? 0.0 : std::abs(lse - row.lse));
    }
    result.max_error_out = error_out;
    result.max_error_lse = error_lse;
    if (unwritten > 0) result.status = "WRONG (" + std::to_string(unwritten) + " elements not written or NaN)";
    else if (!(error_out <= output_tolerance(params.dtype)) || !(error_lse <= kLseTolerance))
      result.status = "WRONG (error above tolerance)";
  }

  void time(Variant& variant, std::int64_t seqlen, Result& result) {
    const Options& o = options_;
    for (int i = 0; i < o.warmup; ++i) variant.run();
    std::vector<float> times;
    float elapsed_total = 0.0f;
    while (static_cast<int>(times.size()) < o.max_reps &&
           (times.size() < 3 || elapsed_total < o.time_budget_ms)) {
      LADDER_CUDA_CHECK(cudaEventRecord(start_, stream_));
      variant.run();
      LADDER_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      LADDER_CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0.0f;
      LADDER_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      times.push_back(ms);
      elapsed_total += ms;
    }
    result.runs = static_cast<int>(times.size());
    result.time_ms = median(times);
    const double flops = 4.0 * o.batch * o.heads * static_cast<double>(seqlen) * seqlen * o.head_dim *
                         (o.causal ? 0.5 : 1.0);
    result.tflops = flops / (result.time_ms * 1e-3) / 1e12;
  }

  void print(const Result& r) const {
    std::printf("N=%-6lld %-6s time %10.4f ms  %8.2f TFLOP/s  extra %10s (memgetinfo %10s)  err_out %.3g err_lse %.3g  [%s]\n",
                static_cast<long long>(r.seqlen), r.variant.c_str(), r.time_ms, r.tflops,
                human_bytes(static_cast<double>(r.extra_bytes_counted)).c_str(),
                human_bytes(static_cast<double>(r.extra_bytes_measured)).c_str(), r.max_error_out, r.max_error_lse,
                r.status.c_str());
    std::fflush(stdout);
  }

  Options options_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<DeviceBuffer> cublas_workspace_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

std::string device_name() {
  int device = 0;
  LADDER_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp properties{};
  LADDER_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  return properties.name;
}

std::string csv_field(std::string text) {
  std::replace(text.begin(), text.end(), ',', ';');
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

void write_csv(const std::string& path, const Options& o, const std::string& device,
               const std::vector<Result>& results) {
  std::ofstream file(path);
  file << "device,dtype,batch,heads,head_dim,causal,seqlen,variant,status,time_ms,tflops,runs,"
          "extra_bytes_counted,extra_bytes_memgetinfo,max_error_out,max_error_lse\n";
  for (const Result& r : results)
    file << csv_field(device) << ',' << flashattn::dtype_name(o.dtype) << ',' << o.batch << ',' << o.heads << ','
         << o.head_dim << ',' << (o.causal ? 1 : 0) << ',' << r.seqlen << ',' << r.variant << ','
         << csv_field(r.status) << ',' << r.time_ms << ',' << r.tflops << ',' << r.runs << ','
         << r.extra_bytes_counted << ',' << r.extra_bytes_measured << ',' << r.max_error_out << ','
         << r.max_error_lse << '\n';
}

void write_markdown(const std::string& path, const Options& o, const std::string& device,
                    const std::vector<Result>& results) {
  std::ofstream file(path);
  file << "Ladder on " << device << ": batch " << o.batch << ", " << o.heads << " heads, head_dim " << o.head_dim
       << ", " << flashattn::dtype_name(o.dtype) << (o.causal ? ", causal" : ", no mask") << ".\n\n";
  file << "| seqlen | variant | time (ms) | TFLOP/s | extra memory (counted) | extra memory (cudaMemGetInfo) | "
          "max err O | max err LSE | status |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const Result& r : results) {
    char line[512];
    std::snprintf(line, sizeof line, "| %lld | %s | %.4g | %.3g | %s | %s | %.3g | %.3g | %s |\n",
                  static_cast<long long>(r.seqlen), r.variant.c_str(), r.time_ms, r.tflops,
                  human_bytes(static_cast<double>(r.extra_bytes_counted)).c_str(),
                  human_bytes(static_cast<double>(r.extra_bytes_measured)).c_str(), r.max_error_out,
                  r.max_error_lse, r.status.c_str());
    file << line;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options options = parse(argc, argv);
    const std::string device = device_name();
    std::printf("ladder_bench on %s: batch %lld, heads %lld, head_dim %lld, %s%s\n", device.c_str(),
                static_cast<long long>(options.batch), static_cast<long long>(options.heads),
                static_cast<long long>(options.head_dim), flashattn::dtype_name(options.dtype),
                options.causal ? ", causal" : "");
    Ladder ladder(options);
    std::vector<Result> results;
    for (std::int64_t seqlen : options.seqlens) {
      ladder.run_seqlen(seqlen, results);
      // Rewritten after every length, so a run stopped by a time limit keeps what it measured.
      if (!options.csv_path.empty()) write_csv(options.csv_path, options, device, results);
      if (!options.md_path.empty()) write_markdown(options.md_path, options, device, results);
    }
    const bool any_wrong = std::any_of(results.begin(), results.end(),
                                       [](const Result& r) { return r.status.rfind("WRONG", 0) == 0; });
    return any_wrong ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ladder_bench: %s\n", e.what());
    return 1;
  }
}
