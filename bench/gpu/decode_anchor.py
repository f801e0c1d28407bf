"""Decode anchor: PyTorch SDPA (FLASH_ATTENTION backend = FlashAttention-2, and
CUDNN_ATTENTION) on the decode shapes of bench/gpu/decode_bench.cu, timed exactly as
decode_bench times ours (bench/gpu/graph_timing.hpp): bf16, one query token, 32 query
heads on 8 KV heads (enable_gqa=True, no expanded copy), head dim 128; CALLS_PER_GRAPH
calls captured in one CUDA graph with the caches rotated among SETS sets (so no call
finds its K/V in L2), WARMUP replays, then the median over REPEATS timed replays of
(graph time / calls). Bandwidth = bytes of K and V read / time. Writes CSV (argv[1],
default decode_anchor.csv). A per-call (do_bench) time would include launch latency
that ours, replayed from a graph, does not pay: never compare the two.

    python bench/gpu/decode_anchor.py bench/results/decode_anchor.csv
"""
import csv
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
HEADS_Q, HEADS_KV, HEAD_DIM, SETS = 32, 8, 128, 4
CALLS_PER_GRAPH, WARMUP, REPEATS = 16, 3, 15  # decode_bench's kCallsPerGraph, kWarmup, kRepeats
SHAPES = [(8, 1024), (8, 4096), (8, 16384), (8, 65536), (1, 65536), (1, 131072), (64, 1024)]
BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}


def measure(batch, kv_len, backend):
    q = torch.randn(batch, HEADS_Q, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    caches = [
        (torch.randn(batch, HEADS_KV, kv_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
         torch.randn(batch, HEADS_KV, kv_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16))
        for _ in range(SETS)
    ]
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, *caches[0], enable_gqa=True)  # also selects/compiles the kernel
        if not torch.isfinite(out).all():
            raise RuntimeError("non-finite output")
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for k, v in caches:  # warm every set once outside capture
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            with torch.cuda.graph(graph, stream=stream):
                for i in range(CALLS_PER_GRAPH):
                    F.scaled_dot_product_attention(q, *caches[i % SETS], enable_gqa=True)
        torch.cuda.current_stream().wait_stream(stream)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(WARMUP + REPEATS):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        if r >= WARMUP:
            times.append(start.elapsed_time(stop) / CALLS_PER_GRAPH)
    ms = sorted(times)[len(times) // 2]
    bytes_read = 2 * batch * kv_len * HEADS_KV * HEAD_DIM * 2
    return ms, bytes_read / (ms * 1e-3) / 1e12


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "decode_anchor.csv"
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["backend", "batch", "heads_q", "heads_kv", "head_dim", "kv_len", "time_us", "bandwidth_tbps"])
        for batch, kv_len in SHAPES:
            for name, backend in BACKENDS.items():
                try:
                    ms, tbps = measure(batch, kv_len, backend)
                except RuntimeError as error:  # a backend that refuses the shape
                    print(f"{name} batch {batch} kv {kv_len}: {error}")
                    continue
                print(f"{name:10s} batch {batch:3d} kv {kv_len:7d}: {ms * 1e3:8.2f} us  {tbps:5.2f} TB/s")
                writer.writerow([name, batch, HEADS_Q, HEADS_KV, HEAD_DIM, kv_len, f"{ms * 1e3:.3f}", f"{tbps:.4f}"])
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
