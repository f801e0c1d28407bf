// src/core/fp8_quantize.cpp — quantize_fp8 (flashattn/fp8.hpp): every argument
// checked (naming it) before anything is written, then the CPU or CUDA implementation.
#include <string>
#include <vector>

#include "flashattn/error.hpp"
#include "flashattn/fp8.hpp"
#include "src/core/checks.hpp"
#include "src/core/fp8_quantize_params.hpp"
#include "src/core/validate.hpp"

namespace flashattn {
namespace {

using namespace checks;

QuantizeFp8Params validate_quantize_fp8(const TensorView& x, const TensorView& out, const TensorView& descale,
                                        const QuantizeFp8Options& options) {
  if (!x.defined()) fail("x", "missing tensor (rank 0)");
  if (x.rank != 3 && x.rank != 4)
    fail("x", "wrong rank: expected 4 ([batch, seqlen, heads, head_dim]) or 3 ([total, heads, head_dim]), got " +
                  std::to_string(x.rank) + " " + shape_string(x));
  const Extent x_extent = check_layout(x, "x", x.rank);
  if (x.dtype != DType::float32 && x.dtype != DType::float16 && x.dtype != DType::bfloat16)
    fail("x", "unsupported dtype: " + expected_got("float32, float16 or bfloat16", dtype_name(x.dtype)));
  if (x.device.type != DeviceType::cpu) (void)limits_for(x.device);  // NotSupported without a CUDA backend
  const Extent out_extent = check_layout(out, "out", x.rank);
  check_dtype(out, "out", DType::float8_e4m3, "");
  if (out.device != x.device) fail("out", "device mismatch: " + expected_got(to_string(x.device) + " (like x)", to_string(out.device)));
  check_shape(out, "out", std::vector<std::int64_t>(x.shape.begin(), x.shape.begin() + x.rank), " (like x)");

  QuantizeFp8Params p;
  p.dtype = x.dtype;
  p.device = x.device;
  const bool is_packed = x.rank == 3;
  const int row_dim = is_packed ? 0 : 1;
  p.batch = is_packed ? 1 : x.size(0);
  p.seqlen = x.size(row_dim);
  p.heads = x.size(row_dim + 1);
  p.head_dim = x.size(row_dim + 2);
  p.x_strides[0] = is_packed ? 0 : x.stride(0), p.x_strides[1] = x.stride(row_dim), p.x_strides[2] = x.stride(row_dim + 1);
  p.out_strides[0] = is_packed ? 0 : out.stride(0), p.out_strides[1] = out.stride(row_dim), p.out_strides[2] = out.stride(row_dim + 1);

  const Extent descale_extent = check_layout(descale, "descale", 2);
  check_dtype(descale, "descale", DType::float32, "");
  if (descale.device != x.device)
    fail("descale", "device mismatch: " + expected_got(to_string(x.device) + " (like x)", to_string(descale.device)));
  p.groups = descale.size(1);
  if (descale.size(0) != p.batch || p.groups < 1 || (p.heads > 0 && p.heads % p.groups != 0))
    fail("descale", "shape mismatch: " + expected_got("[" + std::to_string(p.batch) + ", groups] with groups dividing heads = " +
                                                          std::to_string(p.heads) + (is_packed ? " (a rank-3 x is one batch)" : ""),
                                                      shape_string(descale)));
  if (p.heads == 0 && p.groups != 1) fail("descale", "shape mismatch: x has no heads, so groups must be 1, got " + shape_string(descale));
  p.heads_per_group = p.heads > 0 ? p.heads / p.groups : 1;
  p.descale_strides[0] = descale.stride(0), p.descale_strides[1] = descale.stride(1);
  // Every (batch, group) its own float (check_layout gave groups > 1 unit stride).
  if (p.batch > 1 && descale.stride(0) < p.groups)
    fail("descale", "rows overlap: batch stride " + expected_got(">= " + std::to_string(p.groups) + " (groups)", descale.stride(0)));
  if (options.incoherent && !is_hadamard_head_dim(p.head_dim))
    unsupported("x", "head_dim must be a power of two in [32, 256] for incoherent processing (a Hadamard transform), got " +
                         std::to_string(p.head_dim));
  p.incoherent = options.incoherent;
  p.seed = options.seed;
  const std::vector<NamedExtent> outputs{{"out", out_extent}, {"descale", descale_extent}};
  check_no_overlap(outputs, {{"x", x_extent}, {"out", out_extent}, {"descale", descale_extent}});
  p.x = x.data;
  p.out = static_cast<std::uint8_t*>(out.data);
  p.descale = static_cast<float*>(descale.data);
  return p;
}

}  // namespace

void quantize_fp8(const TensorView& x, const TensorView& out, const TensorView& descale, const QuantizeFp8Options& options,
                  const ExecutionContext& context) {
  const QuantizeFp8Params params = validate_quantize_fp8(x, out, descale, options);
  checks::check_num_threads(context.num_threads);
  if (params.device.type == DeviceType::cpu) {
    cpu::quantize_fp8(params);
  } else {
    cuda::quantize_fp8(params, context.stream);
  }
}

}  // namespace flashattn
