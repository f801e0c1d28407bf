// tools/commands.hpp — the subcommands of the `flashattn` tool and their options.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "tools/problem.hpp"

namespace flashattn::tools {

// Options describing a problem, shared by run and bench. Strings are resolved
// after parsing (device/dtype "auto" depend on the build and the machine).
struct ProblemOptions {
  std::string device = "auto";
  std::string dtype = "auto";
  std::int64_t batch = 2;
  std::int64_t heads = 16;
  std::int64_t heads_kv = 0;  // 0 = heads
  std::int64_t head_dim = 64;
  std::int64_t seqlen_k = 0;  // 0 = seqlen_q
  bool causal = false;
  std::string window;  // "L,R"
  double softcap = 0.0;
  std::string algorithm = "automatic";
  int threads = 0;
  int warmup = -1;   // -1: 1 on the CPU, 10 on the GPU
  int repeats = -1;  // -1: 5 on the CPU, 30 on the GPU
};

// Option validators with messages that name the expected value.
CLI::Validator integer_at_least(long long minimum);
CLI::Validator number_at_least(double minimum);

void add_problem_options(CLI::App& command, ProblemOptions& options);
// Throws std::invalid_argument naming the flag for values CLI11 cannot check.
Problem make_problem(const ProblemOptions& options, std::int64_t seqlen_q);
int warmup_runs(const ProblemOptions& options, const Problem& problem);
int timed_runs(const ProblemOptions& options, const Problem& problem);
// "cpu (2 threads)" or "cuda:0 (NVIDIA H100 80GB HBM3)".
std::string device_text(const Problem& problem);

struct RunOptions {
  ProblemOptions problem;
  std::int64_t seqlen = 2048;
  std::int64_t sample_rows = 64;
  std::uint64_t seed = 0;
};
void add_run_command(CLI::App& app, RunOptions& options);
int run_command(const RunOptions& options);

struct BenchOptions {
  ProblemOptions problem;
  std::string seqlens = "512,1024,2048,4096";
  bool backward = false;
  std::string csv_path;
  std::string json_path;
  std::uint64_t seed = 0;
  bool decode = false;         // --decode: forward_with_kvcache, --seqlens = cache lengths
  std::int64_t page_size = 0;  // --page-size (decode): 0 = contiguous cache
  int num_splits = 0;          // --splits (decode): 0 = the library's heuristic
};
void add_bench_command(CLI::App& app, BenchOptions& options);
int bench_command(const BenchOptions& options);
int decode_bench_command(const BenchOptions& options);  // tools/decode_bench.cpp

struct CheckOptions {
  std::string device = "auto";
  std::string algorithm;  // empty: every algorithm the device has (cpu: flash2, flash1)
  bool backward = false;
  bool quick = false;
  int threads = 0;
  std::uint64_t seed = 0;
};
void add_check_command(CLI::App& app, CheckOptions& options);
int check_command(const CheckOptions& options);

}  // namespace flashattn::tools
