// tests/cuda/test_forward_fp8.cpp — the FP8 (e4m3) Hopper forward kernel
// (src/cuda/hopper_fp8), called directly through hopper_fp8::forward on hand-built
// AttentionParams, against a float64 reference on the dequantised inputs: every kernel
// head dim and padded ones, tile tails, seqlen_q != seqlen_k, causal, sliding window,
// softcap, ALiBi, GQA/MQA, varlen with empty sequences, seqlen_k = 0, descales per
// (batch, kv head) / one value through zero strides / none, bf16 and fp16 out.
//
// Inputs are e4m3 bytes (a host encoder below); the reference dequantises them
// (x = e4m3 value · descale) and computes softmax(scale · q k^T) v in double. The kernel's
// only rounding beyond fp32 is P's quantisation to e4m3 (P' = 2^8 · P rounded to nearest,
// 3 mantissa bits: relative error ≤ 2^-4, absolute ≤ 2^-18 in P units below the normal
// range) and the 16-bit output. The tolerance follows STYLE.md's rule with that
// low-precision reference: out_lowprec is the naive algorithm with P' rounded to e4m3 in
// double (the row's final max as the base; the kernel quantises against the running max,
// the same relative rounding), and
//   max|out − ref| ≤ 2 · max|out_lowprec − ref| + ε_out · max|ref| + 1e-5
//   rms(out − ref) ≤ 2 · rms(out_lowprec − ref) + ε_out · rms(ref) + 1e-6
// with ε_out the output type's unit roundoff (2^-8 bf16, 2^-11 fp16). A key-order or
// layout bug moves the output by O(|v|), far outside either. LSE (no quantisation in
// its path: fp32 scores, exact e4m3 products) within 1e-3 · (1 + |ref|); rows without
// keys give out 0 and LSE -inf exactly.
// Every test skips without a GPU or on devices other than compute capability 9.0.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "flashattn/mask.hpp"
#include "src/core/params.hpp"
#include "src/cuda/hopper_fp8/launch.hpp"

