"""The flash_attn 2.x functions: same names, arguments, defaults, layouts and returns.

Layouts (flash_attn's):
  q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k, headdim);
  nheads a multiple of nheads_k (GQA/MQA). Varlen: q (total_q, nheads, headdim) with
  cu_seqlens_q int32 (batch + 1,) prefix sums, and likewise for k/v.
  softmax_lse: float32 (batch, nheads, seqlen_q), varlen (nheads, total_q), natural log.

Causal masks and sliding windows are aligned to the bottom-right corner (flash_attn
>= 2.1): with seqlen_q != seqlen_k, query row i sees key j iff j <= i + seqlen_k - seqlen_q.
causal=True with a window keeps window_size[0] and uses window_size[1] = 0 (as flash_attn).

Dropout (dropout_p > 0) drops each probability with probability dropout_p and scales
the kept ones by 1/(1 - dropout_p); the mask depends only on (seed, offset, batch,
head, row, column), so the CPU and every GPU kernel draw the same one. torch tensors
take the seed and offset from torch's generator (torch.manual_seed replays a run; CUDA
graphs draw a fresh mask on each replay); NumPy inputs from flashattn.manual_seed.
alibi_slopes: float32 (nheads,) or (batch, nheads), bias -slope * |i + seqlen_k - seqlen_q - j|.
return_attn_probs=True returns (out, softmax_lse, S_dmask) as flash_attn does: with
dropout, S_dmask (batch, nheads, seqlen_q and seqlen_k rounded up to 128) holds the
probabilities with the dropped entries negated (computed separately, for tests; slow);
without dropout it is None.

Differences from flash_attn:
  * No gradient flows through softmax_lse (as in flash_attn).
  * softcap may be combined with dropout (flash_attn refuses it).
"""

import sys

import numpy as np

from flashattn import _C, _dropout
from flashattn._arguments import (
    allocation_error,
    as_bool,
    as_float,
    as_int,
    check_before_allocating,
    check_not_none,
    check_rank,
    kvcache_native_arguments,
    lse_shape,
    shape_string,
    window,
)

_torch_backend = None  # flashattn._torch_ops, imported on the first torch.Tensor
_torch_tensor_type = None  # torch.Tensor, from then on: one isinstance on the hot path


def _torch_ops():
    global _torch_backend, _torch_tensor_type
    if _torch_backend is None:
        from flashattn import _torch_ops as module

        _torch_backend, _torch_tensor_type = module, module.torch.Tensor
    return _torch_backend


def _is_torch_tensor(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)




def _numpy_outputs(q, lse_shape_or_none):
    """out like q and the float32 LSE, allocated only once q's layout allows an output."""
    check_before_allocating(q)
    try:
        out = np.empty(q.shape, dtype=q.dtype)
    except MemoryError as e:
        raise allocation_error("out", q.shape, q.dtype.itemsize, e) from None
    if lse_shape_or_none is None:
        return out, None
    try:
        return out, np.empty(lse_shape_or_none, dtype=np.float32)
    except MemoryError as e:
        raise allocation_error("lse", lse_shape_or_none, 4, e) from None


def _numpy_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                   window_left, window_right, softcap, need_lse, alibi_slopes=None, dropout_p=0.0, seed_offset=None,
                   block_table=None):
    is_varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    check_rank(q, "q", 3 if is_varlen else 4)
    out, lse = _numpy_outputs(q, lse_shape(q, is_varlen) if need_lse else None)
    if dropout_p == 0.0 and alibi_slopes is None:
        _C.forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                   window_left, window_right, softcap, "automatic", 0, 0, block_table=block_table)
    else:
        _C.forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                   window_left, window_right, softcap, "automatic", 0, 0, block_table=block_table,
                   alibi_slopes=alibi_slopes, dropout_p=dropout_p, dropout_seed=seed_offset[0],
                   dropout_offset=seed_offset[1])
    return out, lse


_DESCALE_NAMES = ("q_descale", "k_descale", "v_descale")


