// bench/cpu/cpu_forward_bench.cpp — times the CPU forward (float32) and prints one
// CSV row per seqlen:
//   seqlen,causal,threads,algorithm,time_ms,gflops,cpu_ms,peak_rss_mib
// Median of --repeats timed runs after one warm-up. cpu_ms is the process CPU time of
// a run (all threads): on a shared machine, time_ms/cpu_ms shows the preemption. FLOPs = 4·B·H·Nq·Nk·d, halved for
// causal (BENCHMARKS.md). Not a test: nothing here checks results (the tests do).
//
// --layout bhsd (default) stores q, k, v, out as [batch, heads, seqlen, head_dim] in
// memory — what PyTorch's SDPA is given in compare_torch.py — and passes flashattn the
// equivalent strided [batch, seqlen, heads, head_dim] views; bshd stores the flash_attn
// layout itself, where the rows of one head are heads·head_dim elements apart.
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "src/cpu/kernels.hpp"
#include "tests/support/host_tensor.hpp"

namespace {

struct Options {
  std::int64_t batch = 1, heads = 16, head_dim = 64;
  std::vector<std::int64_t> seqlens{1024, 4096};
  bool causal = false;
  int threads = 0;
  int repeats = 5;
  flashattn::Algorithm algorithm = flashattn::Algorithm::flash2;
  bool heads_outer = true;  // --layout bhsd
  bool header = true;
};

std::vector<std::int64_t> parse_list(const char* text) {
  std::vector<std::int64_t> values;
  for (const char* p = text; *p;) {
    char* end = nullptr;
    values.push_back(std::strtoll(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return values;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "cpu_forward_bench: %s\nusage: cpu_forward_bench [--batch B] [--heads H] [--head-dim D] [--seqlens N1,N2,...]\n"
               "       [--causal] [--threads T] [--repeats R] [--algorithm flash2|flash1] [--layout bhsd|bshd] [--no-header]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&] {
      if (i + 1 >= argc) usage(("missing value for " + arg).c_str());
      return argv[++i];
    };
    if (arg == "--batch") o.batch = std::atoll(value());
    else if (arg == "--heads") o.heads = std::atoll(value());
    else if (arg == "--head-dim") o.head_dim = std::atoll(value());
    else if (arg == "--seqlens") o.seqlens = parse_list(value());
    else if (arg == "--causal") o.causal = true;
    else if (arg == "--threads") o.threads = std::atoi(value());
    else if (arg == "--repeats") o.repeats = std::max(1, std::atoi(value()));
    else if (arg == "--no-header") o.header = false;
    else if (arg == "--layout") {
      const std::string name = value();
      if (name != "bhsd" && name != "bshd") usage(("unknown layout " + name).c_str());
      o.heads_outer = name == "bhsd";
    }
    else if (arg == "--algorithm") {
      const std::string name = value();
      if (name == "flash2") o.algorithm = flashattn::Algorithm::flash2;
      else if (name == "flash1") o.algorithm = flashattn::Algorithm::flash1;
      else usage(("unknown algorithm " + name).c_str());
    } else usage(("unknown argument " + arg).c_str());
  }
  if (o.batch < 1 || o.heads < 1 || o.head_dim < 1 || o.seqlens.empty()) usage("sizes must be positive");
  return o;
}

double process_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::fprintf(stderr, "cpu_forward_bench: vector kernels %s\n", flashattn::cpu::tile_kernels().isa);
  if (o.header) std::printf("seqlen,causal,threads,algorithm,time_ms,gflops,cpu_ms,peak_rss_mib\n");
  for (const std::int64_t seqlen : o.seqlens) {
    using flashattn::testing::HostTensor;
    const std::int64_t b = o.batch, n = seqlen, h = o.heads, d = o.head_dim;
    const std::vector<std::int64_t> shape = o.heads_outer ? std::vector<std::int64_t>{b, h, n, d} : std::vector<std::int64_t>{b, n, h, d};
    HostTensor q(flashattn::DType::float32, shape), k(flashattn::DType::float32, shape), v(flashattn::DType::float32, shape);
    HostTensor out(flashattn::DType::float32, shape), lse(flashattn::DType::float32, {b, h, n});
    q.fill_random(1), k.fill_random(2), v.fill_random(3);
    // The [batch, seqlen, heads, head_dim] view flashattn takes, onto either storage.
    const auto view = [&](HostTensor& t) {
      if (!o.heads_outer) return t.view();
      return flashattn::TensorView::strided(t.data(), flashattn::DType::float32, {b, n, h, d}, {h * n * d, d, n * d, 1});
    };
    flashattn::ForwardArgs args;
    args.q = view(q), args.k = view(k), args.v = view(v), args.out = view(out), args.maybe_lse = lse.view();
    args.options.causal = o.causal;
    args.options.algorithm = o.algorithm;
    flashattn::ExecutionContext context;
    context.num_threads = o.threads;
    std::vector<double> times_ms, cpu_times_ms;
    for (int run = 0; run <= o.repeats; ++run) {
      const double cpu_start = process_cpu_ms();
      const auto start = std::chrono::steady_clock::now();
      flashattn::forward(args, context);
      const auto stop = std::chrono::steady_clock::now();
      if (run == 0) continue;  // warm-up
      times_ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
      cpu_times_ms.push_back(process_cpu_ms() - cpu_start);
    }
    std::sort(times_ms.begin(), times_ms.end());
    std::sort(cpu_times_ms.begin(), cpu_times_ms.end());
    const double median_ms = times_ms[times_ms.size() / 2];
    const double flops = 4.0 * static_cast<double>(o.batch * o.heads) * static_cast<double>(seqlen) * static_cast<double>(seqlen) *
                         static_cast<double>(o.head_dim) * (o.causal ? 0.5 : 1.0);
    std::printf("%lld,%d,%d,%s,%.3f,%.2f,%.3f,%.1f\n", static_cast<long long>(seqlen), o.causal ? 1 : 0, o.threads,
                flashattn::algorithm_name(o.algorithm), median_ms, flops / (median_ms * 1e6), cpu_times_ms[cpu_times_ms.size() / 2],
                peak_rss_mib());
    std::fflush(stdout);
  }
  return 0;
}
