// tools/problem_options.cpp — the problem flags shared by `run` and `bench`.
#include <stdexcept>

#include "flashattn/attention.hpp"
#include "tools/commands.hpp"
#include "tools/device_buffer.hpp"

namespace flashattn::tools {

CLI::Validator integer_at_least(long long minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        std::size_t used = 0;
        long long value = 0;
        try {
          value = std::stoll(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return "expected an integer, got '" + text + "'";
        if (value < minimum) return "must be >= " + std::to_string(minimum) + ", got " + text;
        return {};
      },
      "INT>=" + std::to_string(minimum));
}

CLI::Validator number_at_least(double minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        std::size_t used = 0;
        double value = 0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return "expected a number, got '" + text + "'";
        if (!(value >= minimum)) return "must be >= " + std::to_string(minimum) + ", got " + text;
        return {};
      },
      "NUMBER>=" + std::to_string(minimum));
}

void add_problem_options(CLI::App& command, ProblemOptions& o) {
  command.add_option("--device", o.device, "cpu, cuda, cuda:N or auto (the GPU when built with CUDA and present)")
      ->capture_default_str();
  command.add_option("--dtype", o.dtype, "float32, float16, bfloat16 or auto (float16 on the GPU, float32 on the CPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "float32", "fp32", "float16", "fp16", "half", "bfloat16", "bf16"}));
  command.add_option("--batch", o.batch, "batch size")->capture_default_str()->check(integer_at_least(0));
  command.add_option("--heads", o.heads, "query heads")->capture_default_str()->check(integer_at_least(1));
  command.add_option("--heads-kv", o.heads_kv, "key/value heads (GQA/MQA when fewer; default: --heads)")
      ->check(integer_at_least(1));
  command.add_option("--head-dim", o.head_dim, "head dimension")->capture_default_str()->check(integer_at_least(1));
  command.add_option("--seqlen-k", o.seqlen_k, "key/value sequence length (default: the query's)")
      ->check(integer_at_least(0));
  command.add_option("--window", o.window, "sliding window L,R (bottom-right aligned; -1 = unbounded)");
  command.add_option("--softcap", o.softcap, "logit soft-capping (0 = off)")->check(number_at_least(0.0));
  command.add_option("--algorithm", o.algorithm, "automatic, flash2, flash3 (CUDA, Hopper only), flash1 or reference (the last two: CPU only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"automatic", "flash2", "flash3", "flash1", "reference"}));
  command.add_option("--threads", o.threads, "CPU threads (0 = all)")->capture_default_str()->check(integer_at_least(0));
  command.add_option("--warmup", o.warmup, "untimed runs first (default: 1 on the CPU, 10 on the GPU)")
      ->check(integer_at_least(0));
  command.add_option("--repeats", o.repeats, "timed runs; the median is reported (default: 5 on the CPU, 30 on the GPU)")
      ->check(integer_at_least(1));
}

Problem make_problem(const ProblemOptions& o, std::int64_t seqlen_q) {
  Problem p;
  p.device = resolve_device(o.device);
  p.dtype = resolve_dtype(o.dtype, p.device);
  p.batch = o.batch;
  p.heads = o.heads;
  p.heads_kv = o.heads_kv > 0 ? o.heads_kv : o.heads;
  p.head_dim = o.head_dim;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = o.seqlen_k > 0 ? o.seqlen_k : seqlen_q;
  p.causal = o.causal;
  if (!o.window.empty()) {
    std::vector<std::int64_t> window;
    try {
      window = parse_int_list(o.window);
    } catch (const std::invalid_argument&) {
    }
    if (window.size() != 2) throw std::invalid_argument("--window: expected L,R (two integers, -1 = unbounded), got '" + o.window + "'");
    p.window_left = window[0];
    p.window_right = window[1];
  }
  p.softcap = o.softcap;
  p.algorithm = parse_algorithm(o.algorithm);
  p.threads = o.threads;
  if (p.heads % p.heads_kv != 0)
    throw std::invalid_argument("--heads-kv: must divide --heads (" + std::to_string(p.heads) + "), got " + std::to_string(p.heads_kv));
  return p;
}

int warmup_runs(const ProblemOptions& o, const Problem& p) {
  if (o.warmup >= 0) return o.warmup;
  return p.device.type == DeviceType::cuda ? 10 : 1;
}

int timed_runs(const ProblemOptions& o, const Problem& p) {
  if (o.repeats > 0) return o.repeats;
  return p.device.type == DeviceType::cuda ? 30 : 5;
}

std::string device_text(const Problem& p) {
  if (p.device.type == DeviceType::cuda) return to_string(p.device) + " (" + device_name(p.device.index) + ")";
  return "cpu (" + std::to_string(p.effective_threads()) + " threads)";
}

}  // namespace flashattn::tools