namespace flashattn::testing {
namespace {

// ---- e4m3 on the host (OCP FP8 E4M3: bias 7, no infinities, 0x7F/0xFF NaN, max 448) ----

double e4m3_to_double(std::uint8_t bits) {
  const int sign = bits >> 7;
  const int exponent = (bits >> 3) & 0xF;
  const int mantissa = bits & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

// The finite non-negative e4m3 values, increasing with their bits 0x00..0x7E.
const std::vector<double>& e4m3_magnitudes() {
  static const std::vector<double> values = [] {
    std::vector<double> table;
    for (int bits = 0; bits <= 0x7E; ++bits) table.push_back(e4m3_to_double(static_cast<std::uint8_t>(bits)));
    return table;
  }();
  return values;
}

// Round to nearest e4m3, ties to even, saturating at ±448 (as cvt.rn.satfinite).
std::uint8_t e4m3_from_double(double x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double magnitude = std::fabs(x);
  const std::vector<double>& table = e4m3_magnitudes();
  if (magnitude >= table.back()) return static_cast<std::uint8_t>(sign | 0x7E);
  const auto above = std::lower_bound(table.begin(), table.end(), magnitude);  // first >= magnitude
  int bits = static_cast<int>(above - table.begin());
  if (*above != magnitude && bits > 0) {
    const double error_above = *above - magnitude, error_below = magnitude - table[bits - 1];
    if (error_below < error_above || (error_below == error_above && ((bits - 1) & 1) == 0)) bits -= 1;
  }
  return static_cast<std::uint8_t>(sign | bits);
}

double round_to_e4m3(double x) { return e4m3_to_double(e4m3_from_double(x)); }

int device_capability() {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

void check(cudaError_t code, const char* what) {
  if (code != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(code));
}

template <class T>
T* upload(const std::vector<T>& host) {
  T* device = nullptr;
  check(cudaMalloc(&device, std::max<std::size_t>(host.size(), 1) * sizeof(T)), "cudaMalloc");
  if (!host.empty()) check(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return device;
}

struct Fp8Case {
  std::int64_t batch = 1, seqlen_q = 128, seqlen_k = 128, heads_q = 2, heads_kv = 2, head_dim = 128;
  bool is_causal = false;
  std::int64_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool with_alibi = false;     // slopes 2^(-8 (h + 1) / heads_q), one per head (batch stride 0)
  float softmax_scale = 0.0f;  // 0: 1/sqrt(head_dim)
  DType out_dtype = DType::bfloat16;
  // Varlen: per-sequence lengths (batch = their count; seqlen_* = the maxima).
  std::vector<std::int32_t> varlen_q, varlen_k;
  // Descales: 0 none (null), 1 per (batch, kv head), 2 one value with zero strides.
  int descale_kind = 1;
  bool with_lse = true;
  double input_scale = 1.0;  // inputs drawn from N(0, input_scale^2) before quantising
  std::uint64_t seed = 1;
  // The kernel's schedule (hopper_fp8/tile_config.hpp), named explicitly: the suites run
  // every case under each (the public-API cases run the process default).
  cuda::hopper_fp8::Fp8Schedule schedule = cuda::hopper_fp8::Fp8Schedule::transpose_copy;
  // When the overlap kernel rescales O (the other kernels ignore it).
  cuda::hopper_fp8::Fp8Rescale rescale = cuda::hopper_fp8::Fp8Rescale::every_block;

  std::string describe() const {
    std::string text = "b" + std::to_string(batch) + " sq" + std::to_string(seqlen_q) + " sk" +
                       std::to_string(seqlen_k) + " hq" + std::to_string(heads_q) + " hkv" +
                       std::to_string(heads_kv) + " d" + std::to_string(head_dim);
    if (is_causal) text += " causal";
    if (window_left >= 0 || window_right >= 0)
      text += " window(" + std::to_string(window_left) + "," + std::to_string(window_right) + ")";
    if (softcap > 0) text += " softcap" + std::to_string(softcap);
    if (with_alibi) text += " alibi";
    if (!varlen_q.empty()) text += " varlen";
    text += out_dtype == DType::bfloat16 ? " bf16" : " fp16";
    text += " descale" + std::to_string(descale_kind);
    text += std::string(" schedule ") + cuda::hopper_fp8::fp8_schedule_name(schedule);
    if (rescale != cuda::hopper_fp8::Fp8Rescale::every_block)
      text += std::string(" rescale ") + cuda::hopper_fp8::fp8_rescale_name(rescale);
    return text;
  }
};

struct Fp8Result {
  std::vector<float> out;  // dense: (b, row, h, d); varlen: (row, h, d)
  std::vector<float> lse;  // dense: (b, h, row); varlen: (h, row)
};

float half_bits_to_float(std::uint16_t bits, DType dtype) {
  if (dtype == DType::bfloat16) {
    const std::uint32_t word = static_cast<std::uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &word, 4);
    return value;
  }
  // IEEE half.
  const int sign = bits >> 15, exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else if (exponent == 0x1F) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    magnitude = std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  }
  return static_cast<float>(sign ? -magnitude : magnitude);
}

class Fp8Problem {
 public:
  explicit Fp8Problem(const Fp8Case& c) : c_(c) {
    is_varlen_ = !c.varlen_q.empty();
    if (is_varlen_) {
      cu_q_.push_back(0);
      cu_k_.push_back(0);
      for (std::size_t i = 0; i < c.varlen_q.size(); ++i) {
        cu_q_.push_back(cu_q_.back() + c.varlen_q[i]);
        cu_k_.push_back(cu_k_.back() + c.varlen_k[i]);
      }
      rows_q_ = cu_q_.back();
      rows_k_ = cu_k_.back();
    } else {
      rows_q_ = c.batch * c.seqlen_q;
      rows_k_ = c.batch * c.seqlen_k;
    }
    std::mt19937_64 generator(c.seed);
    std::normal_distribution<double> normal(0.0, c.input_scale);
    auto fill = [&](std::vector<std::uint8_t>& bytes, std::int64_t count) {
      bytes.resize(static_cast<std::size_t>(count));
      for (auto& byte : bytes) byte = e4m3_from_double(normal(generator));
    };
    fill(q_, rows_q_ * c.heads_q * c.head_dim);
    fill(k_, rows_k_ * c.heads_kv * c.head_dim);
    fill(v_, rows_k_ * c.heads_kv * c.head_dim);
    auto decode = [](const std::vector<std::uint8_t>& bytes) {
      std::vector<double> values(bytes.size());
      for (std::size_t i = 0; i < bytes.size(); ++i) values[i] = e4m3_to_double(bytes[i]);
      return values;
    };
    q_values_ = decode(q_);
    k_values_ = decode(k_);
    v_values_ = decode(v_);
    std::uniform_real_distribution<double> uniform(0.5, 2.0);
    auto fill_descale = [&](std::vector<float>& descale) {
      descale.resize(static_cast<std::size_t>(c.batch * c.heads_kv));
      for (auto& value : descale) value = static_cast<float>(uniform(generator));
    };
    fill_descale(q_descale_);
    fill_descale(k_descale_);
    fill_descale(v_descale_);
    for (std::int64_t h = 0; h < c.heads_q; ++h)
      alibi_slopes_.push_back(std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(c.heads_q)));
  }

  std::int64_t batch() const { return c_.batch; }
  std::int64_t q_start(std::int64_t b) const { return is_varlen_ ? cu_q_[b] : b * c_.seqlen_q; }
  std::int64_t k_start(std::int64_t b) const { return is_varlen_ ? cu_k_[b] : b * c_.seqlen_k; }
  std::int64_t seqlen_q_of(std::int64_t b) const { return is_varlen_ ? cu_q_[b + 1] - cu_q_[b] : c_.seqlen_q; }
  std::int64_t seqlen_k_of(std::int64_t b) const { return is_varlen_ ? cu_k_[b + 1] - cu_k_[b] : c_.seqlen_k; }
  float softmax_scale() const {
    return c_.softmax_scale > 0 ? c_.softmax_scale : static_cast<float>(1.0 / std::sqrt(double(c_.head_dim)));
  }
  // Descale of (b, kv head) as the kernel reads it.
  double descale(const std::vector<float>& values, std::int64_t b, std::int64_t h_kv) const {
    if (c_.descale_kind == 0) return 1.0;
    if (c_.descale_kind == 2) return values[0];
    return values[static_cast<std::size_t>(b * c_.heads_kv + h_kv)];
  }

  // The public API's arguments for the problem `params` describes, on the same buffers.
  ForwardArgs public_args(const AttentionParams& params, void* q, void* k, void* v, void* out, float* lse,
                          float* q_descale, float* k_descale, float* v_descale, float* alibi_slopes,
                          std::int32_t* cu_q, std::int32_t* cu_k) const {
    const Fp8Case& c = c_;
    const Device gpu{DeviceType::cuda, 0};
    ForwardArgs args;
    if (is_varlen_) {
      args.q = TensorView::contiguous(q, DType::float8_e4m3, {rows_q_, c.heads_q, c.head_dim}, gpu);
      args.k = TensorView::contiguous(k, DType::float8_e4m3, {rows_k_, c.heads_kv, c.head_dim}, gpu);
      args.v = TensorView::contiguous(v, DType::float8_e4m3, {rows_k_, c.heads_kv, c.head_dim}, gpu);
      args.out = TensorView::contiguous(out, c.out_dtype, {rows_q_, c.heads_q, c.head_dim}, gpu);
      if (c.with_lse) args.maybe_lse = TensorView::contiguous(lse, DType::float32, {c.heads_q, rows_q_}, gpu);
      VarlenArgs varlen;
      varlen.cu_seqlens_q = TensorView::contiguous(cu_q, DType::int32, {c.batch + 1}, gpu);
      varlen.cu_seqlens_k = TensorView::contiguous(cu_k, DType::int32, {c.batch + 1}, gpu);
      varlen.max_seqlen_q = c.seqlen_q;
      varlen.max_seqlen_k = c.seqlen_k;
      args.maybe_varlen = varlen;
    } else {
      args.q = TensorView::contiguous(q, DType::float8_e4m3, {c.batch, c.seqlen_q, c.heads_q, c.head_dim}, gpu);
      args.k = TensorView::contiguous(k, DType::float8_e4m3, {c.batch, c.seqlen_k, c.heads_kv, c.head_dim}, gpu);
      args.v = TensorView::contiguous(v, DType::float8_e4m3, {c.batch, c.seqlen_k, c.heads_kv, c.head_dim}, gpu);
      args.out = TensorView::contiguous(out, c.out_dtype, {c.batch, c.seqlen_q, c.heads_q, c.head_dim}, gpu);
      if (c.with_lse)
        args.maybe_lse = TensorView::contiguous(lse, DType::float32, {c.batch, c.heads_q, c.seqlen_q}, gpu);
    }
    AttentionOptions& options = args.options;
    options.softmax_scale = params.softmax_scale;
    options.causal = c.is_causal;
    options.window_left = c.window_left;
    options.window_right = c.window_right;
    options.softcap = c.softcap;
    if (c.with_alibi) options.maybe_alibi_slopes = TensorView::contiguous(alibi_slopes, DType::float32, {c.heads_q}, gpu);
    if (c.descale_kind != 0) {
      const std::int64_t row_stride = c.descale_kind == 2 ? 0 : c.heads_kv, column_stride = c.descale_kind == 2 ? 0 : 1;
      auto descale_view = [&](float* data) {
        return TensorView::strided(data, DType::float32, {c.batch, c.heads_kv}, {row_stride, column_stride}, gpu);
      };
      options.maybe_q_descale = descale_view(q_descale);
      options.maybe_k_descale = descale_view(k_descale);
      options.maybe_v_descale = descale_view(v_descale);
    }
    return args;
  }

  // through_public_api: flashattn::forward with TensorViews of the same buffers
  // (validation, backend choice, forward_fp8) instead of the kernel's own entry.
  Fp8Result run_on_device(bool through_public_api = false) const {
    const Fp8Case& c = c_;
    std::uint8_t* q = upload(q_);
    std::uint8_t* k = upload(k_);
    std::uint8_t* v = upload(v_);
    float* q_descale = upload(q_descale_);
    float* k_descale = upload(k_descale_);
    float* v_descale = upload(v_descale_);
    float* alibi_slopes = upload(alibi_slopes_);
    std::int32_t* cu_q = is_varlen_ ? upload(cu_q_) : nullptr;
    std::int32_t* cu_k = is_varlen_ ? upload(cu_k_) : nullptr;
    const std::int64_t out_elements = rows_q_ * c.heads_q * c.head_dim;
    const std::int64_t lse_elements = rows_q_ * c.heads_q;
    std::uint16_t* out = nullptr;
    float* lse = nullptr;
    check(cudaMalloc(&out, std::max<std::int64_t>(out_elements, 1) * 2), "cudaMalloc out");
    check(cudaMalloc(&lse, std::max<std::int64_t>(lse_elements, 1) * 4), "cudaMalloc lse");
    // Canary: NaN everywhere (0xFFFF is a NaN in both 16-bit types and in float32 pairs).
    check(cudaMemset(out, 0xFF, std::max<std::int64_t>(out_elements, 1) * 2), "poison out");
    check(cudaMemset(lse, 0xFF, std::max<std::int64_t>(lse_elements, 1) * 4), "poison lse");

    AttentionParams params;
    params.dtype = c.out_dtype;
    params.input_dtype = DType::float8_e4m3;
    params.device = Device{DeviceType::cuda, 0};
    params.q = q;
    params.k = k;
    params.v = v;
    params.out = out;
    params.maybe_lse = c.with_lse ? lse : nullptr;
    params.batch = c.batch;
    params.seqlen_q = c.seqlen_q;
    params.seqlen_k = c.seqlen_k;
    params.heads_q = c.heads_q;
    params.heads_kv = c.heads_kv;
    params.head_dim = c.head_dim;
    params.group_size = c.heads_q / c.heads_kv;
    params.q_row_stride = c.heads_q * c.head_dim;
    params.q_head_stride = c.head_dim;
    params.k_row_stride = params.v_row_stride = c.heads_kv * c.head_dim;
    params.k_head_stride = params.v_head_stride = c.head_dim;
    params.out_row_stride = c.heads_q * c.head_dim;
    params.out_head_stride = c.head_dim;
    params.total_q = rows_q_;
    params.total_k = rows_k_;
    if (is_varlen_) {
      params.maybe_cu_seqlens_q = cu_q;
      params.maybe_cu_seqlens_k = cu_k;
      params.lse_head_stride = rows_q_;
      params.lse_row_stride = 1;
    } else {
      params.q_batch_stride = c.seqlen_q * params.q_row_stride;
      params.k_batch_stride = params.v_batch_stride = c.seqlen_k * params.k_row_stride;
      params.out_batch_stride = c.seqlen_q * params.out_row_stride;
      params.lse_batch_stride = c.heads_q * c.seqlen_q;
      params.lse_head_stride = c.seqlen_q;
      params.lse_row_stride = 1;
    }
    params.softmax_scale = softmax_scale();
    params.softmax_scale_log2 = static_cast<float>(params.softmax_scale * 1.4426950408889634);
    params.softcap = c.softcap;
    if (c.with_alibi) params.maybe_alibi_slopes = alibi_slopes;
    params.is_causal = c.is_causal;
    params.window_left = c.window_left;
    params.window_right = c.is_causal ? 0 : c.window_right;
    if (c.descale_kind != 0) {
      params.maybe_q_descale = q_descale;
      params.maybe_k_descale = k_descale;
      params.maybe_v_descale = v_descale;
      const std::int64_t strides[2] = {c.descale_kind == 2 ? 0 : c.heads_kv, c.descale_kind == 2 ? 0 : 1};
      for (int i = 0; i < 2; ++i)
        params.q_descale_strides[i] = params.k_descale_strides[i] = params.v_descale_strides[i] = strides[i];
    }
    if (through_public_api) {
      flashattn::forward(public_args(params, q, k, v, out, lse, q_descale, k_descale, v_descale, alibi_slopes, cu_q, cu_k));
    } else {
      cuda::hopper_fp8::forward(params, nullptr, c.schedule, c.rescale);
    }
    check(cudaDeviceSynchronize(), "FP8 forward");
    check(cudaGetLastError(), "FP8 forward");

    std::vector<std::uint16_t> out_bits(static_cast<std::size_t>(out_elements));
    Fp8Result result;
    result.lse.resize(static_cast<std::size_t>(lse_elements));
    if (out_elements > 0)
      check(cudaMemcpy(out_bits.data(), out, out_elements * 2, cudaMemcpyDeviceToHost), "download out");
    if (lse_elements > 0)
      check(cudaMemcpy(result.lse.data(), lse, lse_elements * 4, cudaMemcpyDeviceToHost), "download lse");
    result.out.resize(out_bits.size());
    for (std::size_t i = 0; i < out_bits.size(); ++i) result.out[i] = half_bits_to_float(out_bits[i], c.out_dtype);
    for (void* pointer : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                          static_cast<void*>(q_descale), static_cast<void*>(k_descale), static_cast<void*>(v_descale),
                          static_cast<void*>(alibi_slopes),
                          static_cast<void*>(cu_q), static_cast<void*>(cu_k), static_cast<void*>(out),
                          static_cast<void*>(lse)})
      if (pointer != nullptr) cudaFree(pointer);
    return result;
  }

