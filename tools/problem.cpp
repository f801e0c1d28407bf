// tools/problem.cpp — see problem.hpp.
#include "tools/problem.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <omp.h>

#include "flashattn/mask.hpp"

namespace flashattn::tools {

AttentionOptions Problem::options() const {
  AttentionOptions o;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.softcap = softcap;
  o.algorithm = algorithm;
  return o;
}

std::string Problem::shape_text() const {
  std::ostringstream s;
  s << "q [" << batch << ", " << seqlen_q << ", " << heads << ", " << head_dim << "]  k/v [" << batch << ", "
    << seqlen_k << ", " << heads_kv << ", " << head_dim << "]";
  return s.str();
}

std::string Problem::mask_text() const {
  std::ostringstream s;
  if (causal) s << "causal";
  if (window_left >= 0 || window_right >= 0) s << (causal ? ", " : "") << "window (" << window_left << ", " << window_right << ")";
  if (s.tellp() == 0) s << "full";
  if (softcap > 0.0) s << ", softcap " << softcap;
  return s.str();
}

double Problem::forward_flops() const {
  const MaskRule rule{seqlen_q, seqlen_k, window_left, causal ? 0 : window_right};
  double pairs = 0.0;
  if (rule.is_unmasked()) {
    pairs = static_cast<double>(seqlen_q) * static_cast<double>(seqlen_k);
  } else {
    for (std::int64_t i = 0; i < seqlen_q; ++i) pairs += static_cast<double>(std::max<std::int64_t>(0, rule.col_end(i) - rule.col_begin(i)));
  }
  return 4.0 * static_cast<double>(batch) * static_cast<double>(heads) * pairs * static_cast<double>(head_dim);
}

int Problem::effective_threads() const {
  if (device.type != DeviceType::cpu) return 0;
  return threads > 0 ? threads : omp_get_max_threads();
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string ordinal = text.substr(5);
    if (!ordinal.empty() && std::all_of(ordinal.begin(), ordinal.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return Device::cuda(std::stoi(ordinal));
  }
  throw std::invalid_argument("--device: expected cpu, cuda, cuda:N or auto, got '" + text + "'");
}

Device resolve_device(const std::string& text) {
  if (text == "auto") return cuda_available() ? Device::cuda(0) : Device::cpu();
  const Device device = parse_device(text);
  if (device.type == DeviceType::cuda && !cuda_available())
    throw std::invalid_argument("--device: " + text + " requested, but this build has no CUDA backend or no GPU is present");
  return device;
}

DType parse_dtype(const std::string& text) {
  if (text == "float32" || text == "fp32") return DType::float32;
  if (text == "float16" || text == "fp16" || text == "half") return DType::float16;
  if (text == "bfloat16" || text == "bf16") return DType::bfloat16;
  throw std::invalid_argument("--dtype: expected float32, float16 or bfloat16, got '" + text + "'");
}

DType resolve_dtype(const std::string& text, Device device) {
  if (text == "auto") return device.type == DeviceType::cuda ? DType::float16 : DType::float32;
  return parse_dtype(text);
}

Algorithm parse_algorithm(const std::string& text) {
  for (Algorithm a : {Algorithm::automatic, Algorithm::reference, Algorithm::flash2, Algorithm::flash1, Algorithm::flash3})
    if (text == algorithm_name(a)) return a;
  throw std::invalid_argument("--algorithm: expected automatic, flash2, flash3, flash1 or reference, got '" + text + "'");
}

std::vector<std::int64_t> parse_int_list(const std::string& text) {
  std::vector<std::int64_t> values;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    std::size_t used = 0;
    std::int64_t value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size()) throw std::invalid_argument("expected a comma-separated list of integers, got '" + text + "'");
    values.push_back(value);
  }
  if (values.empty()) throw std::invalid_argument("expected a comma-separated list of integers, got '" + text + "'");
  return values;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace flashattn::tools
