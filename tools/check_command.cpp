// tools/check_command.cpp — `flashattn check`: a correctness sweep over awkward
// problems against the float64 reference, pass/fail per case.
#include <cstdio>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "tools/accuracy.hpp"
#include "tools/commands.hpp"
#include "tools/workload.hpp"

namespace flashattn::tools {

namespace {

struct Case {
  bool is_quick;  // part of --quick
  DType dtype;
  std::int64_t batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim;
  bool causal;
  std::int64_t window_left, window_right;
  double softcap;
};

// Awkward on purpose: lengths that are not tile multiples, seqlen_q != seqlen_k both
// ways (bottom-right causal leaves the first rows of a tall problem fully masked),
// GQA and MQA, head dims that are not powers of two, empty problems.
const std::vector<Case>& cases() {
  constexpr DType f32 = DType::float32, f16 = DType::float16, bf16 = DType::bfloat16;
  static const std::vector<Case> list = {
      // quick dtype   b    sq   sk  h hkv    d  causal   wl  wr softcap
      {true, f32, 1, 1, 1, 1, 1, 64, false, -1, -1, 0.0},
      {true, f32, 2, 17, 17, 4, 4, 40, true, -1, -1, 0.0},
      {true, bf16, 1, 113, 113, 2, 2, 64, false, -1, -1, 0.0},
      {true, f16, 2, 17, 113, 4, 2, 64, true, -1, -1, 0.0},
      {true, f32, 2, 113, 17, 4, 1, 128, true, -1, -1, 0.0},
      {true, f16, 1, 113, 113, 8, 1, 64, true, 16, 0, 0.0},
      {true, f32, 2, 64, 64, 2, 2, 128, false, -1, -1, 2.0},
      {true, f32, 2, 0, 17, 2, 2, 64, false, -1, -1, 0.0},
      {true, f32, 2, 17, 0, 2, 2, 64, true, -1, -1, 0.0},
      {false, bf16, 1, 97, 129, 4, 2, 40, false, 8, 8, 0.0},
      {false, f16, 1, 1, 113, 8, 1, 128, true, -1, -1, 0.0},
      {false, bf16, 1, 128, 128, 2, 2, 256, true, -1, -1, 0.0},
      {false, f16, 1, 129, 127, 2, 2, 64, false, -1, -1, 0.0},
      {false, bf16, 3, 113, 113, 4, 2, 64, true, -1, -1, 5.0},
      {false, f32, 0, 17, 17, 2, 2, 64, false, -1, -1, 0.0},
      {false, f32, 1, 203, 203, 2, 2, 72, false, 32, -1, 0.0},
      {false, f16, 2, 113, 113, 4, 4, 128, false, -1, -1, 0.0},
  };
  return list;
}

std::string case_text(const Problem& p) {
  char text[160];
  std::snprintf(text, sizeof text, "%-8s b%lld q%lld k%lld h%lld/%lld d%lld %s", dtype_name(p.dtype),
                static_cast<long long>(p.batch), static_cast<long long>(p.seqlen_q), static_cast<long long>(p.seqlen_k),
                static_cast<long long>(p.heads), static_cast<long long>(p.heads_kv), static_cast<long long>(p.head_dim),
                p.mask_text().c_str());
  return text;
}

bool float32_unsupported(Problem p) {
  p.batch = p.seqlen_q = p.seqlen_k = 1;
  Workload probe(p, 0, /*with_backward=*/false);
  return why_unsupported(probe.forward_args()).find("unsupported dtype") != std::string::npos;
}

struct Tally {
  int passed = 0, failed = 0, skipped = 0;
};

void report(const char* verdict, const std::string& what, const std::string& detail) {
  std::printf("%-5s %-66s %s\n", verdict, what.c_str(), detail.c_str());
  std::fflush(stdout);
}

// One case, one pass: skipped if not supported, run, then compared with the reference.
void check_case(const Problem& p, std::uint64_t seed, bool is_backward, Tally& tally) {
  const std::string what = case_text(p) + "  " + algorithm_name(p.algorithm) + (is_backward ? " bwd" : " fwd");
  Workload workload(p, seed, /*with_backward=*/is_backward);
  const std::string reason = why_unsupported(workload.forward_args());
  if (!reason.empty()) {
    ++tally.skipped;
    report("SKIP", what, reason);
    return;
  }
  try {
    if (is_backward) {
      workload.run_backward();
    } else {
      workload.run_forward();
    }
  } catch (const Error& e) {  // advertised as supported (why_unsupported was empty) but did not run
    ++tally.failed;
    report("FAIL", what, e.what());
    return;
  }
  workload.download_outputs();
  bool ok = false;
  std::string detail;
  if (is_backward) {
    const BackwardAccuracy a = check_backward(workload);
    ok = a.passed();
    detail = "dq " + a.dq.summary() + "  dk " + a.dk.summary() + "  dv " + a.dv.summary();
  } else {
    const ForwardAccuracy a = check_forward(workload);
    ok = a.passed();
    detail = "out " + a.out.summary() + "  lse " + a.lse.summary();
  }
  ++(ok ? tally.passed : tally.failed);
  report(ok ? "PASS" : "FAIL", what, detail);
}

}  // namespace

void add_check_command(CLI::App& app, CheckOptions& o) {
  CLI::App* check = app.add_subcommand("check", "Correctness sweep over awkward problems against the float64 reference");
  check->add_option("--device", o.device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  check->add_option("--algorithm", o.algorithm, "only this algorithm (default: cpu flash2 and flash1, cuda automatic)")
      ->check(CLI::IsMember({"automatic", "flash2", "flash3", "flash1"}));
  check->add_flag("--backward", o.backward, "check the gradients too");
  check->add_flag("--quick", o.quick, "a smaller sweep (seconds on a CPU)");
  check->add_option("--threads", o.threads, "CPU threads (0 = all)")->check(integer_at_least(0));
  check->add_option("--seed", o.seed, "random seed of the inputs")->capture_default_str();
}

int check_command(const CheckOptions& o) {
  const Device device = resolve_device(o.device);
  std::vector<Algorithm> algorithms;
  if (!o.algorithm.empty())
    algorithms = {parse_algorithm(o.algorithm)};
  else if (device.type == DeviceType::cpu)
    algorithms = {Algorithm::flash2, Algorithm::flash1};
  else
    algorithms = {Algorithm::automatic};
  std::printf("flashattn check on %s: tolerance max|out - ref64| <= 2 x max|naive_lowprec - ref64| + floor (3x for gradients)\n",
              to_string(device).c_str());

  Tally tally;
  std::uint64_t seed = o.seed;
  for (const Case& c : cases()) {
    if (o.quick && !c.is_quick) continue;
    Problem p;
    p.device = device;
    p.dtype = c.dtype;
    p.batch = c.batch, p.seqlen_q = c.seqlen_q, p.seqlen_k = c.seqlen_k;
    p.heads = c.heads, p.heads_kv = c.heads_kv, p.head_dim = c.head_dim;
    p.causal = c.causal, p.window_left = c.window_left, p.window_right = c.window_right, p.softcap = c.softcap;
    p.threads = o.threads;
    // A backend without float32 (the GPU computes from 16-bit inputs) still gets the
    // case's shape and mask, in float16, rather than a skip.
    if (p.dtype == DType::float32 && float32_unsupported(p)) p.dtype = DType::float16;
    ++seed;
    for (Algorithm algorithm : algorithms) {
      p.algorithm = algorithm;
      check_case(p, seed, /*is_backward=*/false, tally);
    }
    if (o.backward) {
      p.algorithm = Algorithm::automatic;
      check_case(p, seed, /*is_backward=*/true, tally);
    }
  }
  std::printf("%d passed, %d failed, %d skipped\n", tally.passed, tally.failed, tally.skipped);
  return tally.failed == 0 && tally.passed > 0 ? 0 : 1;
}

}  // namespace flashattn::tools