  // Compares the device result with the float64 reference (and the e4m3-P naive
  // algorithm as the low-precision yardstick).
  void expect_matches(const Fp8Result& result) const {
    const Fp8Case& c = c_;
    const std::int64_t d = c.head_dim;
    double max_error = 0, max_lowprec_error = 0, max_reference = 0;
    double sum_error2 = 0, sum_lowprec_error2 = 0, sum_reference2 = 0;
    std::int64_t count = 0, lse_failures = 0, empty_row_failures = 0, nan_count = 0;
    std::string first_lse_failure;
    std::vector<double> scores, reference(d), lowprec(d);
    for (std::int64_t b = 0; b < c.batch; ++b) {
      const std::int64_t seqlen_q = seqlen_q_of(b), seqlen_k = seqlen_k_of(b);
      const MaskRule mask{seqlen_q, seqlen_k, c.window_left, c.is_causal ? 0 : c.window_right};
      scores.assign(static_cast<std::size_t>(seqlen_k), 0.0);
      for (std::int64_t h = 0; h < c.heads_q; ++h) {
        const std::int64_t h_kv = h / (c.heads_q / c.heads_kv);
        const double q_scale = descale(q_descale_, b, h_kv), k_scale = descale(k_descale_, b, h_kv);
        const double v_scale = descale(v_descale_, b, h_kv);
        for (std::int64_t i = 0; i < seqlen_q; ++i) {
          const std::int64_t q_row = q_start(b) + i;
          const double* q_row_values = &q_values_[static_cast<std::size_t>((q_row * c.heads_q + h) * d)];
          // s_j = scale · (q_descale q) · (k_descale k_j), softcapped; the mask.
          double row_max = -std::numeric_limits<double>::infinity();
          const std::int64_t begin = std::max<std::int64_t>(mask.col_begin(i), 0);
          const std::int64_t end = std::min<std::int64_t>(mask.col_end(i), seqlen_k);
          for (std::int64_t j = begin; j < end; ++j) {
            const double* k_row_values = &k_values_[static_cast<std::size_t>(((k_start(b) + j) * c.heads_kv + h_kv) * d)];
            double dot = 0;
            for (std::int64_t x = 0; x < d; ++x) dot += q_row_values[x] * k_row_values[x];
            double score = softmax_scale() * q_scale * k_scale * dot;
            if (c.softcap > 0) score = c.softcap * std::tanh(score / c.softcap);
            // ALiBi: − slope · |i + (seqlen_k − seqlen_q) − j| (bottom-right aligned).
            if (c.with_alibi)
              score -= alibi_slopes_[static_cast<std::size_t>(h)] * std::fabs(double(i + seqlen_k - seqlen_q - j));
            scores[static_cast<std::size_t>(j)] = score;
            row_max = std::max(row_max, score);
          }
          const std::int64_t out_base = (q_row * c.heads_q + h) * d;
          const std::int64_t lse_index = is_varlen_ ? h * rows_q_ + q_row : (b * c.heads_q + h) * c.seqlen_q + i;
          if (end <= begin) {
            // No key: out 0 and LSE -inf exactly.
            for (std::int64_t x = 0; x < d; ++x)
              if (result.out[static_cast<std::size_t>(out_base + x)] != 0.0f) ++empty_row_failures;
            if (c.with_lse && !(std::isinf(result.lse[static_cast<std::size_t>(lse_index)]) &&
                                result.lse[static_cast<std::size_t>(lse_index)] < 0))
              ++empty_row_failures;
            continue;
          }
          double l = 0;
          std::fill(reference.begin(), reference.end(), 0.0);
          std::fill(lowprec.begin(), lowprec.end(), 0.0);
          for (std::int64_t j = begin; j < end; ++j) {
            const double p = std::exp(scores[static_cast<std::size_t>(j)] - row_max);
            // The kernel's P' = 2^8 p rounded to e4m3.
            const double p_quantised = round_to_e4m3(256.0 * p) / 256.0;
            l += p;
            const double* v_row_values = &v_values_[static_cast<std::size_t>(((k_start(b) + j) * c.heads_kv + h_kv) * d)];
            for (std::int64_t x = 0; x < d; ++x) {
              const double value = v_scale * v_row_values[x];
              reference[static_cast<std::size_t>(x)] += p * value;
              lowprec[static_cast<std::size_t>(x)] += p_quantised * value;
            }
          }
          for (std::int64_t x = 0; x < d; ++x) {
            const double expected = reference[static_cast<std::size_t>(x)] / l;
            const double got = result.out[static_cast<std::size_t>(out_base + x)];
            if (std::isnan(got)) ++nan_count;
            const double error = std::fabs(got - expected);
            const double lowprec_error = std::fabs(lowprec[static_cast<std::size_t>(x)] / l - expected);
            max_error = std::max(max_error, std::isnan(error) ? std::numeric_limits<double>::infinity() : error);
            max_lowprec_error = std::max(max_lowprec_error, lowprec_error);
            max_reference = std::max(max_reference, std::fabs(expected));
            sum_error2 += error * error;
            sum_lowprec_error2 += lowprec_error * lowprec_error;
            sum_reference2 += expected * expected;
            ++count;
          }
          if (c.with_lse) {
            const double expected_lse = row_max + std::log(l);
            const double got_lse = result.lse[static_cast<std::size_t>(lse_index)];
            if (!(std::fabs(got_lse - expected_lse) <= 1e-3 * (1.0 + std::fabs(expected_lse)))) {
              if (lse_failures++ == 0)
                first_lse_failure = "b" + std::to_string(b) + " h" + std::to_string(h) + " row" + std::to_string(i) +
                                    ": " + std::to_string(got_lse) + " vs " + std::to_string(expected_lse);
            }
          }
        }
      }
    }
    const double unit_roundoff = c.out_dtype == DType::bfloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    EXPECT_EQ(nan_count, 0) << c.describe();
    EXPECT_EQ(empty_row_failures, 0) << c.describe() << ": rows without keys must give out 0 and LSE -inf";
    EXPECT_EQ(lse_failures, 0) << c.describe() << ": first LSE mismatch " << first_lse_failure;
    if (count == 0) return;
    const double max_bound = 2 * max_lowprec_error + unit_roundoff * max_reference + 1e-5;
    EXPECT_LE(max_error, max_bound) << c.describe() << ": max error " << max_error << " (e4m3-P naive: "
                                    << max_lowprec_error << ", max |ref| " << max_reference << ")";
    const double rms_error = std::sqrt(sum_error2 / count), rms_lowprec = std::sqrt(sum_lowprec_error2 / count);
    const double rms_reference = std::sqrt(sum_reference2 / count);
    EXPECT_LE(rms_error, 2 * rms_lowprec + unit_roundoff * rms_reference + 1e-6)
        << c.describe() << ": rms error " << rms_error << " (e4m3-P naive: " << rms_lowprec << ", rms |ref| "
        << rms_reference << ")";
  }

