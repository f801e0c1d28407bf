// tools/bench_command.cpp — `flashattn bench`: a sweep over sequence lengths,
// printed as a table and written as CSV and/or JSON.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "tools/commands.hpp"
#include "tools/workload.hpp"

namespace flashattn::tools {

namespace {

struct Measurement {
  Problem problem;
  const char* pass;  // "fwd" | "bwd"
  double time_ms;
  double gflops;
};

double gflops_of(double flops, double ms) { return ms > 0.0 ? flops / (ms * 1e-3) / 1e9 : 0.0; }

std::string window_text(const Problem& p) {
  return std::to_string(p.window_left) + "," + std::to_string(p.window_right);
}

void write_csv(const std::string& path, const std::vector<Measurement>& rows) {
  std::ofstream file(path);
  if (!file) throw std::runtime_error("--csv: cannot open '" + path + "' for writing");
  file << "device,dtype,batch,heads,heads_kv,head_dim,seqlen_q,seqlen_k,causal,window,softcap,algorithm,threads,pass,time_ms,gflops\n";
  for (const Measurement& m : rows) {
    const Problem& p = m.problem;
    file << to_string(p.device) << ',' << dtype_name(p.dtype) << ',' << p.batch << ',' << p.heads << ',' << p.heads_kv << ','
         << p.head_dim << ',' << p.seqlen_q << ',' << p.seqlen_k << ',' << (p.causal ? "true" : "false") << ",\""
         << window_text(p) << "\"," << p.softcap << ',' << algorithm_name(p.algorithm) << ',' << p.effective_threads() << ','
         << m.pass << ',' << m.time_ms << ',' << m.gflops << '\n';
  }
  if (!file) throw std::runtime_error("--csv: failed writing '" + path + "'");
}

void write_json(const std::string& path, const std::vector<Measurement>& rows) {
  std::ofstream file(path);
  if (!file) throw std::runtime_error("--json: cannot open '" + path + "' for writing");
  file << "[\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Measurement& m = rows[i];
    const Problem& p = m.problem;
    file << "  {\"device\": \"" << to_string(p.device) << "\", \"dtype\": \"" << dtype_name(p.dtype) << "\", \"batch\": " << p.batch
         << ", \"heads\": " << p.heads << ", \"heads_kv\": " << p.heads_kv << ", \"head_dim\": " << p.head_dim
         << ", \"seqlen_q\": " << p.seqlen_q << ", \"seqlen_k\": " << p.seqlen_k << ", \"causal\": " << (p.causal ? "true" : "false")
         << ", \"window\": [" << p.window_left << ", " << p.window_right << "], \"softcap\": " << p.softcap
         << ", \"algorithm\": \"" << algorithm_name(p.algorithm) << "\", \"threads\": " << p.effective_threads()
         << ", \"pass\": \"" << m.pass << "\", \"time_ms\": " << m.time_ms << ", \"gflops\": " << m.gflops << "}"
         << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  file << "]\n";
  if (!file) throw std::runtime_error("--json: failed writing '" + path + "'");
}

// A one-line progress bar on stderr, only when stderr is a terminal.
class Progress {
 public:
  explicit Progress(std::size_t total) : total_(total), is_terminal_(isatty(STDERR_FILENO) == 1) {}
  void show(std::size_t done, const std::string& what) const {
    if (!is_terminal_) return;
    constexpr std::size_t kWidth = 30;
    const std::size_t filled = total_ ? done * kWidth / total_ : kWidth;
    std::fprintf(stderr, "\r[%s%s] %zu/%zu %-32s", std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                 done, total_, what.c_str());
    std::fflush(stderr);
  }
  void clear() const {
    if (is_terminal_) std::fprintf(stderr, "\r%80s\r", "");
  }

 private:
  std::size_t total_;
  bool is_terminal_;
};

}  // namespace

void add_bench_command(CLI::App& app, BenchOptions& o) {
  CLI::App* bench = app.add_subcommand("bench", "Time forward (and --backward) over a sweep of sequence lengths");
  add_problem_options(*bench, o.problem);
  bench->add_option("--seqlens", o.seqlens, "comma-separated query sequence lengths")->capture_default_str();
  bench->add_flag("--causal", o.problem.causal, "causal mask, bottom-right aligned");
  bench->add_flag("--backward", o.backward, "time flashattn::backward as well (FLOPs = 2.5x forward)");
  bench->add_option("--csv", o.csv_path, "write the results as CSV");
  bench->add_option("--json", o.json_path, "write the results as JSON");
  bench->add_option("--seed", o.seed, "random seed of the inputs")->capture_default_str();
  bench->add_flag("--decode", o.decode, "decoding with a KV cache: one query token per sequence, --seqlens = cache lengths; TB/s of K+V read");
  bench->add_option("--page-size", o.page_size, "with --decode: paged cache with this page size (multiple of 16, 16-256); 0 = contiguous")->capture_default_str();
  bench->add_option("--splits", o.num_splits, "with --decode: split-KV chunks (0 = heuristic)")->capture_default_str()->check(integer_at_least(0));
}

int bench_command(const BenchOptions& o) {
  if (o.decode) return decode_bench_command(o);
  std::vector<std::int64_t> seqlens;
  try {
    seqlens = parse_int_list(o.seqlens);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--seqlens: ") + e.what());
  }
  for (std::int64_t s : seqlens)
    if (s < 0) throw std::invalid_argument("--seqlens: lengths must be >= 0, got " + std::to_string(s));
  const Problem first = make_problem(o.problem, seqlens.front());
  const bool on_gpu = first.device.type == DeviceType::cuda;
  const double unit = on_gpu ? 1e12 : 1e9;
  std::printf("flashattn bench: %s, %s, %s, %s, algorithm %s\n", device_text(first).c_str(), dtype_name(first.dtype),
              first.mask_text().c_str(), first.shape_text().c_str(), algorithm_name(first.algorithm));
  std::printf("%9s %9s %5s %12s %10s\n", "seqlen_q", "seqlen_k", "pass", "time (ms)", on_gpu ? "TFLOP/s" : "GFLOP/s");
  std::fflush(stdout);

  std::vector<Measurement> results;
  Progress progress(seqlens.size());
  for (std::size_t i = 0; i < seqlens.size(); ++i) {
    const Problem p = make_problem(o.problem, seqlens[i]);
    progress.show(i, "seqlen " + std::to_string(p.seqlen_q));
    Workload workload(p, o.seed, o.backward);
    const int warmup = warmup_runs(o.problem, p), repeats = timed_runs(o.problem, p);
    std::vector<Measurement> rows;
    const double forward_ms = workload.time_forward_ms(warmup, repeats);
    rows.push_back({p, "fwd", forward_ms, gflops_of(p.forward_flops(), forward_ms)});
    if (o.backward) {
      progress.show(i, "seqlen " + std::to_string(p.seqlen_q) + " backward");
      const double backward_ms = workload.time_backward_ms(warmup, repeats);
      rows.push_back({p, "bwd", backward_ms, gflops_of(p.backward_flops(), backward_ms)});
    }
    progress.clear();
    for (const Measurement& m : rows) {
      std::printf("%9lld %9lld %5s %12.3f %10.1f\n", static_cast<long long>(p.seqlen_q), static_cast<long long>(p.seqlen_k),
                  m.pass, m.time_ms, m.gflops * 1e9 / unit);
      results.push_back(m);
    }
    std::fflush(stdout);
  }
  progress.clear();
  if (!o.csv_path.empty()) write_csv(o.csv_path, results);
  if (!o.json_path.empty()) write_json(o.json_path, results);
  return 0;
}

}  // namespace flashattn::tools
