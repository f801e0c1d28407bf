"""Dropout's seeding for NumPy inputs and the probabilities flash_attn returns with
return_attn_probs=True (S_dmask).

The mask is a function of (seed, offset, batch, head, query row, key column) alone
(flashattn/dropout.hpp): every backend and kernel draws the same one. torch tensors
take seed and offset from torch's generator on the tensor's device (see _torch_ops).
NumPy inputs take them from this module's state: ``manual_seed(s)`` sets the seed and
restarts the offset at 0; each forward call with dropout uses the current (seed,
offset) and advances the offset by one, so a program that calls ``manual_seed`` first
replays its masks exactly. Until then the seed is a fixed default (as torch's is).
"""

import threading

import numpy as np

from flashattn import _C
from flashattn._arguments import as_float, as_int

_DEFAULT_SEED = 0x5EED_F1A5_4A77_0000
_lock = threading.Lock()
_seed = _DEFAULT_SEED
_offset = 0


def manual_seed(seed):
    """Seed the dropout masks of NumPy calls (torch tensors use torch.manual_seed)."""
    global _seed, _offset
    seed = as_int(seed, "seed", 0, 2**64 - 1)
    with _lock:
        _seed, _offset = seed, 0


def next_seed_offset():
    """(seed, offset) for one NumPy call with dropout; advances the offset."""
    global _offset
    with _lock:
        seed, offset = _seed, _offset
        _offset = (_offset + 1) % 2**64
    return seed, offset


def check_dropout_p(dropout_p):
    """dropout_p as a float in [0, 1), named in the error otherwise."""
    p = as_float(dropout_p, "dropout_p")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"flashattn: dropout_p: must be in [0, 1), got {p}")
    return p


def keep_mask(batch, heads, seqlen_q, seqlen_k, dropout_p, seed, offset):
    """uint8 (batch, heads, seqlen_q, seqlen_k), 1 = kept: the mask every backend draws."""
    mask = np.empty((batch, heads, seqlen_q, seqlen_k), dtype=np.uint8)
    _C.dropout_keep_mask(mask, float(dropout_p), int(seed) % 2**64, int(offset) % 2**64)
    return mask


def _round_up(x, multiple=128):
    return (x + multiple - 1) // multiple * multiple


def attention_probabilities(q, k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                            dropout_p, seed, offset, cu_seqlens_q=None, cu_seqlens_k=None):
    """flash_attn's S_dmask from NumPy arrays (float64 math, testing only): (batch, heads,
    seqlen_q rounded up to 128, seqlen_k rounded likewise), the softmax probabilities
    with dropped entries negated, zero padding. Varlen inputs use the per-sequence
    lengths inside the padded (batch, heads, max_seqlen_q, max_seqlen_k) frame."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    if cu_seqlens_q is None:
        batch, seqlen_q, heads, head_dim = q.shape
        seqlen_k = k.shape[1]
        q_rows = [(b, 0, seqlen_q) for b in range(batch)]
        k_rows = [(b, 0, seqlen_k) for b in range(batch)]
        q_of = lambda b, start, n: q[b, :n]  # noqa: E731
        k_of = lambda b, start, n: k[b, :n]  # noqa: E731
    else:
        cu_q = np.asarray(cu_seqlens_q).astype(np.int64)
        cu_k = np.asarray(cu_seqlens_k).astype(np.int64)
        batch, heads, head_dim = len(cu_q) - 1, q.shape[1], q.shape[2]
        q_rows = [(b, cu_q[b], cu_q[b + 1] - cu_q[b]) for b in range(batch)]
        k_rows = [(b, cu_k[b], cu_k[b + 1] - cu_k[b]) for b in range(batch)]
        seqlen_q = max((n for _, _, n in q_rows), default=0)
        seqlen_k = max((n for _, _, n in k_rows), default=0)
        q_of = lambda b, start, n: q[start:start + n]  # noqa: E731
        k_of = lambda b, start, n: k[start:start + n]  # noqa: E731
    heads_kv = k.shape[-2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / np.sqrt(head_dim)
    keep = keep_mask(batch, heads, seqlen_q, seqlen_k, dropout_p, seed, offset) if dropout_p > 0 else None
    probabilities = np.zeros((batch, heads, _round_up(seqlen_q), _round_up(seqlen_k)), dtype=np.float32)
    slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, dtype=np.float64)
    for b in range(batch):
        _, q_start, n_q = q_rows[b]
        _, k_start, n_k = k_rows[b]
        if n_q == 0 or n_k == 0:
            continue
        qb, kb = q_of(b, q_start, n_q), k_of(b, k_start, n_k)
        rows = np.arange(n_q)[:, None]
        cols = np.arange(n_k)[None, :]
        diagonal = rows + n_k - n_q
        allowed = np.ones((n_q, n_k), dtype=bool)
        right = 0 if causal else window_right
        if window_left >= 0:
            allowed &= cols >= diagonal - window_left
        if right >= 0:
            allowed &= cols <= diagonal + right
        for h in range(heads):
            s = qb[:, h, :] @ kb[:, h // (heads // heads_kv), :].T * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            if slopes is not None:
                slope = slopes[h] if slopes.ndim == 1 else slopes[b, h]
                s = s - slope * np.abs(diagonal - cols)
            s = np.where(allowed, s, -np.inf)
            row_max = s.max(axis=1, keepdims=True)
            row_max = np.where(np.isfinite(row_max), row_max, 0.0)
            e = np.exp(s - row_max)
            total = e.sum(axis=1, keepdims=True)
            p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
            if keep is not None:
                p = np.where(keep[b, h, :n_q, :n_k] != 0, p, -p)
            probabilities[b, h, :n_q, :n_k] = p
    return probabilities
