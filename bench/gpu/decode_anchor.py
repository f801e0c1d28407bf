"""Decode anchor for issue 6: PyTorch SDPA (FLASH_ATTENTION backend = FlashAttention-2,
and CUDNN_ATTENTION) on the decode shapes of bench/gpu/decode_bench.cu.

Same method as decode_bench: bf16, one query token, 32 query heads on 8 KV heads
(enable_gqa=True, no expanded copy), head dim 128, caches rotated among 4 sets so
the timed call does not read from L2, triton.testing.do_bench median. Bandwidth =
bytes of K and V read / time. Writes CSV (argv[1], default decode_anchor.csv).

    python bench/gpu/decode_anchor.py bench/results/decode_anchor.csv
"""
import csv
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

HEADS_Q, HEADS_KV, HEAD_DIM, SETS = 32, 8, 128, 4
SHAPES = [(8, 1024), (8, 4096), (8, 16384), (8, 65536), (1, 65536), (1, 131072), (64, 1024)]
BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}


def measure(batch, kv_len, backend):
    q = torch.randn(batch, HEADS_Q, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    caches = [
        (torch.randn(batch, HEADS_KV, kv_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
         torch.randn(batch, HEADS_KV, kv_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16))
        for _ in range(SETS)
    ]
    step = [0]

    def call():
        k, v = caches[step[0] % SETS]
        step[0] += 1
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    with sdpa_kernel(backend):
        out = call()
        if not torch.isfinite(out).all():
            raise RuntimeError("non-finite output")
        ms = do_bench(call, warmup=25, rep=100, return_mode="median")
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