 private:
  Fp8Case c_;
  bool is_varlen_ = false;
  std::vector<std::int32_t> cu_q_, cu_k_;
  std::int64_t rows_q_ = 0, rows_k_ = 0;
  std::vector<std::uint8_t> q_, k_, v_;
  std::vector<double> q_values_, k_values_, v_values_;  // the bytes dequantised (without descales)
  std::vector<float> q_descale_, k_descale_, v_descale_;
  std::vector<float> alibi_slopes_;
};

class HopperFp8Forward : public ::testing::TestWithParam<Fp8Case> {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      (void)cudaGetLastError();
      GTEST_SKIP() << "no CUDA device";
    }
    if (!cuda::hopper_fp8::is_built()) GTEST_SKIP() << "no FP8 Hopper kernel in this build (sm_90a not built)";
    if (device_capability() != 90) GTEST_SKIP() << "the FP8 Hopper kernel needs compute capability 9.0";
  }
};

TEST_P(HopperFp8Forward, MatchesFloat64ReferenceOnDequantisedInputs) {
  const Fp8Case& c = GetParam();
  if (cuda::hopper_fp8::kernel_head_dim_for(c.head_dim) == 0) GTEST_SKIP() << "head dim not built";
  const Fp8Problem problem(c);
  problem.expect_matches(problem.run_on_device());
}

