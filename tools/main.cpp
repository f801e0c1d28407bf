// tools/main.cpp — the `flashattn` command-line tool.
//
//   flashattn run     attention on a default problem, timed and spot-checked
//   flashattn bench   a sweep over sequence lengths, table + CSV/JSON
//   flashattn check   a correctness sweep over awkward problems
//
// Exit codes: 0 success, 1 a correctness check failed, 2 bad arguments (from the
// command line or rejected by the library), 3 any other failure (e.g. CUDA errors).
#include <cstdio>
#include <exception>
#include <stdexcept>

#include <CLI/CLI.hpp>

#include "flashattn/error.hpp"
#include "tools/commands.hpp"

int main(int argc, char** argv) {
  using namespace flashattn::tools;
  CLI::App app{"flashattn: exact, IO-aware attention (FlashAttention) on the CPU and the GPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "flashattn 0.1.0");
  RunOptions run_options;
  BenchOptions bench_options;
  CheckOptions check_options;
  add_run_command(app, run_options);
  add_bench_command(app, bench_options);
  add_check_command(app, check_options);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (app.got_subcommand("run")) return run_command(run_options);
    if (app.got_subcommand("bench")) return bench_command(bench_options);
    return check_command(check_options);
  } catch (const std::invalid_argument& e) {  // includes flashattn::Error and NotSupported
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
}
