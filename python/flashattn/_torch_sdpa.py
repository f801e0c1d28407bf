"""PyTorch glue of flashattn.scaled_dot_product_attention (sdpa.py): eager autograd for
q, k, v and a float attn_mask (dBias), and the custom ops flashattn::_sdpa_fwd /
flashattn::_sdpa_bwd for torch.compile and opcheck. Imported on the first torch call.

The block mask travels through the ops as a list of its present arrays plus ints
(block_mask.py: BlockMask._tensors, _native_tuple_from), so the op schemas stay fixed.

Dropout's seed and offset are an int64 {seed, offset} tensor on q's device drawn from
torch's generator of that device (_torch_ops.draw_seed_offset, as flash_attn_func):
torch.manual_seed replays the masks, the kernels read the pair at run time (a captured
CUDA graph draws a fresh mask on each replay, torch.compile a fresh one per call), and
the backward pass is given the forward's tensor, so it regenerates the same mask.
"""

from typing import List, Optional, Tuple

import torch

from flashattn import _C
from flashattn._torch_ops import _get_num_threads, draw_seed_offset
from flashattn.block_mask import _native_tuple_from
from flashattn.sdpa import _prepare

_forward_native = _C.forward_masked
_backward_native = _C.backward_masked


def _block_arguments(bm):
    """(tensors, present flags, params) of a BlockMask, or empty lists."""
    if bm is None:
        return [], [], []
    tensors = bm._tensors()
    present = [int(t is not None) for t in tensors]
    t = bm._native_tuple()
    params = [t[0], t[1], int(t[13]), t[14], t[15], t[16]]
    return [x for x in tensors if x is not None], present, params


def _block_tuple(tensors, present, params):
    if not params:
        return None
    it = iter(tensors)
    return _native_tuple_from([next(it) if flag else None for flag in present], params)


def _out_like(q):
    """(B, L, H, E) view of a fresh (B, H, L, E) output: PyTorch's layout for the result."""
    B, L, H, E = q.shape
    return torch.empty((B, H, L, E), dtype=q.dtype, device=q.device).transpose(1, 2)


def _run_forward(q, k, v, attn_mask, block, options, seed_offset):
    scale, causal, left, right, dropout_p = options
    out = _out_like(q)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    _forward_native(q, k, v, out, lse, attn_mask, block, scale, causal, left, right, dropout_p, 0, 0,
                    _get_num_threads(), None, dropout_seed_offset=seed_offset)
    return out, lse


def _run_backward(dout, q, k, v, out, lse, attn_mask, block, options, seed_offset, need_dbias):
    scale, causal, left, right, dropout_p = options
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dbias = torch.empty(attn_mask.shape, dtype=attn_mask.dtype, device=attn_mask.device) if need_dbias else None
    _backward_native(q, k, v, out, dout, lse, dq, dk, dv, dbias,
                     lambda n: torch.empty(n, dtype=torch.uint8, device=q.device), attn_mask, block, scale, causal, left,
                     right, dropout_p, 0, 0, _get_num_threads(), None, dropout_seed_offset=seed_offset)
    return dq, dk, dv, dbias


class _Sdpa(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, attn_mask, block, options, seed_offset):
        out, lse = _run_forward(q, k, v, attn_mask, block, options, seed_offset)
        ctx.save_for_backward(q, k, v, out, lse, attn_mask, seed_offset)
        ctx.block, ctx.options = block, options
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, attn_mask, seed_offset = ctx.saved_tensors
        need_dbias = attn_mask is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dbias = _run_backward(dout, q, k, v, out, lse, attn_mask, ctx.block, ctx.options, seed_offset,
                                          need_dbias)
        return dq, dk, dv, dbias, None, None, None


# --- custom ops: torch.compile, opcheck -------------------------------------------------------------