def _fp8_attention(torch_ops, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                   causal, window_left, window_right, softcap, alibi_slopes, return_attn_probs, block_table, descales):
    """flash_attn_func / flash_attn_varlen_func with float8_e4m3fn torch tensors (FA3's FP8
    call): out bfloat16; descales float32 tensors (batch, nheads_k) or floats."""
    if return_attn_probs and dropout_p > 0.0:
        raise NotImplementedError("flashattn: return_attn_probs: S_dmask is not computed for float8_e4m3fn inputs; "
                                  "call without return_attn_probs")
    out, lse, _ = torch_ops.fp8_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                          softmax_scale, causal, window_left, window_right, softcap,
                                          bool(return_attn_probs), *descales, block_table=block_table,
                                          alibi_slopes=alibi_slopes, dropout_p=dropout_p)
    return (out, lse, None) if return_attn_probs else out


def _check_descales(q, descales):
    """Descales belong to FP8 inputs only; NumPy FP8 codes go through flashattn.fp8."""
    if isinstance(q, np.ndarray) and q.dtype == np.uint8:
        raise TypeError("flashattn: q: uint8 arrays are not attention inputs; for float8_e4m3fn codes in NumPy "
                        "use flashattn.fp8.flash_attn_func (NumPy has no float8 dtype)")
    for name, value in zip(_DESCALE_NAMES, descales):
        if value is not None:
            raise ValueError(f"flashattn: {name}: given, but the inputs are not float8_e4m3fn (descales apply to FP8 "
                             f"inputs only)")


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
               window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table=None,
               descales=(None, None, None)):
    if type(dropout_p) is not float or dropout_p != 0.0:
        dropout_p = _dropout.check_dropout_p(dropout_p)
    if type(window_size) is tuple and window_size == (-1, -1):  # the default, inline on the hot path
        window_left = window_right = -1
    else:
        window_left, window_right = window(window_size)
    if softmax_scale is not None:
        softmax_scale = as_float(softmax_scale, "softmax_scale")
    if type(softcap) is not float:
        softcap = as_float(softcap, "softcap")
    if type(causal) is not bool:
        causal = as_bool(causal, "causal")
    if type(deterministic) is not bool:
        deterministic = as_bool(deterministic, "deterministic")
    if k is None or v is None:
        check_not_none("k", k)
        check_not_none("v", v)
    # The LSE is computed only when returned, or saved for the backward pass.
    need_lse = bool(return_attn_probs)
    is_torch = (_torch_tensor_type is not None and isinstance(q, _torch_tensor_type)) or _is_torch_tensor(q)
    if is_torch:
        torch_ops = _torch_backend or _torch_ops()
        if q.dtype is torch_ops.FLOAT8_E4M3:
            return _fp8_attention(torch_ops, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                                  return_attn_probs, block_table, descales)
    if descales[0] is not None or descales[1] is not None or descales[2] is not None:
        _check_descales(q, descales)
    if is_torch:
        if dropout_p == 0.0 and alibi_slopes is None:
            out, lse = torch_ops.attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                           softmax_scale, causal, window_left, window_right, softcap, deterministic,
                                           need_lse, block_table=block_table)
        else:
            out, lse, seed_offset = torch_ops.attention(
                q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                window_right, softcap, deterministic, need_lse, block_table=block_table, alibi_slopes=alibi_slopes,
                dropout_p=dropout_p)
    elif isinstance(q, np.ndarray):
        seed_offset = _dropout.next_seed_offset() if dropout_p > 0.0 else (0, 0)
        out, lse = _numpy_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                  causal, window_left, window_right, softcap, need_lse, alibi_slopes, dropout_p,
                                  seed_offset, block_table=block_table)
    else:
        raise TypeError(f"flashattn: q: expected a torch.Tensor or a numpy.ndarray, got {type(q).__name__}")
    if not return_attn_probs:
        return out
    if dropout_p == 0.0:
        return out, lse, None
    if block_table is not None:
        raise NotImplementedError("flashattn: return_attn_probs: S_dmask is not computed for a paged KV cache "
                                  "(block_table); call without return_attn_probs")
    return out, lse, _attention_probabilities(q, k, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left,
                                              window_right, softcap, alibi_slopes, dropout_p, seed_offset, is_torch)


