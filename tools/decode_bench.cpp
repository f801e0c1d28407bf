// tools/decode_bench.cpp — `flashattn bench --decode`: decoding with a KV cache
// (flashattn::forward_with_kvcache, issue 6). Each --seqlens value is a cache length;
// one new query token per sequence attends to the whole cache (GQA from --heads and
// --heads-kv), contiguous or paged (--page-size, pages in a shuffled order as an
// allocator hands them out after a while). Decoding reads every cached key and value
// once per step, so the figure of merit is bandwidth = bytes of K and V read / time.
//
// On the GPU the caches rotate among kGpuSets sets so a timed call does not find its
// K/V in the 50 MB L2 of an H100 (the method of bench/gpu/decode_bench.cu and
// shared/BENCHMARKS.md), and the time is the median over rounds of back-to-back calls.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashattn/kvcache.hpp"
#include "tools/commands.hpp"
#include "tools/device_buffer.hpp"
#include "tools/workload.hpp"

namespace flashattn::tools {
namespace {

constexpr int kGpuSets = 4;        // caches rotated on the GPU (4 x the bytes of one step >> L2)
constexpr int kCallsPerRound = 16;  // a multiple of kGpuSets
constexpr std::int64_t kPatternElements = 1 << 20;

struct DecodeRow {
  Problem problem;  // seqlen_k = cache length, seqlen_q = 1
  std::int64_t page_size;
  int num_splits;
  double time_ms;
  double bandwidth;  // bytes of K and V read per second
};

// Random N(0, 1) values, never zeros: a 1M-element random pattern tiled over the
// tensor (random per element would take longer to generate than the benchmark runs).
void fill_tiled_random(HostTensor& t, std::uint64_t seed) {
  HostTensor pattern(t.dtype(), {std::min<std::int64_t>(t.numel(), kPatternElements)});
  pattern.fill_random(seed);
  const std::size_t element = dtype_size(t.dtype()), total = static_cast<std::size_t>(t.numel()) * element;
  auto* dst = static_cast<unsigned char*>(t.data());
  const std::size_t chunk = static_cast<std::size_t>(pattern.numel()) * element;
  for (std::size_t offset = 0; offset < total; offset += chunk)
    std::memcpy(dst + offset, pattern.data(), std::min(chunk, total - offset));
}

// The buffers of one (problem, page size): q/out/LSE, cache lengths, K/V caches and
// block tables (one set on the CPU, kGpuSets on the GPU), the split workspace.
class DecodeWorkload {
 public:
  DecodeWorkload(const Problem& p, std::int64_t page_size, int num_splits, std::uint64_t seed)
      : problem_(p), page_size_(page_size), num_splits_(num_splits) {
    const std::int64_t b = p.batch, kv = p.seqlen_k;
    pages_per_sequence_ = page_size > 0 ? (kv + page_size - 1) / page_size : 0;
    cache_rows_ = page_size > 0 ? b * pages_per_sequence_ : b;
    cache_row_length_ = page_size > 0 ? page_size : kv;
    q_ = HostTensor(p.dtype, {b, 1, p.heads, p.head_dim});
    q_.fill_random(seed);
    out_ = HostTensor(p.dtype, {b, 1, p.heads, p.head_dim});
    lse_ = HostTensor(DType::float32, {b, p.heads, 1});
    seqlens_ = HostTensor(DType::int32, {b});
    for (std::int64_t i = 0; i < b; ++i) static_cast<std::int32_t*>(seqlens_.data())[i] = static_cast<std::int32_t>(kv);
    k_ = HostTensor(p.dtype, {cache_rows_, cache_row_length_, p.heads_kv, p.head_dim});
    v_ = HostTensor(p.dtype, {cache_rows_, cache_row_length_, p.heads_kv, p.head_dim});
    fill_tiled_random(k_, seed + 1);
    fill_tiled_random(v_, seed + 2);
    std::mt19937_64 rng(seed + 3);
    for (int s = 0; s < sets(); ++s) {
      HostTensor table(DType::int32, {b, pages_per_sequence_});
      auto* entries = static_cast<std::int32_t*>(table.data());
      std::iota(entries, entries + table.numel(), 0);
      std::shuffle(entries, entries + table.numel(), rng);
      tables_.push_back(std::move(table));
    }
    if (!on_gpu()) return;
    q_gpu_ = upload(q_);
    out_gpu_ = DeviceBuffer(host_bytes(out_));
    lse_gpu_ = DeviceBuffer(host_bytes(lse_));
    seqlens_gpu_ = upload(seqlens_);
    for (int s = 0; s < sets(); ++s) {
      k_gpu_.push_back(upload(k_));
      v_gpu_.push_back(upload(v_));
      tables_gpu_.push_back(upload(tables_[static_cast<std::size_t>(s)]));
    }
    const std::size_t workspace_bytes = kvcache_workspace_bytes(args(0));
    workspace_gpu_ = DeviceBuffer(workspace_bytes ? workspace_bytes : 16);
    has_workspace_ = workspace_bytes > 0;
  }

