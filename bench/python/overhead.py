"""Python call overhead of flashattn.flash_attn_func on a small problem.

Target (issue 5): for batch 1, 8 heads, seqlen 128, head dim 64, fp16 on the GPU, the time
per call through flash_attn_func is within 10 us of the raw kernel time.

    python bench/python/overhead.py            # after `pip install .`; writes bench/results/python_overhead.csv

Method: back-to-back calls on one stream, CUDA events around N calls, median over R
repetitions of the per-call time. A call costs max(host time, GPU time) in steady state,
so any Python overhead beyond the kernel shows up directly. The raw kernel time is the
same native forward call replayed from a CUDA graph (no host work at all per call).
Rows:
  kernel (CUDA graph)          GPU time of the forward kernel(s), back to back
  native _C.forward            the nanobind call with preallocated outputs (DLPack + launch)
  flash_attn_func              the public API, inference (no autograd): our target row
  flash_attn_func (autograd)   inputs requiring grad: through the custom op flashattn::_fwd
  sdpa FLASH_ATTENTION         PyTorch's own FlashAttention-2 call, for comparison
Also the host-only time per call (perf_counter, no synchronisation) for each path.
"""

import argparse
import csv
import datetime
import os
import statistics
import sys
import time

import torch

import flashattn
from flashattn import _C, flash_attn_func

BATCH, HEADS, SEQLEN, HEAD_DIM = 1, 8, 128, 64
TARGET_US = 10.0


def time_per_call_us(fn, calls, repetitions):
    """Median over repetitions of (CUDA-event time of `calls` back-to-back calls) / calls."""
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repetitions):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(samples)


def host_time_per_call_us(fn, calls, repetitions):
    """Median host (CPU) time per call; the GPU queue absorbs the kernels."""
    samples = []
    for _ in range(repetitions):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - begin) * 1e6 / calls)
    torch.cuda.synchronize()
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="calls per timed repetition")
    parser.add_argument("--repetitions", type=int, default=30)
    default_out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results", "python_overhead.csv")
    parser.add_argument("--out", default=os.path.normpath(default_out))
    args = parser.parse_args()

    if not torch.cuda.is_available() or not flashattn.cuda_available():
        sys.exit("overhead.py needs a CUDA GPU and flashattn built with its CUDA backend "
                 f"(torch sees CUDA: {torch.cuda.is_available()}, flashattn.cuda_available(): "
                 f"{flashattn.cuda_available()})")

    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(BATCH, SEQLEN, HEADS, HEAD_DIM, device=device, dtype=torch.float16, generator=generator)
               for _ in range(3))
    out = torch.empty_like(q)
    to_dlpack = torch.utils.dlpack.to_dlpack

    def native():
        stream = torch.cuda.current_stream().cuda_stream
        # No LSE, like flash_attn_func without return_attn_probs.
        _C.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), None, None, None, 0, 0, None, False, -1,
                   -1, 0.0, "automatic", 0, stream)

    def public():
        return flash_attn_func(q, k, v)

    q_grad, k_grad, v_grad = (x.clone().requires_grad_() for x in (q, k, v))

    def public_autograd():
        return flash_attn_func(q_grad, k_grad, v_grad)

    q_sdpa, k_sdpa, v_sdpa = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q_sdpa, k_sdpa, v_sdpa)

    # The raw kernel: `calls` native forwards captured once in a CUDA graph, replayed.
    graph_stream = torch.cuda.Stream()
    graph_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(graph_stream):
        native()
    torch.cuda.current_stream().wait_stream(graph_stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(args.calls):
            native()
    kernel_us = time_per_call_us(graph.replay, 1, args.repetitions) / args.calls

    reference = flash_attn_func(q, k, v)
    assert torch.equal(reference, out), "the captured native call and flash_attn_func disagree"

    rows = [("kernel (CUDA graph)", kernel_us, float("nan"))]
    with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for name, fn in (("native _C.forward", native), ("flash_attn_func", public), ("sdpa FLASH_ATTENTION", sdpa)):
            rows.append((name, time_per_call_us(fn, args.calls, args.repetitions),
                         host_time_per_call_us(fn, args.calls, args.repetitions)))
    rows.insert(3, ("flash_attn_func (autograd)", time_per_call_us(public_autograd, args.calls, args.repetitions),
                    host_time_per_call_us(public_autograd, args.calls, args.repetitions)))

    gpu = torch.cuda.get_device_name()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"{gpu}, torch {torch.__version__}, flashattn {flashattn.__version__}, {stamp}")
    print(f"problem: batch {BATCH}, heads {HEADS}, seqlen {SEQLEN}, head_dim {HEAD_DIM}, fp16, forward, "
          f"{args.calls} calls x {args.repetitions} repetitions (median)")
    print(f"{'path':<28} {'us/call':>9} {'host us/call':>13} {'over kernel':>12}")
    for name, per_call, host in rows:
        print(f"{name:<28} {per_call:9.2f} {host:13.2f} {per_call - kernel_us:12.2f}")
    public_us = dict((name, per_call) for name, per_call, _ in rows)["flash_attn_func"]
    overhead = public_us - kernel_us
    verdict = "PASS" if overhead <= TARGET_US else "FAIL"
    print(f"flash_attn_func overhead over the raw kernel: {overhead:.2f} us (target <= {TARGET_US:.0f} us): {verdict}")

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["date_utc", "gpu", "torch", "batch", "heads", "seqlen", "head_dim", "dtype", "path",
                         "us_per_call", "host_us_per_call", "over_kernel_us"])
        for name, per_call, host in rows:
            writer.writerow([stamp, gpu, torch.__version__, BATCH, HEADS, SEQLEN, HEAD_DIM, "float16", name,
                             f"{per_call:.3f}", "" if host != host else f"{host:.3f}", f"{per_call - kernel_us:.3f}"])
    print(f"wrote {args.out}")
    return 0 if overhead <= TARGET_US else 1


if __name__ == "__main__":
    sys.exit(main())
