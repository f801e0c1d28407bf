"""PyTorch glue: a plain autograd.Function for eager training, custom ops for
torch.compile/opcheck, and a direct call for inference.

Imported only when a torch.Tensor reaches flashattn, so the package works without
PyTorch. Tensors go to the native module as they are: it reads them through DLPack's
C exchange API (torch.Tensor.__dlpack_c_exchange_api__, torch >= 2.10) with no capsule
and no Python code per tensor, and takes the current CUDA stream from the same table
(stream=None). Older torch gets DLPack capsules and the stream from Python. Outputs
are allocated here on the input's device and written in place.

Three routes to the same native calls (same kernels, bitwise the same results):
  * inference (no autograd graph needed): one native call, nothing else;
  * eager autograd: _FlashAttention, a torch.autograd.Function calling the native
    forward and backward directly (the custom op's autograd wrapper costs ~100 us
    per call in Python on small problems);
  * torch.compile tracing: the custom ops flashattn::_fwd / flashattn::_bwd, with
    register_fake and register_autograd, which dynamo and AOT autograd need.
"""

from typing import Optional, Tuple

import torch

from flashattn import _C
from flashattn._arguments import check_before_allocating, check_rank, kvcache_native_arguments, lse_shape

def _with_capsules(native):
    """`native` called with DLPack capsules and the stream looked up in Python: for torch
    without the C exchange API (before 2.10), where handing over tensors themselves
    would go through Tensor.__dlpack__, a Python method (several us per tensor)."""
    from torch.utils.dlpack import to_dlpack

    def call(*arguments, **keywords):
        *arrays, num_threads, stream = arguments
        if stream is None:
            stream = 0
            first = arrays[0]
            if first.is_cuda:
                stream = torch.cuda.current_stream(first.get_device()).cuda_stream
        capsule = lambda x: to_dlpack(x) if isinstance(x, torch.Tensor) else x  # noqa: E731
        native(*[capsule(x) for x in arrays], num_threads, stream, **{name: capsule(x) for name, x in keywords.items()})

    return call


if hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
    _forward_native = _C.forward
    _backward_native = _C.backward
    _kvcache_native = _C.forward_with_kvcache
    _merge_native = _C.merge_attention_states
else:
    _forward_native = _with_capsules(_C.forward)
    _backward_native = _with_capsules(_C.backward)
    _kvcache_native = _with_capsules(_C.forward_with_kvcache)
    _merge_native = _with_capsules(_C.merge_attention_states)

# stream argument of the native calls: the tensors' current stream, asked by the native side.
_CURRENT_STREAM = None

# num_threads of the native calls: torch's intra-op thread count, clamped to the native
# limit (torch.set_num_threads accepts more than the native num_threads range, and a torch
# setting must not make every CPU call fail). A num_threads the user passes to the native
# API itself is still checked (and rejected out of range) there.
_MAX_NATIVE_THREADS = getattr(_C, "MAX_THREADS", 1024)
_torch_get_num_threads = torch.get_num_threads  # looked up once: module attribute lookups cost per call


def _get_num_threads():
    n = _torch_get_num_threads()
    return n if n <= _MAX_NATIVE_THREADS else _MAX_NATIVE_THREADS


def _new_workspace_for(device):
    """A callable(nbytes) -> uint8 scratch on `device`; the native call asks it only when needed."""
    return lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, device=device)


def _check_tensors(like, **tensors):
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"flashattn: {name}: expected a torch.Tensor like {like}, got "
                            f"{'None' if tensor is None else type(tensor).__name__}")


def _empty_outputs(q, is_varlen, need_lse=True):
    """out like q (empty_like, as flash_attn allocates it: q's strides when q is dense,
    row-major otherwise) and the float32 LSE. The fake ops use this too, so traced and
    real outputs agree."""
    out = torch.empty_like(q)
    lse = torch.empty(lse_shape(q, is_varlen), dtype=torch.float32, device=q.device) if need_lse else None
    return out, lse


def _variant_keywords(alibi_slopes, dropout_p, seed_offset):
    """The native calls' ALiBi/dropout keywords (none when both are off: the fast path)."""
    if alibi_slopes is None and not dropout_p:
        return {}
    return {"alibi_slopes": alibi_slopes, "dropout_p": dropout_p, "dropout_seed_offset": seed_offset}


def draw_seed_offset(device):
    """Dropout's (seed, offset) from torch's generator of `device`, as an int64 tensor on
    that device read by the kernel at run time: torch.manual_seed replays it, and a
    captured CUDA graph draws new ones on each replay (as PyTorch's own dropout)."""
    return torch.randint(0, 2**62, (2,), dtype=torch.int64, device=device)


