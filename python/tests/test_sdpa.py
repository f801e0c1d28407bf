"""flashattn.scaled_dot_product_attention and block masks (NumPy here; the torch
comparison with torch.nn.functional.scaled_dot_product_attention runs where torch is)."""

import numpy as np
import pytest

import flashattn


def reference(q, k, v, mask=None, causal=False, gqa=False):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    if gqa:
        r = q.shape[1] // k.shape[1]
        k, v = np.repeat(k, r, 1), np.repeat(v, r, 1)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    L, S = s.shape[-2:]
    if causal:
        mask = np.tril(np.ones((L, S), bool))
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isinf(m), 0, m))
    l = p.sum(-1, keepdims=True)
    return np.where(l > 0, (p / np.where(l > 0, l, 1)) @ v, 0)  # rows that see nothing: 0 (PyTorch: NaN)


def inputs(B=2, H=4, Hkv=2, L=97, S=130, E=32, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, L, E), dtype=np.float32), rng.standard_normal((B, Hkv, S, E), dtype=np.float32),
            rng.standard_normal((B, Hkv, S, E), dtype=np.float32), rng)


@pytest.mark.parametrize("L,S", [(97, 130), (130, 97), (64, 64)])
def test_causal_is_top_left(L, S):
    q, k, v, _ = inputs(L=L, S=S)
    out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert np.abs(out - reference(q, k, v, causal=True, gqa=True)).max() < 1e-5


@pytest.mark.parametrize("shape", [(2, 4, 97, 130), (1, 4, 97, 130), (97, 130), (4, 1, 130), (2, 1, 1, 130)])
def test_masks_broadcast(shape):
    q, k, v, rng = inputs()
    bool_mask = rng.random(shape) < 0.6
    out = flashattn.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask, enable_gqa=True)
    assert np.abs(out - reference(q, k, v, bool_mask, gqa=True)).max() < 1e-5
    bias = rng.standard_normal(shape).astype(np.float32)
    bias[rng.random(shape) < 0.1] = -np.inf
    out = flashattn.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    assert np.abs(out - reference(q, k, v, bias, gqa=True)).max() < 1e-5


def test_fully_masked_rows_are_zero():
    q, k, v, rng = inputs()
    mask = rng.random((97, 130)) < 0.5
    mask[5] = False
    out = flashattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert np.all(out[:, :, 5] == 0) and np.isfinite(out).all()


def test_dense_mask_converted_to_block_sparse_is_identical():
    q, k, v, _ = inputs(L=300, S=400)
    i, j = np.arange(300)[:, None], np.arange(400)[None, :]
    band = (j <= i + 100) & (j > i - 50)
    out = flashattn.scaled_dot_product_attention(q, k, v, attn_mask=band, enable_gqa=True)
    bm = flashattn.block_mask_from_dense(band, BLOCK_SIZE=64)
    out_block = flashattn.scaled_dot_product_attention(q, k, v, block_mask=bm, enable_gqa=True)
    assert np.array_equal(out, out_block)
    assert np.abs(out - reference(q, k, v, band, gqa=True)).max() < 1e-5


def test_create_block_mask_and_rules():
    q, k, v, _ = inputs(B=1, L=200, S=200)
    docs = (np.arange(200) // 70).astype(np.int32)
    causal_docs = lambda b, h, qi, ki: (qi >= ki) & (docs[qi] == docs[ki])  # noqa: E731
    bm = flashattn.create_block_mask(causal_docs, None, None, 200, 200, BLOCK_SIZE=32)
    assert 0 < bm.sparsity() < 100
    expected = reference(q, k, v, causal_docs(0, 0, np.arange(200)[:, None], np.arange(200)[None, :]), gqa=True)
    out = flashattn.scaled_dot_product_attention(q, k, v, block_mask=bm, enable_gqa=True)
    assert np.abs(out - expected).max() < 1e-5
    rule = flashattn.block_mask_from_rule(1, 1, 200, 200, BLOCK_SIZE=32, causal=True, q_document_ids=docs[None],
                                          k_document_ids=docs[None])
    assert rule.partial_bits is None
    out_rule = flashattn.scaled_dot_product_attention(q, k, v, block_mask=rule, enable_gqa=True)
    assert np.abs(out_rule - expected).max() < 1e-5


def test_bad_input_names_the_argument():
    q, k, v, rng = inputs()
    with pytest.raises(ValueError, match="flashattn: attn_mask: not broadcastable"):
        flashattn.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((3, 97, 130), bool), enable_gqa=True)
    with pytest.raises(TypeError, match="flashattn: attn_mask"):
        flashattn.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((97, 130), np.float64), enable_gqa=True)
    with pytest.raises(ValueError, match="flashattn: key"):
        flashattn.scaled_dot_product_attention(q, k, v)
    with pytest.raises(NotImplementedError, match="BLOCK_SIZE"):
        flashattn.create_block_mask(lambda b, h, qi, ki: qi >= ki, 1, 1, 97, 130, BLOCK_SIZE=48)
    bm = flashattn.block_mask_from_dense(rng.random((97, 130)) < 0.5, BLOCK_SIZE=32)
    bm.kv_indices = bm.kv_indices.copy()
    bm.kv_num_blocks = bm.kv_num_blocks.copy()
    bm.kv_num_blocks[0, 0, 0] = max(1, bm.kv_num_blocks[0, 0, 0])
    bm.kv_indices[0, 0, 0, 0] = 1000
    with pytest.raises(ValueError, match="flashattn: kv_indices"):
        flashattn.scaled_dot_product_attention(q, k, v, block_mask=bm, enable_gqa=True)




def test_matches_torch_sdpa():
    torch = pytest.importorskip("torch")
    q, k, v, rng = inputs()
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    bias = torch.from_numpy(rng.standard_normal((1, 4, 97, 130)).astype(np.float32)).requires_grad_()
    out = flashattn.scaled_dot_product_attention(tq, tk, tv, attn_mask=bias, enable_gqa=True)
    out.sum().backward()
    grads = [x.grad.clone() for x in (tq, tk, tv, bias)]
    for x in (tq, tk, tv, bias):
        x.grad = None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        expected = torch.nn.functional.scaled_dot_product_attention(tq.double(), tk.double(), tv.double(),
                                                                    attn_mask=bias.double(), enable_gqa=True)
    expected.sum().backward()
    assert (out.double() - expected).abs().max() < 1e-4
    for got, x in zip(grads, (tq, tk, tv, bias)):
        assert (got.double() - x.grad).abs().max() < 1e-3


def test_numpy_dropout_is_seeded_by_manual_seed_and_matches_flash_attn_func():
    """NumPy SDPA draws dropout's seed/offset from flashattn.manual_seed's state, like
    flash_attn_func: the same seed replays the mask, and both entry points draw the same one."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 3, 40, 16)).astype(np.float32) for _ in range(3))  # (B, H, L, E)
    flashattn.manual_seed(77)
    first = flashattn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
    second = flashattn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
    flashattn.manual_seed(77)
    replay = flashattn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
    assert np.array_equal(first, replay)
    assert not np.array_equal(first, second)
    flashattn.manual_seed(77)
    flash = flashattn.flash_attn_func(*(np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v)),
                                      dropout_p=0.3, causal=True)
    np.testing.assert_allclose(first, flash.transpose(0, 2, 1, 3), rtol=0, atol=1e-6)