@torch.library.custom_op("flashattn::_sdpa_fwd", mutates_args=())
def _sdpa_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor],
              block_tensors: List[torch.Tensor], block_present: List[int], block_params: List[int],
              scale: Optional[float], causal: bool, window_left: int, window_right: int, dropout_p: float,
              seed_offset: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    out, lse = _run_forward(q, k, v, attn_mask, _block_tuple(block_tensors, block_present, block_params),
                            (scale, causal, window_left, window_right, dropout_p), seed_offset)
    return out, lse


@_sdpa_fwd.register_fake
def _sdpa_fwd_fake(q, k, v, attn_mask, block_tensors, block_present, block_params, scale, causal, window_left,
                   window_right, dropout_p, seed_offset):
    return _out_like(q), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


@torch.library.custom_op("flashattn::_sdpa_bwd", mutates_args=())
def _sdpa_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
              lse: torch.Tensor, attn_mask: Optional[torch.Tensor], block_tensors: List[torch.Tensor],
              block_present: List[int], block_params: List[int], scale: Optional[float], causal: bool,
              window_left: int, window_right: int, dropout_p: float, seed_offset: Optional[torch.Tensor],
              need_dbias: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv, dbias = _run_backward(dout, q, k, v, out, lse, attn_mask,
                                      _block_tuple(block_tensors, block_present, block_params),
                                      (scale, causal, window_left, window_right, dropout_p), seed_offset, need_dbias)
    return dq, dk, dv, dbias if dbias is not None else q.new_empty(0)  # an op returns tensors: empty = none


@_sdpa_bwd.register_fake
def _sdpa_bwd_fake(dout, q, k, v, out, lse, attn_mask, block_tensors, block_present, block_params, scale, causal,
                   window_left, window_right, dropout_p, seed_offset, need_dbias):
    dbias = attn_mask.new_empty(attn_mask.shape) if need_dbias else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias


def _setup_context(ctx, inputs, output):
    q, k, v, attn_mask, block_tensors = inputs[:5]
    seed_offset = inputs[12]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, attn_mask, seed_offset, *block_tensors)
    ctx.block_count = len(block_tensors)
    ctx.rest = inputs[5:12]  # block_present, block_params, scale, causal, window_left, window_right, dropout_p
    ctx.need_dbias = attn_mask is not None and attn_mask.is_floating_point()


def _op_backward(ctx, dout, dlse):
    q, k, v, out, lse, attn_mask, seed_offset, *block_tensors = ctx.saved_tensors
    dq, dk, dv, dbias = _sdpa_bwd(dout, q, k, v, out, lse, attn_mask, block_tensors, *ctx.rest, seed_offset,
                                  ctx.need_dbias)
    # One gradient per input, the block tensors' as a list (register_autograd matches the structure).
    return (dq, dk, dv, dbias if ctx.need_dbias else None, [None] * ctx.block_count) + (None,) * 8


_sdpa_fwd.register_autograd(_op_backward, setup_context=_setup_context)


def sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, block_mask):
    compiling = torch.compiler.is_compiling()
    q, k, v, mask4, bm, options = _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                           block_mask, compiling=compiling)
    if mask4 is not None and mask4.dtype == torch.uint8:
        mask4 = mask4.to(torch.bool)
    # Drawn on q's device, never read on the host (see the module docstring).
    seed_offset = draw_seed_offset(q.device) if options[4] > 0 else None
    if compiling:
        tensors, present, params = _block_arguments(bm)
        out, _ = _sdpa_fwd(q, k, v, mask4, tensors, present, params, *options, seed_offset)
        return out.transpose(1, 2)
    block = None if bm is None else bm._native_tuple()
    needs_grad = torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or (mask4 is not None and mask4.requires_grad))
    if needs_grad:
        return _Sdpa.apply(q, k, v, mask4, block, options, seed_offset).transpose(1, 2)
    out, _ = _run_forward(q, k, v, mask4, block, options, seed_offset)
    return out.transpose(1, 2)