def _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
             window_right, softcap, need_lse=True, alibi_slopes=None, dropout_p=0.0, seed_offset=None):
    is_varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    check_rank(q, "q", 3 if is_varlen else 4)
    out, lse = _empty_outputs(q, is_varlen, need_lse)
    _forward_native(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                    window_left, window_right, softcap, "automatic", _get_num_threads(), _CURRENT_STREAM,
                    **_variant_keywords(alibi_slopes, dropout_p, seed_offset))
    return out, lse


def _empty_gradients(q, k, v):
    """dq, dk, dv like q, k, v (empty_like; the fake and the real op agree)."""
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
              window_left, window_right, softcap, deterministic, alibi_slopes=None, dropout_p=0.0, seed_offset=None):
    if dout.stride(-1) != 1:  # autograd may hand us an expanded gradient
        dout = dout.contiguous()
    dq, dk, dv = _empty_gradients(q, k, v)
    # The workspace callable is asked only on the GPU and only when the pass needs scratch.
    _backward_native(q, k, v, out, dout, lse, dq, dk, dv, _new_workspace_for(q.device), cu_seqlens_q, cu_seqlens_k,
                     max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
                     deterministic, "automatic", _get_num_threads(), _CURRENT_STREAM,
                     **_variant_keywords(alibi_slopes, dropout_p, seed_offset))
    return dq, dk, dv


# --- eager autograd -------------------------------------------------------------------------------


