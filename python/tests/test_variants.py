"""ALiBi and dropout through the Python API (NumPy; torch CPU and CUDA when available)
against the NumPy oracle, dropout's replay rules and return_attn_probs' S_dmask."""

import numpy as np
import pytest

import flashattn
from flashattn import _dropout, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

from reference import absolute_floor, assert_close_to_oracle, attention


def random_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, seqlen_q, heads_q, head_dim)).astype(dtype)
    k = rng.standard_normal((batch, seqlen_k, heads_kv, head_dim)).astype(dtype)
    v = rng.standard_normal((batch, seqlen_k, heads_kv, head_dim)).astype(dtype)
    return q, k, v


def slopes(batch, heads, per_batch):
    base = np.exp2(-8.0 * np.arange(1, heads + 1) / heads)
    if not per_batch:
        return base.astype(np.float32)
    return (base[None, :] * (1.0 + 0.25 * np.arange(batch))[:, None]).astype(np.float32)


CASES = [
    dict(shape=(2, 37, 37, 4, 2, 32)),
    dict(shape=(1, 20, 70, 2, 1, 64), causal=True),
    dict(shape=(1, 70, 20, 2, 2, 16), window=(8, 3)),
    dict(shape=(2, 33, 33, 2, 1, 32), softcap=3.0),
]


@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c))
def test_alibi_matches_oracle(case, per_batch):
    q, k, v = random_qkv(*case["shape"], np.float32)
    alibi = slopes(case["shape"][0], case["shape"][3], per_batch)
    kwargs = dict(causal=case.get("causal", False), window_size=case.get("window", (-1, -1)),
                  softcap=case.get("softcap", 0.0))
    out, lse, _ = flash_attn_func(q, k, v, alibi_slopes=alibi, return_attn_probs=True, **kwargs)
    mask = dict(causal=kwargs["causal"], window=kwargs["window_size"], softcap=kwargs["softcap"], alibi_slopes=alibi)
    oracle_out, oracle_lse = attention(q, k, v, **mask)
    low_out, low_lse = attention(q, k, v, dtype=np.float32, **mask)
    assert_close_to_oracle(out, oracle_out, low_out, absolute_floor(np.float32))
    assert_close_to_oracle(lse, oracle_lse, low_lse, absolute_floor(np.float32), what="lse")


