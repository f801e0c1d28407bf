// python/src/call_arguments.hpp — the argument assembly the native calls share
// (module.cpp, mask_bindings.cpp): the tensors of a forward/backward call and the
// workspace protocol (an array, None, or a callable asked only when scratch is needed).
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>

#include "flashattn/attention.hpp"
#include "python/src/array_arguments.hpp"

namespace flashattn::python {

namespace nb = nanobind;

// q, k, v, out and the optional LSE of a forward call.
inline ForwardArgs forward_tensors(ArrayArguments& arrays, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
                                   nb::handle maybe_lse) {
  ForwardArgs args;
  args.q = arrays.input(q, "q");
  args.k = arrays.input(k, "k");
  args.v = arrays.input(v, "v");
  args.out = arrays.output(out, "out");
  args.maybe_lse = arrays.maybe_output(maybe_lse, "lse");
  return args;
}

// The inputs (q, k, v, out, dout, lse) and gradients (dq, dk, dv) of a backward call.
inline BackwardArgs backward_tensors(ArrayArguments& arrays, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
                                     nb::handle dout, nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv) {
  BackwardArgs args;
  args.q = arrays.input(q, "q");
  args.k = arrays.input(k, "k");
  args.v = arrays.input(v, "v");
  args.out = arrays.input(out, "out");
  args.dout = arrays.input(dout, "dout");
  args.lse = arrays.input(lse, "lse");
  args.dq = arrays.output(dq, "dq");
  args.dk = arrays.output(dk, "dk");
  args.dv = arrays.output(dv, "dv");
  return args;
}

// Fills `slot` from maybe_workspace: a uint8 array, None, or a callable(nbytes) that
// returns one, asked only when the call needs scratch (bytes() > 0; never on the CPU),
// so a caller gets the call in one native round trip. Returns the allocated array,
// which must stay alive until the call returns.
template <class Bytes>
nb::object attach_workspace(ArrayArguments& arrays, nb::handle maybe_workspace, Device device, TensorView& slot,
                            Bytes&& bytes) {
  nb::object allocated;
  if (!maybe_workspace.is_none() && PyCallable_Check(maybe_workspace.ptr())) {
    const std::size_t count = device.type == DeviceType::cpu ? 0 : bytes();
    if (count > 0) {
      allocated = maybe_workspace(count);
      slot = arrays.output(allocated, "workspace");
    }
  } else {
    slot = arrays.maybe_output(maybe_workspace, "workspace");
  }
  return allocated;
}

}  // namespace flashattn::python
