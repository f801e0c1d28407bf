// tests/cuda/test_fp8_quantize.cpp — quantize_fp8 on the GPU (src/cuda/fp8_quantize.cu)
// gives the CPU's bits: codes and descales, plain and incoherent, every input dtype,
// GQA groups, rank 3, strided inputs and a strided descale; and an FP8 forward on a
// device that is not Hopper is refused naming q's dtype.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "flashattn/fp8.hpp"
#include "src/core/numeric.hpp"
#include "tests/cuda/device_problem.hpp"

namespace flashattn::testing {
namespace {

struct QuantizeCase {
  DType dtype;
  std::int64_t batch, seqlen, heads, head_dim, groups;
  bool incoherent;
  bool is_rank3;
  std::int64_t head_padding;  // extra elements between heads: a strided x
};

std::string describe(const QuantizeCase& c) {
  return std::string(dtype_name(c.dtype)) + " b" + std::to_string(c.batch) + " s" + std::to_string(c.seqlen) + " h" +
         std::to_string(c.heads) + " d" + std::to_string(c.head_dim) + " g" + std::to_string(c.groups) +
         (c.incoherent ? " incoherent" : "") + (c.is_rank3 ? " rank3" : "") + " pad" + std::to_string(c.head_padding);
}

TEST(CudaQuantizeFp8, MatchesTheCpuBitwise) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<QuantizeCase> cases;
  for (DType t : {DType::float32, DType::float16, DType::bfloat16})
    for (bool incoherent : {false, true}) {
      cases.push_back({t, 2, 77, 4, 64, 2, incoherent, false, 0});
      cases.push_back({t, 1, 300, 2, 128, 1, incoherent, false, 8});
      cases.push_back({t, 3, 5, 8, 256, 8, incoherent, false, 0});
      cases.push_back({t, 1, 513, 3, 32, 3, incoherent, true, 0});
    }
  cases.push_back({DType::bfloat16, 2, 33, 2, 40, 1, false, false, 0});  // any head_dim without the rotation
  cases.push_back({DType::float16, 1, 0, 2, 64, 2, true, false, 0});     // no rows: descale 1
  for (const QuantizeCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const std::int64_t head_stride = c.head_dim + c.head_padding;
    const std::int64_t row_stride = c.heads * head_stride;
    const std::int64_t elements = c.batch * c.seqlen * row_stride;
    const std::size_t element_bytes = dtype_size(c.dtype);
    std::vector<unsigned char> x_host(static_cast<std::size_t>(elements) * element_bytes + 16);
    std::mt19937 rng(17);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::bernoulli_distribution is_outlier(0.002);
    for (std::int64_t i = 0; i < elements; ++i)
      numeric::store_from_float(x_host.data(), c.dtype, i, normal(rng) + (is_outlier(rng) ? 30.0f * normal(rng) : 0.0f));
    const std::int64_t code_elements = c.batch * c.seqlen * c.heads * c.head_dim;
    // descale [batch, groups] with a batch stride of groups + 3 (strided, as allowed).
    const std::int64_t descale_batch_stride = c.groups + 3;
    const std::size_t descale_floats = static_cast<std::size_t>(c.batch * descale_batch_stride);

    auto views = [&](void* x, void* out, void* descale, Device device) {
      const std::int64_t batch = c.is_rank3 ? 1 : c.batch;
      TensorView x_view, out_view;
      if (c.is_rank3) {
        x_view = TensorView::strided(x, c.dtype, {c.seqlen, c.heads, c.head_dim}, {row_stride, head_stride, 1}, device);
        out_view = TensorView::contiguous(out, DType::float8_e4m3, {c.seqlen, c.heads, c.head_dim}, device);
      } else {
        x_view = TensorView::strided(x, c.dtype, {c.batch, c.seqlen, c.heads, c.head_dim},
                                     {c.seqlen * row_stride, row_stride, head_stride, 1}, device);
        out_view = TensorView::contiguous(out, DType::float8_e4m3, {c.batch, c.seqlen, c.heads, c.head_dim}, device);
      }
      const TensorView descale_view = TensorView::strided(descale, DType::float32, {batch, c.groups}, {descale_batch_stride, 1}, device);
      return std::tuple{x_view, out_view, descale_view};
    };
    ASSERT_TRUE(!c.is_rank3 || c.batch == 1);
    const QuantizeFp8Options options{c.incoherent, 99};

    std::vector<std::uint8_t> cpu_codes(static_cast<std::size_t>(code_elements) + 1, 0xaa);
    std::vector<float> cpu_descale(descale_floats, -7.0f);
    {
      auto [x, out, descale] = views(x_host.data(), cpu_codes.data(), cpu_descale.data(), Device::cpu());
      quantize_fp8(x, out, descale, options);
    }
    DeviceBuffer x_device(x_host.size()), codes_device(cpu_codes.size()), descale_device(descale_floats * sizeof(float));
    x_device.upload(x_host.data());
    std::vector<std::uint8_t> gpu_codes(cpu_codes.size(), 0xaa);
    std::vector<float> gpu_descale(descale_floats, -7.0f);
    codes_device.upload(gpu_codes.data());
    descale_device.upload(gpu_descale.data());
    {
      auto [x, out, descale] = views(x_device.data(), codes_device.data(), descale_device.data(), Device::cuda(0));
      quantize_fp8(x, out, descale, options);
    }
    cuda_or_throw(cudaDeviceSynchronize(), "quantize_fp8");
    codes_device.download(gpu_codes.data());
    descale_device.download(gpu_descale.data());
    EXPECT_EQ(gpu_codes, cpu_codes);  // including the untouched byte past the end
    for (std::size_t i = 0; i < descale_floats; ++i) {
      const bool is_written = static_cast<std::int64_t>(i % static_cast<std::size_t>(descale_batch_stride)) < c.groups;
      EXPECT_EQ(gpu_descale[i], cpu_descale[i]) << "descale " << i;
      if (!is_written) EXPECT_EQ(gpu_descale[i], -7.0f) << "the gap of a strided descale was written";
    }
  }
}

TEST(CudaFp8Forward, RefusedOffHopperNamingTheDtype) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  int major = 0;
  cuda_or_throw(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), "compute capability");
  if (major == 9) GTEST_SKIP() << "Hopper runs FP8 (tests of the kernel: branch fp8-hopper)";
  const std::int64_t elements = 1 * 64 * 2 * 64;
  DeviceBuffer q(static_cast<std::size_t>(elements)), out(static_cast<std::size_t>(elements) * 2);
  ForwardArgs args;
  args.q = TensorView::contiguous(q.data(), DType::float8_e4m3, {1, 64, 2, 64}, Device::cuda(0));
  args.k = args.q, args.v = args.q;
  args.out = TensorView::contiguous(out.data(), DType::bfloat16, {1, 64, 2, 64}, Device::cuda(0));
  try {
    forward(args);
    FAIL() << "FP8 ran on compute capability " << major << ".x";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("q: float8_e4m3fn"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flashattn::testing