// The public entry (flashattn::forward: validation, the backend's FP8 dispatch) on a few
// of the shapes above: dense and varlen, every descale form, masks, GQA, ALiBi, fp16 out.
class HopperFp8PublicApi : public HopperFp8Forward {};

TEST_P(HopperFp8PublicApi, MatchesFloat64ReferenceOnDequantisedInputs) {
  const Fp8Case& c = GetParam();
  if (cuda::hopper_fp8::kernel_head_dim_for(c.head_dim) == 0) GTEST_SKIP() << "head dim not built";
  const Fp8Problem problem(c);
  problem.expect_matches(problem.run_on_device(/*through_public_api=*/true));
}

std::vector<Fp8Case> fp8_cases() {
  std::vector<Fp8Case> cases;
  auto add = [&](Fp8Case c) {
    c.seed = cases.size() + 1;
    cases.push_back(c);
  };
  // Every kernel head dim and padded ones (head-dim tail zero-filled by TMA), tile tails
  // (block_m 128/192, block_n 128), seqlen_q != seqlen_k both ways, both output types.
  for (std::int64_t d : {64, 128, 256, 80, 96}) {
    for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{128, 128}, {1, 1}, {17, 97}, {113, 203},
                          {129, 257}, {300, 100}, {1023, 1025}}) {
      Fp8Case c;
      c.head_dim = d;
      c.seqlen_q = sq;
      c.seqlen_k = sk;
      c.batch = sq > 500 ? 1 : 2;
      add(c);
    }
    Fp8Case fp16;
    fp16.head_dim = d;
    fp16.seqlen_q = 200;
    fp16.seqlen_k = 333;
    fp16.out_dtype = DType::float16;
    add(fp16);
  }
  for (std::int64_t d : {64, 128, 256}) {
    // Causal, bottom-right aligned, both ways.
    for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{257, 257}, {100, 400}, {400, 100}}) {
      Fp8Case c;
      c.head_dim = d;
      c.seqlen_q = sq;
      c.seqlen_k = sk;
      c.is_causal = true;
      add(c);
    }
    // Sliding window, and a window that leaves early rows without keys.
    Fp8Case window;
    window.head_dim = d;
    window.seqlen_q = 300;
    window.seqlen_k = 500;
    window.window_left = 40;
    window.window_right = 7;
    add(window);
    Fp8Case empty_rows;
    empty_rows.head_dim = d;
    empty_rows.seqlen_q = 300;
    empty_rows.seqlen_k = 100;
    empty_rows.is_causal = true;  // rows < 200 see no key
    add(empty_rows);
    // Softcap (the ScoreRule path, descales folded into its input scale).
    Fp8Case softcap;
    softcap.head_dim = d;
    softcap.seqlen_q = 150;
    softcap.seqlen_k = 260;
    softcap.softcap = 5.0f;
    softcap.softmax_scale = 0.5f;
    softcap.input_scale = 2.0;
    add(softcap);
    // ALiBi (the ScoreRule path with the descales in its scale), causal and not.
    Fp8Case alibi;
    alibi.head_dim = d;
    alibi.heads_q = 4;
    alibi.heads_kv = 2;
    alibi.seqlen_q = 170;
    alibi.seqlen_k = 230;
    alibi.with_alibi = true;
    add(alibi);
    alibi.is_causal = true;
    add(alibi);
    // GQA and MQA.
    Fp8Case gqa;
    gqa.head_dim = d;
    gqa.heads_q = 6;
    gqa.heads_kv = 2;
    gqa.seqlen_q = 190;
    gqa.seqlen_k = 211;
    add(gqa);
    Fp8Case mqa = gqa;
    mqa.heads_q = 4;
    mqa.heads_kv = 1;
    mqa.is_causal = true;
    add(mqa);
    // Varlen with an empty key sequence (its rows: out 0, LSE -inf) and an empty query one.
    Fp8Case varlen;
    varlen.head_dim = d;
    varlen.heads_q = 4;
    varlen.heads_kv = 2;
    varlen.varlen_q = {37, 0, 200, 129, 5};
    varlen.varlen_k = {100, 17, 0, 300, 129};
    varlen.batch = 5;
    varlen.seqlen_q = 200;
    varlen.seqlen_k = 300;
    add(varlen);
    Fp8Case varlen_causal = varlen;
    varlen_causal.is_causal = true;
    add(varlen_causal);
    // Descales: one value through zero strides, and none at all; no LSE output.
    Fp8Case scalar_descale;
    scalar_descale.head_dim = d;
    scalar_descale.seqlen_q = 140;
    scalar_descale.seqlen_k = 270;
    scalar_descale.descale_kind = 2;
    add(scalar_descale);
    Fp8Case no_descale = scalar_descale;
    no_descale.descale_kind = 0;
    no_descale.with_lse = false;
    add(no_descale);
    // seqlen_k = 0: every row empty.
    Fp8Case no_keys;
    no_keys.head_dim = d;
    no_keys.seqlen_q = 70;
    no_keys.seqlen_k = 0;
    add(no_keys);
    // Many key blocks (17-19 of 128 keys): every stage of each ring reused several
    // times (phase parities), the in-place schedule's loader running ahead of the
    // transposes; causal and window masks over long rows, varlen with long sequences.
    Fp8Case long_keys;
    long_keys.head_dim = d;
    long_keys.seqlen_q = 200;
    long_keys.seqlen_k = 2100;
    add(long_keys);
    Fp8Case long_causal;
    long_causal.head_dim = d;
    long_causal.heads_q = 1;
    long_causal.heads_kv = 1;
    long_causal.seqlen_q = 1500;
    long_causal.seqlen_k = 2300;
    long_causal.is_causal = true;
    add(long_causal);
    Fp8Case long_window = long_keys;
    long_window.seqlen_q = 700;
    long_window.window_left = 900;
    long_window.window_right = 300;
    add(long_window);
    Fp8Case long_varlen;
    long_varlen.head_dim = d;
    long_varlen.heads_q = 2;
    long_varlen.heads_kv = 1;
    long_varlen.varlen_q = {130, 0, 257};
    long_varlen.varlen_k = {2200, 300, 0};
    long_varlen.batch = 3;
    long_varlen.seqlen_q = 257;
    long_varlen.seqlen_k = 2200;
    long_varlen.is_causal = true;
    add(long_varlen);
    // Sharp attention (large scores: P spans the e4m3 range, many subnormal P').
    Fp8Case sharp;
    sharp.head_dim = d;
    sharp.seqlen_q = 130;
    sharp.seqlen_k = 390;
    sharp.input_scale = 4.0;
    add(sharp);
  }
  // Key counts that are whole multiples of the wide key tiles (160, 192, 224; the cases
  // above all end in a partial block of those): 1344 = 7 x 192 = 6 x 224 keys (10.5 blocks of
  // 128), one exact 224-key block, causal 448 x 448 (2 x 224, 2.33 x 192), causal 320 x 960
  // (6 x 160 = 5 x 192 keys).
  for (std::int64_t d : {64, 128, 256}) {
    Fp8Case whole_blocks;
    whole_blocks.head_dim = d;
    whole_blocks.seqlen_q = 192;
    whole_blocks.seqlen_k = 1344;
    add(whole_blocks);
    Fp8Case one_block;
    one_block.head_dim = d;
    one_block.seqlen_q = 100;
    one_block.seqlen_k = 224;
    add(one_block);
    Fp8Case causal_whole;
    causal_whole.head_dim = d;
    causal_whole.heads_q = 1;
    causal_whole.heads_kv = 1;
    causal_whole.seqlen_q = 448;
    causal_whole.seqlen_k = 448;
    causal_whole.is_causal = true;
    add(causal_whole);
    Fp8Case causal_160 = causal_whole;
    causal_160.seqlen_q = 320;
    causal_160.seqlen_k = 960;
    add(causal_160);
  }
  return cases;
}