def _attention_probabilities(q, k, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap,
                             alibi_slopes, dropout_p, seed_offset, is_torch):
    """S_dmask for return_attn_probs (testing only: computed apart from the kernels, in float64)."""
    def host(x):
        if x is None or not is_torch:
            return x
        return x.detach().float().cpu().numpy()

    if is_torch:
        seed, offset = (int(x) for x in seed_offset.cpu().tolist())
    else:
        seed, offset = seed_offset
    probabilities = _dropout.attention_probabilities(host(q), host(k), softmax_scale, causal, window_left, window_right,
                                                     softcap, host(alibi_slopes), dropout_p, seed, offset,
                                                     host(cu_seqlens_q), host(cu_seqlens_k))
    if is_torch:
        import torch

        return torch.from_numpy(probabilities).to(device=q.device, dtype=q.dtype)
    return probabilities.astype(q.dtype)


def _unpack(packed, name, dim, count):
    """The `count` views of `packed` along `dim` (q, k, v or k, v), never copies. For torch,
    unbind: its gradient is one stack into the packed gradient, not a zero-filled copy per slice."""
    rank = dim + 3
    if not (_is_torch_tensor(packed) or isinstance(packed, np.ndarray)):
        raise TypeError(f"flashattn: {name}: expected a torch.Tensor or a numpy.ndarray, got "
                        f"{'None' if packed is None else type(packed).__name__}")
    if packed.ndim != rank or packed.shape[dim] != count:
        raise ValueError(f"flashattn: {name}: expected rank {rank} with size {count} in dimension {dim}, got shape "
                         f"{shape_string(packed.shape)}")
    if _is_torch_tensor(packed):
        return packed.unbind(dim)
    return tuple(np.moveaxis(packed, dim, 0))


