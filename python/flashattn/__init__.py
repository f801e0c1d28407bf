"""flashattn: exact, IO-aware attention (FlashAttention) in C++/CUDA.

A drop-in replacement for flash_attn 2.x's functions::

    from flashattn import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)   # q (batch, seqlen, nheads, headdim)

PyTorch tensors run on their device (CPU tensors on the CPU backend, CUDA tensors on
the GPU kernels) with autograd and torch.compile support; NumPy arrays run the
forward pass on the CPU. PyTorch is imported only when a torch.Tensor comes in.
"""

import sys

from flashattn._C import __version__, cuda_available
from flashattn._dropout import manual_seed
from flashattn.interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
    merge_attention_states,
)

from flashattn.fp8 import dequantize_fp8, quantize_fp8
from flashattn.block_mask import BlockMask, block_mask_from_dense, block_mask_from_rule, create_block_mask
from flashattn.sdpa import scaled_dot_product_attention

# With torch already imported, register the torch.ops.flashattn ops now (otherwise on
# the first torch.Tensor call, or by importing flashattn._torch_ops).
if "torch" in sys.modules:
    from flashattn import _torch_ops  # noqa: F401

__all__ = [
    "__version__",
    "cuda_available",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "dequantize_fp8",
    "quantize_fp8",
    "manual_seed",
    "merge_attention_states",
    "scaled_dot_product_attention",
    "BlockMask",
    "create_block_mask",
    "block_mask_from_dense",
    "block_mask_from_rule",
]