class _FlashAttention(torch.autograd.Function):
    """Eager autograd without the custom op's per-call Python machinery. The options
    travel as one tuple: (max_seqlen_q, max_seqlen_k, softmax_scale, causal,
    window_left, window_right, softcap, deterministic, need_lse, dropout_p). Returns out,
    or (out, lse) with need_lse; the LSE is computed and saved for the backward either
    way, and so are the ALiBi slopes and dropout's seed/offset tensor (the backward
    regenerates the same mask)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, options, alibi_slopes=None, seed_offset=None):
        (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, _, need_lse,
         dropout_p) = options
        # _forward inlined (the rank was checked by the caller): every call level costs here.
        out = torch.empty_like(q)
        lse = torch.empty(lse_shape(q, cu_seqlens_q is not None or cu_seqlens_k is not None), dtype=torch.float32,
                          device=q.device)
        _forward_native(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                        causal, window_left, window_right, softcap, "automatic", _get_num_threads(),
                        _CURRENT_STREAM, **_variant_keywords(alibi_slopes, dropout_p, seed_offset))
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, seed_offset)
        ctx.options = options
        return (out, lse) if need_lse else out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, *unused_dlse):
        # No gradient flows through the LSE output (as in flash_attn).
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, seed_offset = ctx.saved_tensors
        dq, dk, dv = _backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.options[:8], alibi_slopes,
                               ctx.options[9], seed_offset)
        return dq, dk, dv, None, None, None, None, None


# Function.apply's Python wrapper exists for functorch transforms (vmap/grad over this
# function) and pytree-walks every argument on each call (several us). Outside a
# transform the C implementation underneath is called directly.
_function_base_apply = getattr(getattr(torch._C, "_FunctionBase", None), "__dict__", {}).get("apply")
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)
if _function_base_apply is not None and _transforms_active is not None:
    _apply_flash_attention_directly = _function_base_apply.__get__(None, _FlashAttention)

    def _flash_attention_apply(*arguments):
        if _transforms_active():
            return _FlashAttention.apply(*arguments)
        return _apply_flash_attention_directly(*arguments)
else:
    _flash_attention_apply = _FlashAttention.apply


# --- custom ops: torch.compile, opcheck ------------------------------------------------------------


@torch.library.custom_op("flashattn::_fwd", mutates_args=())
def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
         cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: Optional[float],
         causal: bool, window_left: int, window_right: int, softcap: float, deterministic: bool,
         alibi_slopes: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
         seed_offset: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    # deterministic is a backward option; the forward op carries it so the gradient sees it.
    return _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                    window_left, window_right, softcap, True, alibi_slopes, dropout_p, seed_offset)


@_fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
              window_right, softcap, deterministic, alibi_slopes=None, dropout_p=0.0, seed_offset=None):
    is_varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    check_rank(q, "q", 3 if is_varlen else 4)
    return _empty_outputs(q, is_varlen)


@torch.library.custom_op("flashattn::_bwd", mutates_args=())
def _bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
         lse: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
         max_seqlen_q: int, max_seqlen_k: int, softmax_scale: Optional[float], causal: bool, window_left: int,
         window_right: int, softcap: float, deterministic: bool, alibi_slopes: Optional[torch.Tensor] = None,
         dropout_p: float = 0.0,
         seed_offset: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                     causal, window_left, window_right, softcap, deterministic, alibi_slopes, dropout_p, seed_offset)


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
              window_left, window_right, softcap, deterministic, alibi_slopes=None, dropout_p=0.0, seed_offset=None):
    return _empty_gradients(q, k, v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k = inputs[:5]
    alibi_slopes, dropout_p, seed_offset = (list(inputs[13:]) + [None, 0.0, None][len(inputs) - 13:])[:3]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, seed_offset)
    ctx.options = inputs[5:13]  # max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, deterministic
    ctx.dropout_p = dropout_p


def _op_backward(ctx, dout, dlse):
    # No gradient flows through the LSE output (as in flash_attn).
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, seed_offset = ctx.saved_tensors
    dq, dk, dv = _bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.options, alibi_slopes, ctx.dropout_p,
                      seed_offset)
    return (dq, dk, dv) + (None,) * 13


_fwd.register_autograd(_op_backward, setup_context=_setup_context)


# --- the entry point of interface.py ---------------------------------------------------------------


# Looked up once: attribute lookups on the torch module cost on every call.
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled


def _paged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     window_left, window_right, softcap, need_lse, block_table, alibi_slopes=None, dropout_p=None):
    """Forward over a paged KV cache (flash_attn_varlen_func(..., block_table=)): no
    backward pass reads one (as in flash_attn), so gradients are refused loudly. With
    ALiBi or dropout keywords: (out, lse, seed_offset)."""
    if _is_grad_enabled() and (q.requires_grad or getattr(k, "requires_grad", False)
                               or getattr(v, "requires_grad", False)):
        raise NotImplementedError("flashattn: block_table: a paged KV cache is forward only (no gradient); "
                                  "call under torch.no_grad() or detach q/k/v")
    check_rank(q, "q", 3)
    seed_offset = draw_seed_offset(q.device) if dropout_p else None
    out = torch.empty_like(q)
    lse = torch.empty(lse_shape(q, True), dtype=torch.float32, device=q.device) if need_lse else None
    _forward_native(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                    window_left, window_right, softcap, "automatic", _get_num_threads(), _CURRENT_STREAM,
                    block_table=block_table, **_variant_keywords(alibi_slopes, dropout_p or 0.0, seed_offset))
    if dropout_p is None and alibi_slopes is None:
        return out, lse
    return out, lse, seed_offset


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
              window_right, softcap, deterministic, need_lse, block_table=None, **variants):
    """(out, lse) for torch tensors; lse is None unless need_lse (or while compiling).
    Every array argument is checked to be a torch.Tensor by the native call. With
    ALiBi or dropout (keywords alibi_slopes, dropout_p): (out, lse, seed_offset)."""
    if block_table is not None:
        return _paged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                                window_left, window_right, softcap, need_lse, block_table, **variants)
    if variants:
        return _attention_with_variants(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                        causal, window_left, window_right, softcap, deterministic, need_lse, **variants)
    if _is_compiling():
        return _fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                    window_left, window_right, softcap, deterministic)
    is_varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if q.ndim != (3 if is_varlen else 4):
        check_rank(q, "q", 3 if is_varlen else 4)
    if q.stride(-1) != 1:  # e.g. an expanded head_dim: refused before out is allocated
        check_before_allocating(q)
    if _is_grad_enabled() and (q.requires_grad or getattr(k, "requires_grad", False)
                               or getattr(v, "requires_grad", False)):
        result = _flash_attention_apply(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                        (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                                         softcap, deterministic, need_lse, 0.0))
        return result if need_lse else (result, None)
    out = torch.empty_like(q)
    lse = torch.empty(lse_shape(q, is_varlen), dtype=torch.float32, device=q.device) if need_lse else None
    _forward_native(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                    window_left, window_right, softcap, "automatic", _get_num_threads(), _CURRENT_STREAM)
    return out, lse


def _attention_with_variants(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                             window_left, window_right, softcap, deterministic, need_lse, alibi_slopes=None,
                             dropout_p=0.0):
    """attention() with ALiBi and/or dropout: (out, lse, seed_offset)."""
    if alibi_slopes is not None and not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"flashattn: alibi_slopes: expected a torch.Tensor like q, got {type(alibi_slopes).__name__}")
    seed_offset = draw_seed_offset(q.device) if dropout_p > 0.0 else None
    if _is_compiling():
        out, lse = _fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                        window_left, window_right, softcap, deterministic, alibi_slopes, dropout_p, seed_offset)
        return out, lse, seed_offset
    is_varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    check_rank(q, "q", 3 if is_varlen else 4)
    if q.stride(-1) != 1:
        check_before_allocating(q)
    if _is_grad_enabled() and (q.requires_grad or getattr(k, "requires_grad", False)
                               or getattr(v, "requires_grad", False)):
        out, lse = _flash_attention_apply(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                          (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                                           window_right, softcap, deterministic, True, dropout_p),
                                          alibi_slopes, seed_offset)
        return out, (lse if need_lse else None), seed_offset
    out, lse = _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                        window_left, window_right, softcap, need_lse, alibi_slopes, dropout_p, seed_offset)
    return out, lse, seed_offset


# --- FP8 (float8_e4m3fn) inputs: forward only --------------------------------------------------


FLOAT8_E4M3 = getattr(torch, "float8_e4m3fn", None)  # torch >= 2.1
_FP8_BACKWARD_MESSAGE = "flashattn: q: float8_e4m3fn: the backward pass does not support FP8"


class _Fp8Attention(torch.autograd.Function):
    """An FP8 forward inside an autograd graph: the output takes part in the graph (so a
    loss can be built on it), and backpropagating into q/k/v raises, naming the dtype."""

    @staticmethod
    def forward(ctx, q, k, v, run):
        return run()

    @staticmethod
    def backward(ctx, *unused_grads):
        raise NotImplementedError(_FP8_BACKWARD_MESSAGE)


def _descale_tensor(value, name, device):
    """A descale keyword as the native call takes it: a tensor as given, a Python number as
    a float32 (1, 1) tensor on q's device (size-1 dimensions broadcast to [batch, heads_kv])."""
    if value is None or isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"flashattn: {name}: expected a float32 torch.Tensor (batch, nheads_k) or a float, got "
                        f"{type(value).__name__}")
    return torch.full((1, 1), float(value), dtype=torch.float32, device=device)