def _max_seqlen(value, name):
    return value if type(value) is int and 0 <= value <= 0x7FFFFFFFFFFFFFFF else as_int(value, name)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, q_descale=None, k_descale=None,
                    v_descale=None):
    """Attention over q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k, headdim).

    softmax_scale defaults to 1/sqrt(headdim); window_size=(left, right), -1 = unbounded;
    softcap > 0 applies softcap * tanh(scores / softcap). Returns out (like q), or
    (out, softmax_lse, None) with return_attn_probs=True.

    FP8 (FA3's): torch.float8_e4m3fn q/k/v with q_descale/k_descale/v_descale (float32
    (batch, nheads_k) tensors, size-1 dimensions broadcast, or floats; None = 1); out is
    bfloat16; forward only (see flashattn.fp8).
    """
    if q_descale is None and k_descale is None and v_descale is None:
        return _attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap,
                          alibi_slopes, deterministic, return_attn_probs)
    return _attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs, descales=(q_descale, k_descale, v_descale))


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, q_descale=None,
                           k_descale=None, v_descale=None):
    """Attention over packed variable-length sequences: q (total_q, nheads, headdim),
    k/v (total_k, nheads_k, headdim), cu_seqlens_* int32 (batch + 1,). FP8 as in
    flash_attn_func (descales (batch, nheads_k): one per sequence and kv head)."""
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, _max_seqlen(max_seqlen_q, "max_seqlen_q"), _max_seqlen(max_seqlen_k, "max_seqlen_k"), dropout_p,
                      softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                      block_table, descales=(q_descale, k_descale, v_descale))


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv (batch, seqlen, 3, nheads, headdim); q, k and v are strided views, not copies."""
    q, k, v = _unpack(qkv, "qkv", 2, 3)
    return _attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (batch, seqlen_q, nheads, headdim), kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    k, v = _unpack(kv, "kv", 2, 2)
    return _attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv (total, 3, nheads, headdim), cu_seqlens int32 (batch + 1,)."""
    q, k, v = _unpack(qkv, "qkv", 1, 3)
    return _attention(q, k, v, cu_seqlens, cu_seqlens, _max_seqlen(max_seqlen, "max_seqlen"), _max_seqlen(max_seqlen, "max_seqlen"), dropout_p, softmax_scale,
                      causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (total_q, nheads, headdim), kv (total_k, 2, nheads_k, headdim)."""
    k, v = _unpack(kv, "kv", 1, 2)
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, _max_seqlen(max_seqlen_q, "max_seqlen_q"), _max_seqlen(max_seqlen_k, "max_seqlen_k"), dropout_p,
                      softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
                            k_descale=None, v_descale=None):
    """Decoding attention of q (batch, seqlen_q, nheads, headdim) over a KV cache.

    k_cache/v_cache: (batch_cache, seqlen_cache, nheads_k, headdim), or paged
    (num_blocks, page_size, nheads_k, headdim) with block_table int32 (batch, max_blocks).
    k/v (batch, seqlen_new, nheads_k, headdim), when given, are written into the cache
    in place at positions cache_seqlens[b]... (rotated first with rotary_cos/sin) and
    attended to. cache_seqlens: int32 (batch,) tensor or one int. No autograd.
    FP8 cache (torch.float8_e4m3fn k_cache and v_cache, q float16/bfloat16): a cached
    key is k_descale * k_cache (v likewise); k_descale/v_descale (FA3's names): float32
    (batch, nheads_k), one value (a 0-d or 1-element tensor), or None (1). New k/v in
    q's dtype are quantised on append: e4m3(x / descale), round to nearest even,
    saturating at +-448 (after the rotary); float8_e4m3fn k/v are copied.
    Returns out, or (out, softmax_lse) with return_softmax_lse=True.
    """
    window_left, window_right = window(window_size)
    softmax_scale = as_float(softmax_scale, "softmax_scale", allow_none=True)
    check_not_none("k_cache", k_cache)
    check_not_none("v_cache", v_cache)
    uniform_cache_seqlen = None
    if cache_seqlens is not None and getattr(cache_seqlens, "ndim", 0) == 0:  # one length for every sequence
        uniform_cache_seqlen, cache_seqlens = as_int(cache_seqlens, "cache_seqlens"), None
    arguments = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, uniform_cache_seqlen,
                 cache_batch_idx, cache_leftpad, block_table, softmax_scale, as_bool(causal, "causal"), window_left,
                 window_right, as_float(softcap, "softcap"), as_bool(rotary_interleaved, "rotary_interleaved"),
                 as_int(num_splits, "num_splits", -(2**31), 2**31 - 1))
    return_softmax_lse = as_bool(return_softmax_lse, "return_softmax_lse")
    if _is_torch_tensor(q):
        out, lse = _torch_ops().with_kvcache(*arguments, need_lse=return_softmax_lse, alibi_slopes=alibi_slopes,
                                             k_descale=k_descale, v_descale=v_descale)
    elif isinstance(q, np.ndarray):
        check_rank(q, "q", 4)
        out, lse = _numpy_outputs(q, lse_shape(q, False) if return_softmax_lse else None)
        _C.forward_with_kvcache(*kvcache_native_arguments(arguments, out, lse), None, 0, 0, alibi_slopes=alibi_slopes,
                                k_descale=k_descale, v_descale=v_descale)
    else:
        raise TypeError(f"flashattn: q: expected a torch.Tensor or a numpy.ndarray, got {type(q).__name__}")
    return (out, lse) if return_softmax_lse else out


def merge_attention_states(out_a, lse_a, out_b, lse_b):
    """Combine two attentions of the same queries over disjoint key sets (e.g. two halves
    of a split KV cache) by their LSEs. out_* (batch, seqlen, nheads, headdim), lse_*
    float32 (batch, nheads, seqlen). Returns (out, lse); no autograd."""
    if _is_torch_tensor(out_a):
        return _torch_ops().merge_attention_states(out_a, lse_a, out_b, lse_b)
    if isinstance(out_a, np.ndarray):
        check_rank(out_a, "out_a", 4)
        for name, value in (("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
            check_not_none(name, value, "out_a")
        out, lse = _numpy_outputs(out_a, (out_a.shape[0], out_a.shape[2], out_a.shape[1]))
        _C.merge_attention_states(out_a, lse_a, out_b, lse_b, out, lse, 0, 0)
        return out, lse
    raise TypeError(f"flashattn: out_a: expected a torch.Tensor or a numpy.ndarray, got {type(out_a).__name__}")
