"""PyTorch glue: custom ops (autograd, torch.compile, opcheck) and a direct fast path.

Imported only when a torch.Tensor reaches flashattn, so the package works without
PyTorch. Tensors cross into the native module as DLPack capsules; outputs are
allocated here with torch.empty on the input's device and written in place.

Two routes to the same native call:
  * the custom op flashattn::_fwd (+ flashattn::_bwd for its gradient), used when
    autograd needs a graph or torch.compile is tracing;
  * a direct call otherwise (inference), which skips the dispatcher's overhead
    (several microseconds per call) so small problems are not bound by Python.
"""

from typing import Optional, Tuple

import torch
# A C function: several times cheaper per tensor than Tensor.__dlpack__ (a Python
# method that also handles a stream hand-off, which we do not need: the kernels run on
# the caller's current stream).
from torch.utils.dlpack import to_dlpack

from flashattn import _C
from flashattn.interface import check_rank, kvcache_native_arguments, lse_shape

# The current stream's cudaStream_t as an int without building a torch.cuda.Stream
# object (what torch.compile's generated code uses); the public API is the fallback.
_get_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _capsule(tensor):
    return None if tensor is None else to_dlpack(tensor)


def _stream_and_threads(tensor):
    """(cudaStream_t as int, CPU threads) for a call on tensor's device."""
    if tensor.is_cuda:
        index = tensor.get_device()
        if _get_raw_stream is not None:
            return _get_raw_stream(index), 0
        return torch.cuda.current_stream(index).cuda_stream, 0
    return 0, torch.get_num_threads()


def _check_tensors(**tensors):
    for name, tensor in tensors.items():
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise TypeError(f"flashattn: {name}: expected a torch.Tensor like q, got {type(tensor).__name__}")


def _empty_outputs(q, is_varlen, need_lse=True):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lse_shape(q, is_varlen), dtype=torch.float32, device=q.device) if need_lse else None
    return out, lse


def _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
             window_right, softcap, need_lse=True):
    is_varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    check_rank(q, "q", 3 if is_varlen else 4)
    out, lse = _empty_outputs(q, is_varlen, need_lse)
    stream, num_threads = _stream_and_threads(q)
    _C.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), _capsule(lse), _capsule(cu_seqlens_q),
               _capsule(cu_seqlens_k), max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
               softcap, "automatic", num_threads, stream)
    return out, lse


@torch.library.custom_op("flashattn::_fwd", mutates_args=())
def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
         cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: Optional[float],
         causal: bool, window_left: int, window_right: int, softcap: float,
         deterministic: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    # deterministic is a backward option; the forward op carries it so the gradient sees it.
    return _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                    window_left, window_right, softcap)


@_fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
              window_right, softcap, deterministic):
    is_varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    check_rank(q, "q", 3 if is_varlen else 4)
    return _empty_outputs(q, is_varlen)


def _empty_gradients(q, k, v):
    """dq, dk, dv: row-major like the forward's out (the fake and the real op agree)."""
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))


@torch.library.custom_op("flashattn::_bwd", mutates_args=())
def _bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
         lse: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
         max_seqlen_q: int, max_seqlen_k: int, softmax_scale: Optional[float], causal: bool, window_left: int,
         window_right: int, softcap: float, deterministic: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if dout.stride(-1) != 1:  # autograd may hand us an expanded gradient
        dout = dout.contiguous()
    dq, dk, dv = _empty_gradients(q, k, v)
    tensors = [to_dlpack(t) for t in (q, k, v, out, dout, lse)]
    grads = [to_dlpack(t) for t in (dq, dk, dv)]
    options = (_capsule(cu_seqlens_q), _capsule(cu_seqlens_k), max_seqlen_q, max_seqlen_k, softmax_scale, causal,
               window_left, window_right, softcap, deterministic, "automatic")
    workspace_bytes = _C.backward_workspace_bytes(*tensors, *grads, *options)
    # Capsules are consumed by a call; the backward call gets fresh ones.
    tensors = [to_dlpack(t) for t in (q, k, v, out, dout, lse)]
    grads = [to_dlpack(t) for t in (dq, dk, dv)]
    options = (_capsule(cu_seqlens_q), _capsule(cu_seqlens_k)) + options[2:]
    workspace = None
    if workspace_bytes > 0:
        workspace = to_dlpack(torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device))
    stream, num_threads = _stream_and_threads(q)
    _C.backward(*tensors, *grads, workspace, *options, num_threads, stream)
    return dq, dk, dv


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
              window_left, window_right, softcap, deterministic):
    return _empty_gradients(q, k, v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k = inputs[:5]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.options = inputs[5:]  # max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, deterministic


def _backward(ctx, dout, dlse):
    # No gradient flows through the LSE output (as in flash_attn).
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = _bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.options)
    return (dq, dk, dv) + (None,) * 10


