"""One attention problem per process, run a few times, for Nsight Compute (bench/gpu/ncu_profile.sh).

ncu picks the kernel (-k) and skips the warm-up launches (--launch-skip); this script only
makes the inputs (random, never zeros) and calls flashattn's Python entry the same way the
timing harness does. Problems are named on the command line, e.g. fwd_d128_n16k_dropout.
"""
import argparse
import sys

import torch

import flashattn

# name -> (pass, head_dim, seqlen, causal, dropout_p, dtype); 16k tokens per problem (the FA3 sweep).
PROBLEMS = {
    "fwd_d128_n16k": ("fwd", 128, 16384, False, 0.0, "bf16"),
    "fwd_d128_n16k_dropout": ("fwd", 128, 16384, False, 0.1, "bf16"),
    "fwd_d64_n1k_causal": ("fwd", 64, 1024, True, 0.0, "bf16"),
    "fwd_d64_n16k": ("fwd", 64, 16384, False, 0.0, "bf16"),
    "fwd_d64_n16k_dropout": ("fwd", 64, 16384, False, 0.1, "bf16"),
    "fp8_d256_n16k": ("fwd", 256, 16384, False, 0.0, "fp8"),
    "fp8_d128_n16k": ("fwd", 128, 16384, False, 0.0, "fp8"),
    "bwd_d128_n1k": ("bwd", 128, 1024, False, 0.0, "bf16"),
    "bwd_d128_n4k": ("bwd", 128, 4096, False, 0.0, "bf16"),
}


def run(name, repeats):
    pass_, head_dim, seqlen, causal, dropout_p, dtype = PROBLEMS[name]
    tokens = 16384
    batch, heads = max(1, tokens // seqlen), 2048 // head_dim
    shape = (batch, seqlen, heads, head_dim)
    make = lambda: torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    q, k, v = make(), make(), make()
    if dtype == "fp8":
        q, k, v = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    if pass_ == "bwd":
        for tensor in (q, k, v):
            tensor.requires_grad_(True)
    for _ in range(repeats):
        out = flashattn.flash_attn_func(q, k, v, dropout_p=dropout_p, causal=causal)
        if pass_ == "bwd":
            out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    if not torch.isfinite(out).all():
        sys.exit(f"{name}: non-finite output")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("problems", nargs="+", choices=sorted(PROBLEMS))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for name in args.problems:
        run(name, args.repeats)