@pytest.mark.parametrize("dropout_p", [0.1, 0.5])
@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c))
def test_dropout_matches_oracle_with_the_regenerated_mask(case, dropout_p):
    batch, seqlen_q, seqlen_k, heads_q, _, _ = case["shape"]
    q, k, v = random_qkv(*case["shape"], np.float32)
    kwargs = dict(causal=case.get("causal", False), window_size=case.get("window", (-1, -1)),
                  softcap=case.get("softcap", 0.0))
    flashattn.manual_seed(1234)
    out, lse, probabilities = flash_attn_func(q, k, v, dropout_p=dropout_p, return_attn_probs=True, **kwargs)
    keep = _dropout.keep_mask(batch, heads_q, seqlen_q, seqlen_k, dropout_p, 1234, 0)
    mask = dict(causal=kwargs["causal"], window=kwargs["window_size"], softcap=kwargs["softcap"], keep=keep,
                dropout_p=dropout_p)
    oracle_out, oracle_lse = attention(q, k, v, **mask)
    low_out, _ = attention(q, k, v, dtype=np.float32, **mask)
    assert_close_to_oracle(out, oracle_out, low_out, absolute_floor(np.float32))
    assert np.allclose(lse, oracle_lse, atol=1e-4, equal_nan=False) or np.array_equal(lse, oracle_lse)
    # S_dmask: rounded-up shape, dropped entries negative, the softmax where kept.
    assert probabilities.shape == (batch, heads_q, (seqlen_q + 127) // 128 * 128, (seqlen_k + 127) // 128 * 128)
    p = probabilities[:, :, :seqlen_q, :seqlen_k]
    positive = p > 0
    assert not (positive & (keep == 0)).any()
    assert not ((p < 0) & (keep != 0)).any()


def test_dropout_replays_with_manual_seed_and_changes_per_call():
    q, k, v = random_qkv(1, 64, 64, 2, 2, 32, np.float32)
    flashattn.manual_seed(7)
    first = flash_attn_func(q, k, v, dropout_p=0.3)
    second = flash_attn_func(q, k, v, dropout_p=0.3)
    flashattn.manual_seed(7)
    replay = flash_attn_func(q, k, v, dropout_p=0.3)
    assert np.array_equal(first, replay)
    assert not np.array_equal(first, second)


def test_kept_fraction_is_binomial():
    keep = _dropout.keep_mask(2, 4, 256, 256, 0.2, 99, 5)
    n = keep.size
    # The keep rate is 1 - p rounded to a multiple of 1/256 (8-bit decisions, as flash_attn's).
    rate = round(0.8 * 256) / 256
    assert abs(keep.mean() - rate) < 6 * np.sqrt(rate * (1 - rate) / n)


def test_varlen_dropout_equals_padded():
    lengths = [19, 40]
    q, k, v = random_qkv(2, 40, 40, 2, 2, 32, np.float32)
    cu = np.array([0, 19, 59], dtype=np.int32)
    packed = [np.concatenate([x[0, :19], x[1, :40]]) for x in (q, k, v)]
    flashattn.manual_seed(3)
    varlen_out = flash_attn_varlen_func(*packed, cu, cu, 40, 40, dropout_p=0.25)
    flashattn.manual_seed(3)
    padded_out = flash_attn_func(q, k, v, dropout_p=0.25)
    # Sequence 1 has its full length in both layouts: the same mask, the same output.
    assert np.allclose(varlen_out[19:], padded_out[1], atol=1e-6)
    assert lengths


def test_kvcache_alibi_matches_oracle():
    q, k, v = random_qkv(2, 3, 50, 4, 2, 32, np.float32)
    alibi = slopes(2, 4, True)
    out = flash_attn_with_kvcache(q, k, v, cache_seqlens=np.array([50, 31], dtype=np.int32), causal=True,
                                  alibi_slopes=alibi)
    for b, length in enumerate([50, 31]):
        oracle, _ = attention(q[b:b + 1], k[b:b + 1, :length], v[b:b + 1, :length], causal=True,
                              alibi_slopes=alibi[b:b + 1])
        low, _ = attention(q[b:b + 1], k[b:b + 1, :length], v[b:b + 1, :length], causal=True,
                           alibi_slopes=alibi[b:b + 1], dtype=np.float32)
        assert_close_to_oracle(out[b:b + 1], oracle, low, absolute_floor(np.float32))


# --- torch ---------------------------------------------------------------------------------------

torch = pytest.importorskip("torch") if False else None
try:
    import torch  # noqa: F811
except ImportError:  # the NumPy tests above still run
    torch = None

DEVICES = ["cpu"] + (["cuda"] if torch is not None and torch.cuda.is_available() and flashattn.cuda_available() else [])
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


def torch_case(device, dtype, seqlen=77, heads=4, heads_kv=2, head_dim=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    make = lambda h: torch.randn(2, seqlen, h, head_dim, generator=generator).to(device=device, dtype=dtype)  # noqa: E731
    return make(heads), make(heads_kv), make(heads_kv)


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_torch_dropout_gradients_match_oracle_with_the_same_mask(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = torch_case(device, dtype)
    alibi = torch.tensor(slopes(2, 4, False), device=device)
    for t in (q, k, v):
        t.requires_grad_(True)
    torch.manual_seed(11)
    out, lse, probabilities = flash_attn_func(q, k, v, dropout_p=0.2, causal=True, alibi_slopes=alibi,
                                              return_attn_probs=True)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    # The oracle in float64 with the mask read back from S_dmask's signs.
    keep = (probabilities[:, :, :77, :77] >= 0).to(torch.float64)
    keep = torch.where(probabilities[:, :, :77, :77] == 0, torch.ones_like(keep), keep)  # masked (p = 0) entries
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    k_rep, v_rep = (t.repeat_interleave(2, dim=2) for t in (k64, v64))
    s = torch.einsum("bqhd,bkhd->bhqk", q64, k_rep) / np.sqrt(64)
    rows, cols = torch.arange(77, device=device)[:, None], torch.arange(77, device=device)[None, :]
    s = s - alibi.double()[None, :, None, None] * (rows - cols).abs()
    s = s.masked_fill(cols > rows, float("-inf"))
    p = torch.softmax(s, dim=-1) * keep / 0.8
    oracle = torch.einsum("bhqk,bkhd->bqhd", p, v_rep)
    tolerance = 2e-5 if dtype == torch.float32 else 3e-2
    assert (out.double() - oracle).abs().max().item() < tolerance
    grads = torch.autograd.grad(oracle, (q64, k64, v64), dout.double())
    for got, want in zip((dq, dk, dv), grads):
        assert (got.double() - want).abs().max().item() < 5 * tolerance


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_torch_manual_seed_replays_dropout_bitwise(device):
    q, k, v = torch_case(device, torch.float32 if device == "cpu" else torch.float16)
    torch.manual_seed(5)
    a = flash_attn_func(q, k, v, dropout_p=0.4)
    b = flash_attn_func(q, k, v, dropout_p=0.4)
    torch.manual_seed(5)
    c = flash_attn_func(q, k, v, dropout_p=0.4)
    assert torch.equal(a, c)
    assert not torch.equal(a, b)


@needs_torch
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA")
def test_cuda_graph_replays_draw_fresh_masks():
    q, k, v = torch_case("cuda", torch.bfloat16)
    static_out = torch.empty_like(q)
    flash_attn_func(q, k, v, dropout_p=0.3)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph):
            static_out.copy_(flash_attn_func(q, k, v, dropout_p=0.3))
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    first = static_out.clone()
    graph.replay()
    assert not torch.equal(first, static_out)


@needs_torch
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA")
def test_cuda_mask_equals_cpu_mask():
    """The GPU kernels and the CPU draw the same mask: with v = identity-like one-hot rows
    and q = 0 (uniform P), each output element encodes one keep bit."""
    seqlen, heads, head_dim = 64, 2, 64
    q = torch.zeros(1, seqlen, heads, head_dim)
    k = torch.zeros(1, seqlen, heads, head_dim)
    v = torch.eye(seqlen, head_dim).reshape(1, seqlen, 1, head_dim).repeat(1, 1, heads, 1)
    torch.manual_seed(21)
    gpu = flash_attn_func(q.cuda().half(), k.cuda().half(), v.cuda().half(), dropout_p=0.5).float().cpu()
    torch.manual_seed(21)
    seed_offset = flashattn._torch_ops.draw_seed_offset(torch.device("cuda")).cpu().tolist()
    keep = _dropout.keep_mask(1, heads, seqlen, seqlen, 0.5, seed_offset[0], seed_offset[1])
    expected = torch.from_numpy(keep.astype(np.float32)).permute(0, 2, 1, 3) / seqlen / 0.5  # (1, seqlen, heads, seqlen)
    assert torch.allclose(gpu, expected, atol=1e-3)
