"""FP8 (float8_e4m3fn) attention inputs: quantisation, and the explicit API for NumPy.

torch tensors: ``flash_attn_func`` / ``flash_attn_varlen_func`` take float8_e4m3fn q, k
and v directly, with FA3's ``q_descale``, ``k_descale``, ``v_descale`` keywords (float32
tensors [batch, nheads_k], size-1 dimensions broadcast, or Python floats), and return out
in bfloat16 (as FA3) plus the LSE as usual. There is no FP8 backward: backpropagating
through an FP8 call raises NotImplementedError naming the dtype. On the GPU the Hopper
FP8 kernel runs them (head dims 64/128/256, causal, window, softcap, GQA, varlen); the
CPU dequantises once and computes in float32 (every feature).

NumPy has no float8 dtype, so e4m3 codes travel in uint8 arrays, and only through this
module, where the meaning of the bytes is explicit: ``quantize_fp8`` returns (codes,
descale) and ``flash_attn_func`` here takes such codes. A uint8 array never reaches
``flashattn.flash_attn_func`` as FP8 (it is refused there with a pointer to this module).

Quantisation (``quantize_fp8``): descale[b, g] = amax / 448 over batch b and the heads of
group g (groups = heads_kv: FA3's [batch, nheads_k] descales; for q the query heads
sharing a kv head form the group), codes = e4m3(x / descale) rounded to nearest even
exactly as ``x.to(torch.float8_e4m3fn)``. With ``incoherent=True`` the head dimension is
first rotated by R = H diag(s) / sqrt(headdim) (Sylvester-Hadamard H, random signs s from
``seed``); R is orthogonal, so rotate q and k with the same seed and leave v alone: the
scores do not change, but outliers are spread before the amax is taken, lowering the
error (FA3's incoherent processing; headdim a power of two in [32, 256]). A varlen tensor
(total, nheads, headdim) is one batch: descale (1, groups), which broadcasts over the
sequences.
"""

import sys

import numpy as np

from flashattn import _C
from flashattn._arguments import as_bool, as_float, as_int, check_rank, lse_shape, window

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn value


