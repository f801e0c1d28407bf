"""flashattn.scaled_dot_product_attention: PyTorch's signature, layout and semantics.

    out = scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                       is_causal=False, scale=None, enable_gqa=False, *, block_mask=None)

query (batch, heads, L, E), key/value (batch, heads_kv, S, E) with any strides (only E
contiguous); NumPy arrays (forward) or torch tensors (autograd for q, k, v and a float
attn_mask that requires grad, torch.compile through the flashattn::_sdpa_* custom ops).
As PyTorch:
  * is_causal is aligned to the top-left corner (query i sees keys j <= i), unlike
    flash_attn_func's bottom-right; attn_mask and is_causal together are an error;
  * attn_mask: boolean (True = take part) or an additive float bias (q's dtype or
    float32), broadcastable to (batch, heads, L, S); read through zero strides, never
    expanded in memory;
  * enable_gqa: heads a multiple of heads_kv (else they must be equal);
  * dropout_p > 0 applies dropout (flashattn's generator, flashattn/dropout.hpp: the
    mask is not torch's, the statistics are).
Differences: a row that sees no key returns 0 (PyTorch returns NaN) and gets zero
gradients. block_mask (flashattn.BlockMask or a torch BlockMask) restricts attention
to its blocks (block_mask.py).

A boolean (or uint8) attn_mask of at least 256 x 256 goes to the kernels in block-sparse
form (128 x 128 blocks): the result is the same, empty blocks are skipped, full blocks
skip the element mask, partial blocks read one bit per element instead of a byte.
  * a torch mask on a GPU, or any torch mask under torch.compile: always, converted on
    its device in torch ops (_torch_block_mask.py) with no host synchronisation, so
    inside CUDA graphs and compiled graphs too;
  * a host mask (NumPy, or a torch CPU tensor outside torch.compile): on the host, when
    at least a quarter of the blocks are empty or full (else the dense mask is read).
An additive (float) mask is always read as it is: its values are needed in every
block, and a block skipped for being all -inf would leave its dBias unwritten.
"""

import functools
import sys

import numpy as np

from flashattn import _C, _dropout
from flashattn._arguments import as_bool, as_float
from flashattn.block_mask import _from_dense_numpy, _is_compiling, as_block_mask, block_mask_from_rule


def _top_left_causal_mask(L, S, device):
    """PyTorch's top-left is_causal for L < S as a block mask (the kernels' causal rule is
    bottom-right), built once per (L, S, device) in eager mode: a host build and copy per
    call would synchronise and could not be captured in a CUDA graph. Under torch.compile
    it is built in the traced graph (never cached: its tensors are the tracer's)."""
    if _is_compiling():
        return _build_top_left_causal_mask(L, S, device)
    return _cached_top_left_causal_mask(L, S, device)


def _build_top_left_causal_mask(L, S, device):
    bm = block_mask_from_rule(1, 1, L, S, _CONVERT_BLOCK, causal=True)
    return bm.to(device) if device is not None else bm


# Never evicted: a CUDA graph captured with one of these masks reads its tensors, which
# nothing else keeps alive (each is a few int32 lists, no bits).
_cached_top_left_causal_mask = functools.lru_cache(maxsize=None)(_build_top_left_causal_mask)


# The automatic conversion of a dense boolean mask (see the module docstring).
_CONVERT_MIN_LENGTH = 256
_CONVERT_BLOCK = 128
_CONVERT_MIN_SKIPPABLE = 0.25


def _is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _mask_rules(L, S, is_causal):
    """(causal, window_left, window_right, needs_block_mask) for PyTorch's top-left causal:
    with L >= S the bottom-right window (-1, L - S) is the same set; with L < S it is not
    expressible as a window, so a block mask with the top-left band is used."""
    if not is_causal:
        return False, -1, -1, False
    if L == S:
        return True, -1, -1, False
    if L > S:
        return False, -1, L - S, False
    return False, -1, -1, True


def _convert_dense(mask4, L, S, on_device):
    """The block-sparse form of a boolean mask (module docstring), else None. on_device:
    convert a torch mask in torch ops on its device (no host read, always)."""
    if L < _CONVERT_MIN_LENGTH or S < _CONVERT_MIN_LENGTH:
        return None
    if _is_torch(mask4) and mask4.device.type == "cuda" and mask4.shape[2] == L and mask4.shape[3] == S:
        # Not broadcast along rows or columns: the library converts it at its kernels' tiles
        # in one pass (src/core/dense_mask_blocks.hpp; 2x faster than the torch ops below on
        # a 4k causal mask, H200 2026-11-27), unless FLASHATTN_DENSE_MASK=elements.
        return None
    if _is_torch(mask4) and (on_device or mask4.device.type != "cpu"):
        from flashattn._torch_block_mask import block_mask_from_dense_tensor

        return block_mask_from_dense_tensor(mask4, (L, S), (_CONVERT_BLOCK, _CONVERT_BLOCK))
    dense = mask4.detach().cpu().numpy() if _is_torch(mask4) else np.asarray(mask4)
    dense = np.broadcast_to(dense, dense.shape[:2] + (L, S)).astype(np.bool_)
    bm = _from_dense_numpy(dense, (_CONVERT_BLOCK, _CONVERT_BLOCK), (L, S))
    partial = np.asarray(bm.kv_num_blocks).sum()
    total = np.asarray(bm.kv_num_blocks).size * bm.kv_indices.shape[-1]
    if 1.0 - partial / total < _CONVERT_MIN_SKIPPABLE:  # empty blocks are skipped, full ones skip the mask
        return None
    return bm.to(mask4.device) if _is_torch(mask4) else bm