def fp8_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                  window_right, softcap, need_lse, q_descale, k_descale, v_descale, block_table=None,
                  alibi_slopes=None, dropout_p=0.0):
    """(out bfloat16, lse, seed_offset) for float8_e4m3fn q/k/v (FA3 returns bfloat16). The
    codes reach the native call as uint8 views with fp8=True, whatever torch's DLPack says
    about float8. Eager only (no torch.compile op)."""
    for name, tensor in (("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float8_e4m3fn:
            raise TypeError(f"flashattn: {name}: dtype mismatch: expected float8_e4m3fn (like q), got "
                            f"{getattr(tensor, 'dtype', type(tensor).__name__)}")
    is_varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    check_rank(q, "q", 3 if is_varlen else 4)
    check_before_allocating(q)
    descales = {name: _descale_tensor(value, name, q.device)
                for name, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))}
    seed_offset = draw_seed_offset(q.device) if dropout_p > 0.0 else None
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(lse_shape(q, is_varlen), dtype=torch.float32, device=q.device) if need_lse else None

    def run():
        _forward_native(q.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8), out, lse, cu_seqlens_q,
                        cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                        softcap, "automatic", _get_num_threads(), _CURRENT_STREAM, block_table=block_table,
                        fp8=True, **descales, **_variant_keywords(alibi_slopes, dropout_p, seed_offset))
        return out

    if _is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _Fp8Attention.apply(q, k, v, run), lse, seed_offset
    return run(), lse, seed_offset


def _kvcache_keywords(alibi_slopes, k_descale, v_descale, cache_is_fp8):
    """The native call's keywords past flash_attn 2's arguments, only those in use."""
    keywords = {}
    if alibi_slopes is not None:
        keywords["alibi_slopes"] = alibi_slopes
    if k_descale is not None:
        keywords["k_descale"] = k_descale
    if v_descale is not None:
        keywords["v_descale"] = v_descale
    if cache_is_fp8:
        keywords["cache_is_fp8"] = True
    return keywords


def _as_descale(descale, name, device):
    """A descale keyword (a tensor, a 0-d or 1-element one, or a float) as the native call
    takes it: one value becomes the (1, 1) view the native side broadcasts."""
    descale = _descale_tensor(descale, name, device)
    if isinstance(descale, torch.Tensor) and descale.ndim < 2 and descale.numel() == 1:
        return descale.reshape(1, 1)
    return descale