std::vector<Fp8Case> public_api_cases() {
  std::vector<Fp8Case> cases;
  auto add = [&](Fp8Case c) {
    c.seed = 1000 + cases.size();
    cases.push_back(c);
  };
  Fp8Case dense;
  dense.batch = 2;
  dense.seqlen_q = 113;
  dense.seqlen_k = 203;
  add(dense);
  Fp8Case gqa_causal = dense;
  gqa_causal.heads_q = 4;
  gqa_causal.heads_kv = 1;
  gqa_causal.is_causal = true;
  gqa_causal.descale_kind = 2;
  gqa_causal.out_dtype = DType::float16;
  add(gqa_causal);
  Fp8Case window = dense;
  window.head_dim = 64;
  window.window_left = 31;
  window.window_right = 7;
  window.softcap = 30.0f;
  window.with_alibi = true;
  window.descale_kind = 0;
  add(window);
  Fp8Case varlen;
  varlen.head_dim = 256;
  varlen.varlen_q = {17, 0, 130};
  varlen.varlen_k = {40, 5, 129};
  varlen.batch = 3;
  varlen.seqlen_q = 130;
  varlen.seqlen_k = 129;
  varlen.is_causal = true;
  add(varlen);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, HopperFp8PublicApi, ::testing::ValuesIn(public_api_cases()),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) {
                           return "case" + std::to_string(info.index);
                         });

