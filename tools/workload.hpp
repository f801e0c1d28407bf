// tools/workload.hpp — the buffers of one problem (random inputs, outputs, and on
// the GPU their device copies), the library calls on them, and their timing.
#pragma once

#include <cstdint>
#include <optional>

#include "flashattn/attention.hpp"
#include "tests/support/host_tensor.hpp"
#include "tools/device_buffer.hpp"
#include "tools/problem.hpp"

namespace flashattn::tools {

using testing::HostTensor;

class Workload {
 public:
  // Inputs are Normal(0, 1) (dout too when with_backward), never zeros.
  Workload(const Problem& problem, std::uint64_t seed, bool with_backward);

  const Problem& problem() const { return problem_; }

  // Arguments on the problem's device.
  ForwardArgs forward_args();
  BackwardArgs backward_args();
  // The same arguments on the host copies, for the float64 reference.
  ForwardArgs host_forward_args();
  BackwardArgs host_backward_args();

  // Fill every output with NaN bit patterns so an unwritten element fails the check.
  void poison_outputs();
  void run_forward();
  void run_backward();  // runs the forward first if it has not run yet
  // Median wall time in milliseconds of `repeats` calls after `warmup` calls
  // (CUDA events on the GPU, a steady clock on the CPU).
  double time_forward_ms(int warmup, int repeats);
  double time_backward_ms(int warmup, int repeats);
  // Copy the outputs to the host tensors below (nothing to do on the CPU).
  void download_outputs();

  HostTensor q, k, v, dout;     // inputs
  HostTensor out, lse;          // forward outputs (lse: float32 [batch, heads, seqlen_q])
  HostTensor dq, dk, dv;        // backward outputs

 private:
  bool on_gpu() const { return problem_.device.type == DeviceType::cuda; }
  TensorView device_view(HostTensor& host, DeviceBuffer& buffer);
  ExecutionContext context() const;
  template <class Call>
  double time_ms(Call&& call, int warmup, int repeats);

  Problem problem_;
  bool with_backward_ = false;
  bool has_forward_run_ = false;
  DeviceBuffer q_gpu_, k_gpu_, v_gpu_, dout_gpu_, out_gpu_, lse_gpu_, dq_gpu_, dk_gpu_, dv_gpu_, workspace_gpu_;
};

}  // namespace flashattn::tools
