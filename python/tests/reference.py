"""The NumPy oracle: standard attention in the textbook's three steps, in any precision.

    S = softcap(scale * Q K^T), masked to -inf outside the bottom-right-aligned window
    P = softmax(S) row-wise        (a fully masked row: P = 0, LSE = -inf)
    O = P V

Layout is flash_attn's: q (batch, seqlen_q, heads_q, d), k/v (batch, seqlen_k, heads_kv, d),
LSE (batch, heads_q, seqlen_q). GQA: query head h reads key/value head h // (heads_q / heads_kv).
"""

import numpy as np


def allowed_mask(seqlen_q, seqlen_k, causal=False, window=(-1, -1)):
    """(seqlen_q, seqlen_k) bool: row i sees column j iff
    i + offset - left <= j <= i + offset + right, offset = seqlen_k - seqlen_q (bottom-right)."""
    left, right = window
    if causal:
        right = 0
    rows = np.arange(seqlen_q)[:, None]
    cols = np.arange(seqlen_k)[None, :]
    diagonal = rows + seqlen_k - seqlen_q
    mask = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if left >= 0:
        mask &= cols >= diagonal - left
    if right >= 0:
        mask &= cols <= diagonal + right
    return mask


def attention(q, k, v, causal=False, window=(-1, -1), softcap=0.0, softmax_scale=None, dtype=np.float64,
              alibi_slopes=None, keep=None, dropout_p=0.0):
    """(out, lse) computed entirely in `dtype` (float64 = the oracle; the input dtype =
    the low-precision reference of the tolerance rule). out is returned in `dtype`.
    alibi_slopes (heads_q,) or (batch, heads_q): S -= slope * |i + seqlen_k - seqlen_q - j|
    after the softcap. keep (batch, heads_q, seqlen_q, seqlen_k), 1 = kept: dropout's
    mask; O = (P * keep) V / (1 - dropout_p), the LSE unaffected."""
    q, k, v = (np.asarray(x).astype(dtype) for x in (q, k, v))
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    k = np.repeat(k, group, axis=2)  # (batch, seqlen_k, heads_q, d)
    v = np.repeat(v, group, axis=2)
    scale = dtype(softmax_scale if softmax_scale is not None else 1.0 / np.sqrt(head_dim))
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale  # (batch, heads_q, seqlen_q, seqlen_k)
    if softcap > 0:
        s = dtype(softcap) * np.tanh(s / dtype(softcap))
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, dtype=np.float64)
        slopes = (slopes[None, :] if slopes.ndim == 1 else slopes)[:, :, None, None]  # (batch|1, heads_q, 1, 1)
        rows = np.arange(seqlen_q)[:, None]
        cols = np.arange(seqlen_k)[None, :]
        s = s - (slopes * np.abs(rows + seqlen_k - seqlen_q - cols)).astype(dtype)
    mask = allowed_mask(seqlen_q, seqlen_k, causal, window)
    s = np.where(mask, s, dtype(-np.inf))
    with np.errstate(invalid="ignore"):
        m = s.max(axis=-1, keepdims=True) if seqlen_k > 0 else np.full(s.shape[:-1] + (1,), -np.inf, dtype)
    m_safe = np.where(np.isfinite(m), m, dtype(0))
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    p = p / np.where(l > 0, l, dtype(1))
    if keep is not None:
        p = np.where(keep != 0, p, dtype(0)) * dtype(1.0 / (1.0 - dropout_p))
    out = np.einsum("bhqk,bkhd->bqhd", p, v)
    with np.errstate(divide="ignore"):
        lse = np.where(l > 0, np.log(np.where(l > 0, l, 1)) + m_safe, -np.inf)[..., 0]
    return out.astype(dtype), lse.astype(dtype)


def absolute_floor(dtype):
    """The small absolute floor of the tolerance rule: a fraction of an output ulp."""
    return {np.dtype(np.float32): 1e-6, np.dtype(np.float16): 1e-4}[np.dtype(dtype)]


def assert_close_to_oracle(value, oracle, lowprec, floor, factor=2.0, what="out"):
    """max|value - oracle| <= factor * max|lowprec - oracle| + floor over the finite
    entries; -inf (fully masked rows' LSE) must match exactly."""
    value = np.asarray(value, dtype=np.float64)
    oracle = np.asarray(oracle, dtype=np.float64)
    lowprec = np.asarray(lowprec, dtype=np.float64)
    assert value.shape == oracle.shape, f"{what}: shape {value.shape} != {oracle.shape}"
    assert not np.isnan(value).any(), f"{what}: NaN in the result"
    infinite = ~np.isfinite(oracle)
    np.testing.assert_array_equal(value[infinite], oracle[infinite], err_msg=f"{what}: -inf entries differ")
    finite = ~infinite
    if not finite.any():
        return
    error = np.abs(value[finite] - oracle[finite]).max()
    bound = factor * np.abs(lowprec[finite] - oracle[finite]).max() + floor
    assert error <= bound, f"{what}: max error {error:.3g} > bound {bound:.3g}"