  int sets() const { return on_gpu() ? kGpuSets : 1; }
  int resolved_splits() { return kvcache_num_splits(args(0)); }

  KVCacheArgs args(int set) {
    const auto s = static_cast<std::size_t>(set);
    KVCacheArgs a;
    a.q = view(q_, on_gpu() ? q_gpu_.data() : q_.data());
    a.k_cache = view(k_, on_gpu() ? k_gpu_[s].data() : k_.data());
    a.v_cache = view(v_, on_gpu() ? v_gpu_[s].data() : v_.data());
    a.maybe_cache_seqlens = view(seqlens_, on_gpu() ? seqlens_gpu_.data() : seqlens_.data());
    if (page_size_ > 0) a.maybe_block_table = view(tables_[s], on_gpu() ? tables_gpu_[s].data() : tables_[s].data());
    a.out = view(out_, on_gpu() ? out_gpu_.data() : out_.data());
    a.maybe_lse = view(lse_, on_gpu() ? lse_gpu_.data() : lse_.data());
    a.num_splits = num_splits_;
    if (on_gpu() && has_workspace_)
      a.maybe_workspace = TensorView::contiguous(workspace_gpu_.data(), DType::uint8,
                                                 {static_cast<std::int64_t>(workspace_gpu_.bytes())}, problem_.device);
    a.options = problem_.options();
    return a;
  }

  // Median time of one call in milliseconds, outputs poisoned first and checked after.
  double time_ms(int warmup, int repeats) {
    ExecutionContext context;
    context.num_threads = problem_.threads;
    for (int i = 0; i < warmup; ++i) forward_with_kvcache(args(i % sets()), context);
    poison_outputs();
    std::vector<double> times;
    if (on_gpu()) {
      EventTimer timer;
      const int rounds = std::max(5, repeats / 4);
      for (int r = 0; r < rounds; ++r) {
        timer.start();
        for (int i = 0; i < kCallsPerRound; ++i) forward_with_kvcache(args(i % sets()), context);
        times.push_back(timer.stop_ms() / kCallsPerRound);
      }
    } else {
      for (int i = 0; i < repeats; ++i) {
        const auto start = std::chrono::steady_clock::now();
        forward_with_kvcache(args(0), context);
        times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
    }
    check_outputs_written();
    return median(times);
  }

  // Bytes of K and V one call reads: every cached row of every sequence, each kv head once.
  double bytes_read() const {
    const Problem& p = problem_;
    return 2.0 * static_cast<double>(p.batch * p.seqlen_k * p.heads_kv * p.head_dim) * static_cast<double>(dtype_size(p.dtype));
  }

 private:
  bool on_gpu() const { return problem_.device.type == DeviceType::cuda; }
  static std::size_t host_bytes(const HostTensor& t) { return static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()); }
  static DeviceBuffer upload(const HostTensor& t) {
    DeviceBuffer buffer(host_bytes(t));
    buffer.upload(t.data(), host_bytes(t));
    return buffer;
  }
  TensorView view(HostTensor& t, void* data) const {
    TensorView v = t.view();
    v.data = data;
    v.device = on_gpu() ? problem_.device : Device::cpu();
    return v;
  }
  void poison_outputs() {
    if (on_gpu()) {
      out_gpu_.fill_bytes(0xFF);
      lse_gpu_.fill_bytes(0xFF);
    } else {
      std::memset(out_.data(), 0xFF, host_bytes(out_));
      std::memset(lse_.data(), 0xFF, host_bytes(lse_));
    }
  }
  // Every output element was written by the timed calls: none of the NaN poison is left.
  void check_outputs_written() {
    if (on_gpu()) out_gpu_.download(out_.data(), host_bytes(out_));
    for (std::int64_t i = 0; i < out_.numel(); ++i)
      if (!std::isfinite(out_.get(i))) throw std::runtime_error("bench --decode: output element " + std::to_string(i) + " not written (NaN)");
  }