def _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, block_mask, compiling=False):
    """Our layout views, the 4-d mask, the block mask and the options. compiling: under
    torch.compile, where only the device conversion of a mask can be traced."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"flashattn: {name}: expected (batch, heads, seqlen, head_dim), got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    is_causal = as_bool(is_causal, "is_causal")
    enable_gqa = as_bool(enable_gqa, "enable_gqa")
    dropout_p = as_float(dropout_p, "dropout_p")
    scale = as_float(scale, "scale", allow_none=True)
    B, Hq, L, E = query.shape
    Hkv, S = key.shape[1], key.shape[2]
    if Hq != Hkv and not enable_gqa:
        raise ValueError(f"flashattn: key: heads {Hkv} differ from query's {Hq}; pass enable_gqa=True for grouped-query attention")
    if is_causal and attn_mask is not None:
        raise ValueError("flashattn: attn_mask: is_causal=True and an explicit attn_mask are mutually exclusive (as in PyTorch)")
    causal, left, right, needs_band = _mask_rules(L, S, is_causal)
    bm = None
    if block_mask is not None:
        bm = as_block_mask(block_mask, B, Hq, L, S)
        if needs_band:
            raise NotImplementedError("flashattn: block_mask: is_causal with L < S and a block_mask: put the causal rule in the block mask")
    elif needs_band:
        bm = _top_left_causal_mask(L, S, query.device if _is_torch(query) else None)
    mask4 = None
    if attn_mask is not None:
        mask4 = attn_mask
        if mask4.ndim > 4:
            raise ValueError(f"flashattn: attn_mask: rank {mask4.ndim} > 4 is not broadcastable to (batch, heads, L, S)")
        while mask4.ndim < 4:
            mask4 = mask4[None]
        # Checked here as the native call would, since a converted mask never reaches it.
        if any(size != full and size != 1 for size, full in zip(mask4.shape, (B, Hq, L, S))):
            raise ValueError(f"flashattn: attn_mask: not broadcastable: expected [batch, heads_q, seqlen_q, seqlen_k] "
                             f"= [{B}, {Hq}, {L}, {S}] with 1 on broadcast dimensions, got {list(mask4.shape)}")
        if _is_torch(mask4) and _is_torch(query) and mask4.device != query.device:
            raise ValueError(f"flashattn: attn_mask: device mismatch: expected {query.device} (like query), got "
                             f"{mask4.device}")
        is_bool = str(mask4.dtype) in ("bool", "torch.bool", "uint8", "torch.uint8")
        if is_bool and bm is None:
            converted = _convert_dense(mask4, L, S, on_device=compiling)
            if converted is not None:
                bm, mask4 = converted, None
    q = query.transpose(1, 2) if _is_torch(query) else np.swapaxes(query, 1, 2)
    k = key.transpose(1, 2) if _is_torch(key) else np.swapaxes(key, 1, 2)
    v = value.transpose(1, 2) if _is_torch(value) else np.swapaxes(value, 1, 2)
    options = (scale, causal, left, right, dropout_p)
    return q, k, v, mask4, bm, options


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, block_mask=None):
    """PyTorch's scaled_dot_product_attention (see the module docstring); returns a
    (batch, heads, L, E) output like query."""
    if _is_torch(query):
        from flashattn import _torch_sdpa

        return _torch_sdpa.sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, block_mask)
    if not isinstance(query, np.ndarray):
        raise TypeError(f"flashattn: query: expected a torch.Tensor or a numpy.ndarray, got {type(query).__name__}")
    q, k, v, mask4, bm, (scale, causal, left, right, dropout_p) = _prepare(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, block_mask)
    out = np.empty(query.shape, dtype=query.dtype)  # (B, H, L, E); written through its (B, L, H, E) view
    # Seeded like flash_attn_func's NumPy path: flashattn.manual_seed replays the masks.
    seed, offset = _dropout.next_seed_offset() if dropout_p > 0 else (0, 0)
    _C.forward_masked(q, k, v, np.swapaxes(out, 1, 2), None, mask4, None if bm is None else bm._native_tuple(), scale,
                      causal, left, right, dropout_p, seed, offset, 0, None)
    return out
