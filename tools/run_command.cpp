// tools/run_command.cpp — `flashattn run`: one problem, timed, spot-checked
// against the float64 reference.
#include <cstdio>

#include "flashattn/attention.hpp"
#include "tools/accuracy.hpp"
#include "tools/commands.hpp"
#include "tools/workload.hpp"

namespace flashattn::tools {

void add_run_command(CLI::App& app, RunOptions& o) {
  CLI::App* run = app.add_subcommand(
      "run", "Attention on one problem (default: batch 2, 16 heads, seqlen 2048, head_dim 64, causal) on the GPU "
             "if present, else the CPU; prints time, throughput and the error of sampled rows vs the float64 reference");
  o.problem.causal = true;
  add_problem_options(*run, o.problem);
  run->add_option("--seqlen", o.seqlen, "query sequence length")->capture_default_str()->check(integer_at_least(0));
  run->add_flag("--causal,!--no-causal", o.problem.causal, "causal mask, bottom-right aligned (default on)");
  run->add_option("--rows", o.sample_rows, "query rows checked against the reference")
      ->capture_default_str()
      ->check(integer_at_least(0));
  run->add_option("--seed", o.seed, "random seed of the inputs")->capture_default_str();
}

int run_command(const RunOptions& o) {
  const Problem p = make_problem(o.problem, o.seqlen);
  const int warmup = warmup_runs(o.problem, p), repeats = timed_runs(o.problem, p);
  std::printf("flashattn run\n");
  std::printf("  shape      %s  (batch, seqlen, heads, head_dim)\n", p.shape_text().c_str());
  std::printf("  mask       %s\n", p.mask_text().c_str());
  std::printf("  device     %s\n", device_text(p).c_str());
  std::printf("  dtype      %s\n", dtype_name(p.dtype));
  std::printf("  algorithm  %s\n", algorithm_name(p.algorithm));
  std::fflush(stdout);

  Workload workload(p, o.seed, /*with_backward=*/false);
  const double ms = workload.time_forward_ms(warmup, repeats);
  workload.download_outputs();
  const double flops = p.forward_flops();
  const bool on_gpu = p.device.type == DeviceType::cuda;
  std::printf("  time       %.3f ms (median of %d runs after %d warm-up)\n", ms, repeats, warmup);
  if (on_gpu)
    std::printf("  throughput %.1f TFLOP/s\n", flops / (ms * 1e-3) / 1e12);
  else
    std::printf("  throughput %.1f GFLOP/s\n", flops / (ms * 1e-3) / 1e9);
  std::fflush(stdout);

  const std::vector<RowIndex> rows = sample_rows(p, o.sample_rows, o.seed + 1);
  const ForwardAccuracy accuracy = check_forward_rows(workload, rows);
  std::printf("  max error  out %s, lse %s  (%zu sampled rows vs the float64 reference; bound = 2 x naive %s + floor)\n",
              accuracy.out.summary().c_str(), accuracy.lse.summary().c_str(), rows.size(), dtype_name(p.dtype));
  std::printf("  result     %s\n", accuracy.passed() ? "PASS" : "FAIL");
  return accuracy.passed() ? 0 : 1;
}

}  // namespace flashattn::tools