INSTANTIATE_TEST_SUITE_P(Shapes, HopperFp8Forward, ::testing::ValuesIn(fp8_cases()),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) {
                           return "case" + std::to_string(info.index);
                         });

// The same cases under the other schedules (FLASHATTN_CUDA_FP8_SCHEDULE=in_place, =ping_pong,
// =overlap, =overlap_ping_pong; d64 has no ping-pong kernel: its PingPong cases run in_place
// again, its OverlapPingPong cases overlap without turns). The rotated loop of the overlap
// kernel has its own 1-block (seqlen_k <= 128) and 2-block (129..256) paths: the cases have
// both. OverlapPingPong also skips the unit rescales (Fp8Rescale::when_max_moves; turns and
// rescale are independent branches of one kernel, so each is covered once).
std::vector<Fp8Case> cases_with_schedule(
    cuda::hopper_fp8::Fp8Schedule schedule,
    cuda::hopper_fp8::Fp8Rescale rescale = cuda::hopper_fp8::Fp8Rescale::every_block) {
  std::vector<Fp8Case> cases = fp8_cases();
  for (Fp8Case& c : cases) {
    c.schedule = schedule;
    c.rescale = rescale;
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(InPlace, HopperFp8Forward,
                         ::testing::ValuesIn(cases_with_schedule(cuda::hopper_fp8::Fp8Schedule::transpose_in_place)),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) {
                           return "case" + std::to_string(info.index);
                         });

INSTANTIATE_TEST_SUITE_P(PingPong, HopperFp8Forward,
                         ::testing::ValuesIn(cases_with_schedule(cuda::hopper_fp8::Fp8Schedule::in_place_ping_pong)),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) {
                           return "case" + std::to_string(info.index);
                         });

INSTANTIATE_TEST_SUITE_P(Overlap, HopperFp8Forward,
                         ::testing::ValuesIn(cases_with_schedule(cuda::hopper_fp8::Fp8Schedule::in_place_overlap)),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) {
                           return "case" + std::to_string(info.index);
                         });