def _fp8_bytes(tensor):
    """A float8_e4m3fn cache (or new rows) as its bytes: not every DLPack exports float8."""
    return tensor.view(torch.uint8) if isinstance(tensor, torch.Tensor) and tensor.dtype == FLOAT8_E4M3 else tensor


def _kvcache_forward(*arguments, need_lse=True, alibi_slopes=None, k_descale=None, v_descale=None):
    q, k_cache, v_cache, k, v = arguments[:5]
    check_rank(q, "q", 4)
    check_before_allocating(q)
    out, lse = _empty_outputs(q, False, need_lse)
    cache_is_fp8 = FLOAT8_E4M3 is not None and (k_cache.dtype == FLOAT8_E4M3 or v_cache.dtype == FLOAT8_E4M3)
    if cache_is_fp8:
        if k_cache.dtype != v_cache.dtype:
            name = "v_cache" if k_cache.dtype == FLOAT8_E4M3 else "k_cache"
            raise TypeError(f"flashattn: {name}: an FP8 cache has k_cache and v_cache both in float8_e4m3fn, "
                            f"got {k_cache.dtype} and {v_cache.dtype}")
        arguments = (q, _fp8_bytes(k_cache), _fp8_bytes(v_cache), _fp8_bytes(k), _fp8_bytes(v)) + tuple(arguments[5:])
    # The workspace callable is asked only on the GPU and only when the call splits.
    _kvcache_native(*kvcache_native_arguments(arguments, out, lse), _new_workspace_for(q.device), _get_num_threads(),
                    _CURRENT_STREAM, **_kvcache_keywords(alibi_slopes, _as_descale(k_descale, "k_descale", q.device),
                                                         _as_descale(v_descale, "v_descale", q.device),
                                                         cache_is_fp8))
    return out, lse


@torch.library.custom_op("flashattn::_kvcache", mutates_args=("k_cache", "v_cache"))
def _kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
             v: Optional[torch.Tensor], rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
             cache_seqlens: Optional[torch.Tensor], uniform_cache_seqlen: Optional[int],
             cache_batch_idx: Optional[torch.Tensor], cache_leftpad: Optional[torch.Tensor],
             block_table: Optional[torch.Tensor], softmax_scale: Optional[float], causal: bool, window_left: int,
             window_right: int, softcap: float, rotary_interleaved: bool, num_splits: int,
             alibi_slopes: Optional[torch.Tensor] = None, k_descale: Optional[torch.Tensor] = None,
             v_descale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    return _kvcache_forward(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, uniform_cache_seqlen,
                            cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window_left,
                            window_right, softcap, rotary_interleaved, num_splits, alibi_slopes=alibi_slopes,
                            k_descale=k_descale, v_descale=v_descale)


@_kvcache.register_fake
def _kvcache_fake(q, *rest, **keywords):
    check_rank(q, "q", 4)
    return _empty_outputs(q, False)


def with_kvcache(q, k_cache, v_cache, *rest, need_lse, alibi_slopes=None, k_descale=None, v_descale=None):
    """(out, lse) for flash_attn_with_kvcache; the custom op only while compiling.
    Without it, lse is None unless need_lse."""
    if _is_compiling():
        return _kvcache(q, k_cache, v_cache, *rest, alibi_slopes=alibi_slopes, k_descale=k_descale, v_descale=v_descale)
    return _kvcache_forward(q, k_cache, v_cache, *rest, need_lse=need_lse, alibi_slopes=alibi_slopes, k_descale=k_descale,
                            v_descale=v_descale)


@torch.library.custom_op("flashattn::_merge", mutates_args=())
def _merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
           lse_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    out, lse = _merge_fake(out_a, lse_a, out_b, lse_b)
    _merge_native(out_a, lse_a, out_b, lse_b, out, lse, _get_num_threads(), _CURRENT_STREAM)
    return out, lse


@_merge.register_fake
def _merge_fake(out_a, lse_a, out_b, lse_b):
    check_rank(out_a, "out_a", 4)
    out = torch.empty_like(out_a)
    lse = torch.empty((out_a.shape[0], out_a.shape[2], out_a.shape[1]), dtype=torch.float32, device=out_a.device)
    return out, lse


def merge_attention_states(out_a, lse_a, out_b, lse_b):
    _check_tensors("out_a", lse_a=lse_a, out_b=out_b, lse_b=lse_b)
    return _merge(out_a, lse_a, out_b, lse_b)