  Problem problem_;
  std::int64_t page_size_ = 0, pages_per_sequence_ = 0, cache_rows_ = 0, cache_row_length_ = 0;
  int num_splits_ = 0;
  HostTensor q_, out_, lse_, seqlens_, k_, v_;
  std::vector<HostTensor> tables_;
  DeviceBuffer q_gpu_, out_gpu_, lse_gpu_, seqlens_gpu_, workspace_gpu_;
  std::vector<DeviceBuffer> k_gpu_, v_gpu_, tables_gpu_;
  bool has_workspace_ = false;
};

void write_csv(const std::string& path, const std::vector<DecodeRow>& rows) {
  std::ofstream file(path);
  if (!file) throw std::runtime_error("--csv: cannot open '" + path + "' for writing");
  file << "device,dtype,batch,heads,heads_kv,head_dim,kv_len,page_size,num_splits,pass,time_ms,bandwidth_gbps\n";
  for (const DecodeRow& r : rows) {
    const Problem& p = r.problem;
    file << to_string(p.device) << ',' << dtype_name(p.dtype) << ',' << p.batch << ',' << p.heads << ',' << p.heads_kv << ','
         << p.head_dim << ',' << p.seqlen_k << ',' << r.page_size << ',' << r.num_splits << ",decode," << r.time_ms << ','
         << r.bandwidth / 1e9 << '\n';
  }
  if (!file) throw std::runtime_error("--csv: failed writing '" + path + "'");
}

void write_json(const std::string& path, const std::vector<DecodeRow>& rows) {
  std::ofstream file(path);
  if (!file) throw std::runtime_error("--json: cannot open '" + path + "' for writing");
  file << "[\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const DecodeRow& r = rows[i];
    const Problem& p = r.problem;
    file << "  {\"device\": \"" << to_string(p.device) << "\", \"dtype\": \"" << dtype_name(p.dtype) << "\", \"batch\": " << p.batch
         << ", \"heads\": " << p.heads << ", \"heads_kv\": " << p.heads_kv << ", \"head_dim\": " << p.head_dim
         << ", \"kv_len\": " << p.seqlen_k << ", \"page_size\": " << r.page_size << ", \"num_splits\": " << r.num_splits
         << ", \"pass\": \"decode\", \"time_ms\": " << r.time_ms << ", \"bandwidth_gbps\": " << r.bandwidth / 1e9 << "}"
         << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  file << "]\n";
  if (!file) throw std::runtime_error("--json: failed writing '" + path + "'");
}

}  // namespace

int decode_bench_command(const BenchOptions& o) {
  std::vector<std::int64_t> lengths;
  try {
    lengths = parse_int_list(o.seqlens);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--seqlens: ") + e.what());
  }
  for (std::int64_t n : lengths)
    if (n < 0) throw std::invalid_argument("--seqlens: cache lengths must be >= 0, got " + std::to_string(n));
  if (o.page_size < 0) throw std::invalid_argument("--page-size: must be >= 0 (0 = contiguous cache), got " + std::to_string(o.page_size));
  const Problem first = [&] {
    Problem p = make_problem(o.problem, 1);
    p.seqlen_k = lengths.front();
    return p;
  }();
  const bool on_gpu = first.device.type == DeviceType::cuda;
  const std::string layout = o.page_size > 0 ? "paged " + std::to_string(o.page_size) : "contiguous";
  std::printf("flashattn bench --decode: %s, %s, batch %lld, %lld q heads / %lld kv heads, head_dim %lld, %s cache, one query token\n",
              device_text(first).c_str(), dtype_name(first.dtype), static_cast<long long>(first.batch),
              static_cast<long long>(first.heads), static_cast<long long>(first.heads_kv), static_cast<long long>(first.head_dim),
              layout.c_str());
  std::printf("%9s %7s %12s %10s\n", "kv_len", "splits", "time (us)", on_gpu ? "TB/s" : "GB/s");
  std::fflush(stdout);
  std::vector<DecodeRow> rows;
  for (std::int64_t length : lengths) {
    Problem p = make_problem(o.problem, 1);
    p.seqlen_k = length;
    DecodeWorkload workload(p, o.page_size, o.num_splits, o.seed);
    const double ms = workload.time_ms(warmup_runs(o.problem, p), timed_runs(o.problem, p));
    const double bandwidth = ms > 0.0 ? workload.bytes_read() / (ms * 1e-3) : 0.0;
    rows.push_back({p, o.page_size, workload.resolved_splits(), ms, bandwidth});
    std::printf("%9lld %7d %12.2f %10.2f\n", static_cast<long long>(length), rows.back().num_splits, ms * 1e3,
                bandwidth / (on_gpu ? 1e12 : 1e9));
    std::fflush(stdout);
  }
  if (!o.csv_path.empty()) write_csv(o.csv_path, rows);
  if (!o.json_path.empty()) write_json(o.json_path, rows);
  return 0;
}

}  // namespace flashattn::tools