def _is_torch_tensor(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _groups(x, heads_kv):
    heads = x.shape[-2]
    if heads_kv is None:
        return heads
    heads_kv = as_int(heads_kv, "heads_kv", 1)
    if heads % heads_kv != 0:
        raise ValueError(f"flashattn: heads_kv: must divide the heads of x ({heads}), got {heads_kv}")
    return heads_kv


def quantize_fp8(x, heads_kv=None, incoherent=False, seed=0):
    """(x_fp8, descale): x (batch, seqlen, nheads, headdim) or (total, nheads, headdim),
    float32/float16/bfloat16, as e4m3 codes with float32 descales (batch or 1, groups),
    groups = heads_kv (default nheads: one descale per head). torch tensors: x_fp8 is
    torch.float8_e4m3fn on x's device (CUDA tensors quantised by the native kernel, on the
    current stream); NumPy arrays: x_fp8 is a uint8 array of e4m3 codes."""
    incoherent = as_bool(incoherent, "incoherent")
    seed = as_int(seed, "seed", 0, 2**64 - 1)
    if x is None or not (_is_torch_tensor(x) or isinstance(x, np.ndarray)):
        raise TypeError(f"flashattn: x: expected a torch.Tensor or a numpy.ndarray, got {type(x).__name__}")
    if x.ndim not in (3, 4):
        raise ValueError(f"flashattn: x: expected rank 4 (batch, seqlen, nheads, headdim) or 3 (total, nheads, headdim), "
                         f"got shape {tuple(x.shape)}")
    groups = _groups(x, heads_kv)
    descale_shape = (x.shape[0] if x.ndim == 4 else 1, groups)
    if _is_torch_tensor(x):
        import torch

        codes = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        descale = torch.empty(descale_shape, dtype=torch.float32, device=x.device)
        # stream None: the native side asks torch's exchange API (torch >= 2.10) for the current stream.
        stream = None
        if x.is_cuda and not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
            stream = torch.cuda.current_stream(x.device).cuda_stream
        threads = min(torch.get_num_threads(), getattr(_C, "MAX_THREADS", 1024))
        _C.quantize_fp8(x, codes.view(torch.uint8), descale, incoherent, seed, threads, stream)
        return codes, descale
    codes = np.empty(x.shape, dtype=np.uint8)
    descale = np.empty(descale_shape, dtype=np.float32)
    _C.quantize_fp8(x, codes, descale, incoherent, seed, 0, 0)
    return codes, descale


def _decode_table():
    """float32 value of each of the 256 e4m3 codes (0x7f/0xff NaN, subnormals m * 2^-9)."""
    codes = np.arange(256)
    sign = np.where(codes >= 128, -1.0, 1.0)
    exponent, mantissa = (codes >> 3) & 15, codes & 7
    magnitude = np.where(exponent == 0, mantissa / 8.0 * 2.0**-6, (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7.0))
    magnitude = np.where((exponent == 15) & (mantissa == 7), np.nan, magnitude)
    return (sign * magnitude).astype(np.float32)


_DECODE = _decode_table()


def dequantize_fp8(x_fp8, descale):
    """float32 descale * value of each code, descale (batch or 1, groups) broadcast over
    the rows and the heads of each group: the inverse of quantize_fp8 up to its rounding
    (and, with incoherent=True, the rotation, which is left in place)."""
    if _is_torch_tensor(x_fp8):
        values = x_fp8.float()
        descale = descale.to(device=values.device, dtype=values.dtype)
    else:
        values = _DECODE[np.asarray(x_fp8, dtype=np.uint8)]
        descale = np.asarray(descale, dtype=np.float32)
    heads = values.shape[-2]
    groups = descale.shape[-1]
    per_head = descale.repeat_interleave(heads // groups, dim=-1) if _is_torch_tensor(values) else np.repeat(
        descale, heads // groups, axis=-1)
    if values.ndim == 4:
        return values * per_head[:, None, :, None]
    return values * per_head[0][None, :, None]


def flash_attn_func(q, k, v, q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, return_softmax_lse=False, out_dtype=np.float16,
                    cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0):
    """NumPy FP8 attention: q, k, v uint8 arrays of e4m3 codes (as quantize_fp8 returns),
    (batch, seqlen, nheads, headdim), or varlen (total, nheads, headdim) with int32
    cu_seqlens_q/k and max_seqlen_q/k; descales float32 arrays (batch, nheads_k) with
    size-1 dimensions broadcast, or floats, or None (1). Runs on the CPU. Returns out
    (float16, NumPy's only 16-bit float), or (out, softmax_lse float32) with
    return_softmax_lse=True."""
    for name, array in (("q", q), ("k", k), ("v", v)):
        if not isinstance(array, np.ndarray) or array.dtype != np.uint8:
            raise TypeError(f"flashattn: {name}: expected a uint8 numpy.ndarray of float8_e4m3fn codes, got "
                            f"{getattr(array, 'dtype', type(array).__name__)}")
    if np.dtype(out_dtype) != np.float16:
        raise TypeError(f"flashattn: out_dtype: NumPy FP8 attention writes float16 (NumPy has no bfloat16), got "
                        f"{np.dtype(out_dtype)}")
    is_varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    check_rank(q, "q", 3 if is_varlen else 4)
    descales = {}
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if value is None:
            descales[name] = None
        elif isinstance(value, np.ndarray):
            descales[name] = value
        else:
            descales[name] = np.full((1, 1), as_float(value, name), dtype=np.float32)
    window_left, window_right = window(window_size)
    out = np.empty(q.shape, dtype=np.float16)
    lse = np.empty(lse_shape(q, is_varlen), dtype=np.float32) if return_softmax_lse else None
    _C.forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, as_int(max_seqlen_q, "max_seqlen_q", 0),
               as_int(max_seqlen_k, "max_seqlen_k", 0), as_float(softmax_scale, "softmax_scale", allow_none=True),
               as_bool(causal, "causal"), window_left, window_right, as_float(softcap, "softcap"), "automatic", 0, 0,
               fp8=True, **descales)
    return (out, lse) if return_softmax_lse else out