// The wide key tiles (in_place_overlap_n192/_n224 at d128, _n160 at d64;
// FLASHATTN_CUDA_FP8_SCHEDULE=overlap_n192 etc., or FLASHATTN_CUDA_FP8_BLOCK_N=160,192,224 per
// head dim): the cases whose kernel head dim has that entry (d128 with d80/d96 padded to it,
// or d64; the others would run the Overlap suite's kernel again). Key counts below one wide
// block (1, 97, 100, 128, 129), inside the second (203, 211, 230, 257, 260, 270, 300, 333),
// many blocks with a tail (1025, 2100, 2300, varlen 129/300/2200), whole blocks (1344, 224,
// causal 448, causal 960), empty key sequences. OverlapN192 also skips the unit rescales
// (Fp8Rescale::when_max_moves), OverlapN224 and OverlapN160 always rescale.
std::vector<Fp8Case> kernel_head_dim_cases_with_schedule(
    std::int64_t kernel_head_dim, cuda::hopper_fp8::Fp8Schedule schedule,
    cuda::hopper_fp8::Fp8Rescale rescale = cuda::hopper_fp8::Fp8Rescale::every_block) {
  std::vector<Fp8Case> cases;
  for (const Fp8Case& c : cases_with_schedule(schedule, rescale)) {
    const bool runs_kernel_head_dim =
        kernel_head_dim == 128 ? c.head_dim == 80 || c.head_dim == 96 || c.head_dim == 128 : c.head_dim == kernel_head_dim;
    if (runs_kernel_head_dim) cases.push_back(c);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    OverlapN192, HopperFp8Forward,
    ::testing::ValuesIn(kernel_head_dim_cases_with_schedule(128, cuda::hopper_fp8::Fp8Schedule::in_place_overlap_n192,
                                                            cuda::hopper_fp8::Fp8Rescale::when_max_moves)),
    [](const ::testing::TestParamInfo<Fp8Case>& info) { return "case" + std::to_string(info.index); });

INSTANTIATE_TEST_SUITE_P(
    OverlapN224, HopperFp8Forward,
    ::testing::ValuesIn(kernel_head_dim_cases_with_schedule(128, cuda::hopper_fp8::Fp8Schedule::in_place_overlap_n224)),
    [](const ::testing::TestParamInfo<Fp8Case>& info) { return "case" + std::to_string(info.index); });

// The n224 kernel taking turns (in_place_overlap_n224_ping_pong: no kernel of its own).
INSTANTIATE_TEST_SUITE_P(
    OverlapN224PingPong, HopperFp8Forward,
    ::testing::ValuesIn(
        kernel_head_dim_cases_with_schedule(128, cuda::hopper_fp8::Fp8Schedule::in_place_overlap_n224_ping_pong)),
    [](const ::testing::TestParamInfo<Fp8Case>& info) { return "case" + std::to_string(info.index); });
INSTANTIATE_TEST_SUITE_P(
    OverlapN160, HopperFp8Forward,
    ::testing::ValuesIn(kernel_head_dim_cases_with_schedule(64, cuda::hopper_fp8::Fp8Schedule::in_place_overlap_n160)),
    [](const ::testing::TestParamInfo<Fp8Case>& info) { return "case" + std::to_string(info.index); });

INSTANTIATE_TEST_SUITE_P(
    OverlapPingPong, HopperFp8Forward,
    ::testing::ValuesIn(cases_with_schedule(cuda::hopper_fp8::Fp8Schedule::in_place_overlap_ping_pong,
                                            cuda::hopper_fp8::Fp8Rescale::when_max_moves)),
    [](const ::testing::TestParamInfo<Fp8Case>& info) { return "case" + std::to_string(info.index); });

// Refusals name the argument.
// The process default (no FLASHATTN_CUDA_FP8_SCHEDULE / _BLOCK_N): the timed table of
// launch.cu's default_schedule, wide key tiles only where they won (d128 from 4k keys, d64
// from 16k). Their kernels are checked by the OverlapN224 / OverlapN160 suites.
TEST(HopperFp8DefaultSchedule, FollowsHeadDimAndKeyLength) {
  if (std::getenv("FLASHATTN_CUDA_FP8_SCHEDULE") != nullptr || std::getenv("FLASHATTN_CUDA_FP8_BLOCK_N") != nullptr)
    GTEST_SKIP() << "a schedule is asked for in the environment";
  using cuda::hopper_fp8::default_schedule;
  using cuda::hopper_fp8::Fp8Schedule;
  EXPECT_EQ(default_schedule(128, 1024), Fp8Schedule::in_place_overlap);
  EXPECT_EQ(default_schedule(128, 4095), Fp8Schedule::in_place_overlap);
  EXPECT_EQ(default_schedule(128, 4096), Fp8Schedule::in_place_overlap_n224_ping_pong);
  EXPECT_EQ(default_schedule(128, 16384), Fp8Schedule::in_place_overlap_n224_ping_pong);
  EXPECT_EQ(default_schedule(64, 4096), Fp8Schedule::in_place_overlap);
  EXPECT_EQ(default_schedule(64, 16384), Fp8Schedule::in_place_overlap_n160);
  EXPECT_EQ(default_schedule(256, 16384), Fp8Schedule::in_place_overlap);
  if (std::getenv("FLASHATTN_CUDA_FP8_RESCALE") != nullptr) return;
  using cuda::hopper_fp8::default_rescale;
  using cuda::hopper_fp8::Fp8Rescale;
  EXPECT_EQ(default_rescale(64), Fp8Rescale::every_block);
  EXPECT_EQ(default_rescale(128), Fp8Rescale::when_max_moves);
  EXPECT_EQ(default_rescale(256), Fp8Rescale::when_max_moves);
}

TEST(HopperFp8ForwardRefusal, NamesTheArgument) {
  AttentionParams params;
  params.input_dtype = DType::bfloat16;
  params.dtype = DType::bfloat16;
  EXPECT_FALSE(cuda::hopper_fp8::supports(params));
  EXPECT_NE(cuda::hopper_fp8::why_unsupported(params).find("q:"), std::string::npos);
  params.input_dtype = DType::float8_e4m3;
  params.dtype = DType::float32;
  EXPECT_NE(cuda::hopper_fp8::why_unsupported(params).find("out:"), std::string::npos);
  EXPECT_THROW(cuda::hopper_fp8::forward(params, nullptr), NotSupported);
}

}  // namespace
}  // namespace flashattn::testing
