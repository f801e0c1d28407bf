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


# --- torch: dropout's seed/offset from torch's generator (CPU here, CUDA on the device) -----------

try:
    import torch
except ImportError:  # the NumPy tests above still run
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")
TORCH_DEVICES = ["cpu"] + (["cuda"] if torch is not None and torch.cuda.is_available() and flashattn.cuda_available()
                           else [])
needs_cuda = pytest.mark.skipif("cuda" not in TORCH_DEVICES, reason="needs CUDA (torch and flashattn's CUDA backend)")


def torch_inputs(device, B=2, H=4, Hkv=2, L=97, S=130, E=32, dtype=None, seed=0):
    """(q, k, v) in SDPA's layout: float32 on the CPU, bfloat16 on the GPU."""
    dtype = dtype or (torch.float32 if device == "cpu" else torch.bfloat16)
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
                 for shape in ((B, H, L, E), (B, Hkv, S, E), (B, Hkv, S, E)))


@needs_torch
@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_torch_dropout_replays_with_manual_seed_and_changes_per_call(device):
    q, k, v = torch_inputs(device)
    mask = torch.rand(97, 130, generator=torch.Generator().manual_seed(1)).to(device) < 0.7
    run = lambda: flashattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.3,  # noqa: E731
                                                         enable_gqa=True)
    torch.manual_seed(5)
    first, second = run(), run()
    torch.manual_seed(5)
    replay = run()
    assert torch.equal(first, replay)
    assert not torch.equal(first, second)


@needs_torch
@pytest.mark.parametrize("device", TORCH_DEVICES)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "bias"])
def test_torch_dropout_backward_regenerates_the_forward_mask(device, mask_kind):
    """Output and gradients equal the float64 oracle fed the mask drawn from the (seed,
    offset) that torch's generator gave the call: the backward pass used the forward's."""
    B, H, Hkv, L, S, E, p = 2, 4, 2, 97, 130, 32, 0.25
    q, k, v = (x.requires_grad_() for x in torch_inputs(device, B, H, Hkv, L, S, E))
    generator = torch.Generator().manual_seed(2)
    attn_mask = None
    if mask_kind == "bool":
        attn_mask = (torch.rand(1, H, L, S, generator=generator) < 0.7).to(device)
    elif mask_kind == "bias":
        attn_mask = torch.randn(1, H, L, S, generator=generator).to(device)
    torch.manual_seed(9)
    seed, offset = flashattn._torch_ops.draw_seed_offset(torch.device(device)).cpu().tolist()
    torch.manual_seed(9)
    out = flashattn.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, enable_gqa=True)
    dout = torch.randn(out.shape, generator=generator).to(device=device, dtype=out.dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)

    keep = torch.from_numpy(flashattn._dropout.keep_mask(B, H, L, S, p, seed, offset)).to(device=device,
                                                                                            dtype=torch.float64)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    k_rep, v_rep = (x.repeat_interleave(H // Hkv, dim=1) for x in (k64, v64))
    s = q64 @ k_rep.transpose(-1, -2) / np.sqrt(E)
    if mask_kind == "bool":
        s = s.masked_fill(~attn_mask, float("-inf"))
    elif mask_kind == "bias":
        s = s + attn_mask.double()
    probabilities = torch.softmax(s, dim=-1).nan_to_num(0.0)
    oracle = (probabilities * keep / (1 - p)) @ v_rep
    tolerance = 2e-5 if q.dtype == torch.float32 else 3e-2
    assert (out.double() - oracle).abs().max().item() < tolerance
    for got, want in zip(grads, torch.autograd.grad(oracle, (q64, k64, v64), dout.double())):
        assert (got.double() - want).abs().max().item() < 5 * tolerance


@needs_torch
def test_torch_dropout_under_torch_compile_draws_from_torchs_generator():
    """Compiled (aot_eager on the CPU: dynamo, fake tensors, AOT autograd), the call draws
    its seed/offset in the graph: fresh per call, replayed by torch.manual_seed, and the
    compiled backward regenerates the forward's mask (gradients equal the eager ones)."""
    q, k, v = (x.requires_grad_() for x in torch_inputs("cpu"))

    def loss(q, k, v):
        out = flashattn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True, enable_gqa=True)
        return (out ** 2).sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    torch.manual_seed(3)
    first = compiled(q, k, v)
    first_grads = torch.autograd.grad(first, (q, k, v))
    second = compiled(q, k, v)
    torch.manual_seed(3)
    eager = loss(q, k, v)
    eager_grads = torch.autograd.grad(eager, (q, k, v))
    assert not torch.equal(first, second)
    torch.testing.assert_close(first, eager, rtol=1e-6, atol=1e-6)
    for got, want in zip(first_grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@needs_cuda
def test_cuda_graph_replays_draw_fresh_dropout_masks():
    """Captured in a CUDA graph, each replay reads a new (seed, offset) from torch's CUDA
    generator (no host value baked into the graph), and a replay after torch.manual_seed
    equals the eager call after the same seed."""
    q, k, v = torch_inputs("cuda", L=256, S=256)
    run = lambda: flashattn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, enable_gqa=True)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = run()
    torch.manual_seed(4)
    graph.replay()
    first = static_out.clone()
    graph.replay()
    assert not torch.equal(first, static_out)
    torch.manual_seed(4)
    torch.testing.assert_close(first, run(), rtol=0, atol=0)


@needs_cuda
def test_cuda_graph_of_forward_and_backward_with_dropout_is_consistent():
    """Forward and backward captured together: each replay draws one fresh mask and the
    gradients of that replay are those of the eager call with the same generator state."""
    q, k, v = (x.requires_grad_() for x in torch_inputs("cuda", L=192, S=192))
    dout = torch.randn(q.shape, dtype=q.dtype, device="cuda")

    def step():
        out = flashattn.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True, enable_gqa=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    torch.manual_seed(8)
    graph.replay()
    replayed = [g.clone() for g in captured]
    torch.manual_seed(8)
    for got, want in zip(replayed, step()):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    graph.replay()
    assert not torch.equal(replayed[0], captured[0])
