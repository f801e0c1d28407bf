"""flash_attn_with_kvcache over an FP8 (torch.float8_e4m3fn) KV cache: against the float64
attention over the dequantised cache (k_descale * k_cache), the append's quantisation
against PyTorch's own float8 cast (equal for values within +-448), contiguous and paged
caches, GQA, split counts, descale forms, and the errors. CPU tensors (CI); the same
cases run on CUDA where a GPU and the CUDA backend are present. Skipped without torch."""

import numpy as np
import pytest

import flashattn

torch = pytest.importorskip("torch", reason="PyTorch is not installed: torch tests skipped")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this PyTorch has no float8_e4m3fn", allow_module_level=True)

from flashattn import flash_attn_with_kvcache  # noqa: E402
from reference import attention as reference_attention  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and flashattn.cuda_available() else [])


def quantise(x, descale):
    """PyTorch's e4m3 cast of x / descale, clamped into range first (PyTorch gives NaN past 464)."""
    return (x.float() / descale).clamp(-448, 448).to(torch.float8_e4m3fn)


def problem(device, dtype, batch=2, heads_q=8, heads_kv=2, head_dim=64, capacity=96, page_size=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 1, heads_q, head_dim, generator=g).to(dtype)
    k = torch.randn(batch, capacity, heads_kv, head_dim, generator=g)
    v = torch.randn(batch, capacity, heads_kv, head_dim, generator=g)
    k_descale = (torch.rand(batch, heads_kv, generator=g) + 0.5) * (4.0 / 448)
    v_descale = (torch.rand(batch, heads_kv, generator=g) + 0.5) * (4.0 / 448)
    k_cache = quantise(k, k_descale[:, None, :, None])
    v_cache = quantise(v, v_descale[:, None, :, None])
    cache_seqlens = torch.randint(capacity // 2, capacity - 2, (batch,), generator=g, dtype=torch.int32)
    block_table = None
    if page_size:
        pages = capacity // page_size
        order = torch.randperm(batch * pages, generator=g)
        k_pool = torch.empty(batch * pages, page_size, heads_kv, head_dim, dtype=torch.float8_e4m3fn)
        v_pool = torch.empty_like(k_pool)
        k_pool[order] = k_cache.reshape(batch * pages, page_size, heads_kv, head_dim)
        v_pool[order] = v_cache.reshape(batch * pages, page_size, heads_kv, head_dim)
        block_table = order.reshape(batch, pages).to(torch.int32)
        k_cache, v_cache = k_pool, v_pool
    to = lambda x: None if x is None else x.to(device)  # noqa: E731
    return (to(q), to(k_cache), to(v_cache), to(k_descale), to(v_descale), to(cache_seqlens), to(block_table))


def dequantised(cache, descale, block_table, b):
    """Sequence b's cache (positions, heads_kv, head_dim) as float64 values descale * e4m3."""
    rows = cache[block_table[b].long()].flatten(0, 1) if block_table is not None else cache[b]
    return rows.double().cpu() * descale[b].double().cpu()[None, :, None]


def check_against_dequantised(q, out, lse, k_cache, v_cache, k_descale, v_descale, cache_seqlens, block_table, dtype):
    for b, length in enumerate(cache_seqlens.tolist()):
        keys = dequantised(k_cache, k_descale, block_table, b)[:length][None]
        values = dequantised(v_cache, v_descale, block_table, b)[:length][None]
        oracle_out, oracle_lse = reference_attention(q[b:b + 1].double().cpu().numpy(), keys.numpy(), values.numpy())
        # The output's rounding to q's dtype (relative), plus float32 (CPU) or a 16-bit P (GPU).
        relative = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
        absolute = 1e-2 if (q.is_cuda and dtype == torch.bfloat16) else (2e-3 if q.is_cuda else 2e-4)
        error = np.abs(out[b:b + 1].double().cpu().numpy() - oracle_out) - relative * np.abs(oracle_out)
        assert error.max() <= absolute, f"sequence {b}: out error {error.max()}"
        np.testing.assert_allclose(lse[b].cpu().numpy(), oracle_lse[0], atol=1e-3, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page_size", [0, 16])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_fp8_cache_matches_dequantised_attention(device, dtype, page_size, num_splits):
    q, k_cache, v_cache, k_descale, v_descale, cache_seqlens, block_table = problem(device, dtype, page_size=page_size)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table,
                                       num_splits=num_splits, return_softmax_lse=True, k_descale=k_descale,
                                       v_descale=v_descale)
    assert out.dtype == dtype
    check_against_dequantised(q, out, lse, k_cache, v_cache, k_descale, v_descale, cache_seqlens, block_table, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_append_quantises_like_torch(device):
    dtype = torch.bfloat16
    q, k_cache, v_cache, k_descale, v_descale, cache_seqlens, _ = problem(device, dtype, seed=3)
    g = torch.Generator().manual_seed(4)
    k_new = torch.randn(2, 1, 2, 64, generator=g).to(dtype).to(device)
    v_new = torch.randn(2, 1, 2, 64, generator=g).to(dtype).to(device)
    k_before = k_cache.clone()
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens,
                                       return_softmax_lse=True, k_descale=k_descale, v_descale=v_descale)
    for b, length in enumerate(cache_seqlens.tolist()):
        expected_k = quantise(k_new[b, 0].cpu(), k_descale[b].cpu()[:, None])
        expected_v = quantise(v_new[b, 0].cpu(), v_descale[b].cpu()[:, None])
        assert torch.equal(k_cache[b, length].cpu().view(torch.uint8), expected_k.view(torch.uint8))
        assert torch.equal(v_cache[b, length].cpu().view(torch.uint8), expected_v.view(torch.uint8))
        assert torch.equal(k_cache[b, :length].view(torch.uint8), k_before[b, :length].view(torch.uint8))
    check_against_dequantised(q, out, lse, k_cache, v_cache, k_descale, v_descale, cache_seqlens + 1, None, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_rows_are_copied_and_scalar_descales_broadcast(device):
    dtype = torch.float16
    q, k_cache, v_cache, _, _, cache_seqlens, _ = problem(device, dtype, seed=5)
    k_descale = torch.tensor(0.01, device=device)  # one value per tensor
    v_descale = torch.tensor([0.02], device=device)
    k_new = torch.randn(2, 2, 2, 64).to(torch.float8_e4m3fn).to(device)
    v_new = torch.randn(2, 2, 2, 64).to(torch.float8_e4m3fn).to(device)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens,
                                       return_softmax_lse=True, k_descale=k_descale, v_descale=v_descale)
    for b, length in enumerate(cache_seqlens.tolist()):
        assert torch.equal(k_cache[b, length:length + 2].view(torch.uint8), k_new[b].view(torch.uint8))
        assert torch.equal(v_cache[b, length:length + 2].view(torch.uint8), v_new[b].view(torch.uint8))
    expand = lambda d: d.reshape(1, 1).expand(2, 2)  # noqa: E731
    check_against_dequantised(q, out, lse, k_cache, v_cache, expand(k_descale), expand(v_descale), cache_seqlens + 2,
                              None, dtype)


def test_fp8_errors_name_the_argument():
    q, k_cache, v_cache, k_descale, v_descale, cache_seqlens, _ = problem("cpu", torch.bfloat16)
    with pytest.raises(TypeError, match="v_cache"):
        flash_attn_with_kvcache(q, k_cache, v_cache.to(torch.bfloat16), cache_seqlens=cache_seqlens)
    with pytest.raises(Exception, match="k_descale"):
        flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, k_descale=k_descale.half())
    with pytest.raises(Exception, match="v_descale"):
        flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, v_descale=torch.ones(3, 5))
    with pytest.raises(Exception, match="k_descale"):  # a descale for a 16-bit cache
        flash_attn_with_kvcache(q, k_cache.to(torch.bfloat16), v_cache.to(torch.bfloat16), cache_seqlens=cache_seqlens,
                                k_descale=k_descale)