_fwd.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
              window_right, softcap, deterministic, need_lse):
    """(out, lse) for torch tensors; through the custom op when a graph is needed.
    Without one, lse is None unless need_lse."""
    if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        _check_tensors(k=k, v=v)
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        _check_tensors(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    needs_op = torch.compiler.is_compiling() or (
        torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
    if needs_op:
        return _fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                    window_left, window_right, softcap, deterministic)
    return _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                    window_left, window_right, softcap, need_lse)


def _kvcache_forward(*arguments, need_lse=True):
    q = arguments[0]
    check_rank(q, "q", 4)
    out, lse = _empty_outputs(q, False, need_lse)
    workspace = None
    if q.is_cuda:  # the CPU needs no scratch
        workspace_bytes = _C.kvcache_workspace_bytes(*kvcache_native_arguments(arguments, out, lse, to_dlpack))
        if workspace_bytes > 0:
            workspace = to_dlpack(torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device))
    stream, num_threads = _stream_and_threads(q)
    _C.forward_with_kvcache(*kvcache_native_arguments(arguments, out, lse, to_dlpack), workspace, num_threads, stream)
    return out, lse


@torch.library.custom_op("flashattn::_kvcache", mutates_args=("k_cache", "v_cache"))
def _kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
             v: Optional[torch.Tensor], rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
             cache_seqlens: Optional[torch.Tensor], uniform_cache_seqlen: Optional[int],
             cache_batch_idx: Optional[torch.Tensor], cache_leftpad: Optional[torch.Tensor],
             block_table: Optional[torch.Tensor], softmax_scale: Optional[float], causal: bool, window_left: int,
             window_right: int, softcap: float, rotary_interleaved: bool,
             num_splits: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return _kvcache_forward(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, uniform_cache_seqlen,
                            cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window_left,
                            window_right, softcap, rotary_interleaved, num_splits)


@_kvcache.register_fake
def _kvcache_fake(q, *rest):
    check_rank(q, "q", 4)
    return _empty_outputs(q, False)


def with_kvcache(q, k_cache, v_cache, *rest, need_lse):
    """(out, lse) for flash_attn_with_kvcache; the custom op only while compiling.
    Without it, lse is None unless need_lse."""
    _check_tensors(k_cache=k_cache, v_cache=v_cache)
    if torch.compiler.is_compiling():
        return _kvcache(q, k_cache, v_cache, *rest)
    return _kvcache_forward(q, k_cache, v_cache, *rest, need_lse=need_lse)


@torch.library.custom_op("flashattn::_merge", mutates_args=())
def _merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
           lse_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    out, lse = _merge_fake(out_a, lse_a, out_b, lse_b)
    stream, num_threads = _stream_and_threads(out_a)
    _C.merge_attention_states(to_dlpack(out_a), to_dlpack(lse_a), to_dlpack(out_b), to_dlpack(lse_b),
                              to_dlpack(out), to_dlpack(lse), num_threads, stream)
    return out, lse


@_merge.register_fake
def _merge_fake(out_a, lse_a, out_b, lse_b):
    check_rank(out_a, "out_a", 4)
    out = torch.empty(out_a.shape, dtype=out_a.dtype, device=out_a.device)
    lse = torch.empty((out_a.shape[0], out_a.shape[2], out_a.shape[1]), dtype=torch.float32, device=out_a.device)
    return out, lse


def merge_attention_states(out_a, lse_a, out_b, lse_b):
    _check_tensors(lse_a=lse_a, out_b=out_b, lse_b=lse_b)
    return _merge(out_a, lse_a, out_b, lse_b)
