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


def capture_cuda_graph(fn):
    """(graph, fn's outputs in the graph's memory): fn warmed up on a side stream, as
    torch requires before a capture, then captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


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
    graph, static_out = capture_cuda_graph(run)
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
    gradients of that replay are those of the eager call with the same generator state
    (up to the order of dQ's atomic additions; another mask moves them by O(1))."""
    q, k, v = (x.requires_grad_() for x in torch_inputs("cuda", L=192, S=192))
    dout = torch.randn(q.shape, dtype=q.dtype, device="cuda")

    def step():
        out = flashattn.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True, enable_gqa=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    graph, captured = capture_cuda_graph(step)
    torch.manual_seed(8)
    graph.replay()
    replayed = [g.clone() for g in captured]
    torch.manual_seed(8)
    for got, want in zip(replayed, step()):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    graph.replay()
    assert (replayed[2] - captured[2]).abs().max().item() > 0.1  # dV: another mask


# --- torch: a dense boolean mask converted to block-sparse form on its device --------------------


def structured_mask(kind, shape, generator, block=128):
    """A boolean mask of `shape` ([..., L, S]): random elements, causal, whole random
    blocks with some elements and rows cleared (empty rows, empty/full/partial blocks)."""
    L, S = shape[-2:]
    rows, cols = torch.arange(L)[:, None], torch.arange(S)[None, :]
    if kind == "random":
        return torch.rand(shape, generator=generator) < 0.6
    if kind == "causal":
        return (rows >= cols).expand(shape).clone()
    blocks = torch.rand(shape[:-2] + (-(-L // block), -(-S // block)), generator=generator) < 0.5
    mask = blocks.repeat_interleave(block, -2).repeat_interleave(block, -1)[..., :L, :S].clone()
    mask &= torch.rand(shape, generator=generator) < 0.98  # some blocks partial, most full
    mask[..., 7, :] = False  # a row that sees no key
    mask[..., :block, :] = False  # a whole empty query block
    return mask


def sdpa_dense(monkeypatch, *arguments, **keywords):
    """flashattn.scaled_dot_product_attention with the dense mask read as it is (no conversion)."""
    from flashattn import sdpa

    with monkeypatch.context() as patch:
        patch.setattr(sdpa, "_CONVERT_MIN_LENGTH", 1 << 40)
        return flashattn.scaled_dot_product_attention(*arguments, **keywords)


CONVERSION_CASES = [  # (mask kind, mask shape, L, S, BLOCK_SIZE)
    ("random", (2, 4, 300, 200), 300, 200, 128),
    ("causal", (1, 1, 300, 300), 300, 300, 128),
    ("blocks", (2, 1, 333, 257), 333, 257, 64),
    ("blocks", (1, 4, 256, 384), 256, 384, 128),
    ("blocks", (300, 200), 300, 200, 32),
    ("random", (2, 4, 1, 200), 97, 200, 64),  # one row broadcast over the queries
    ("random", (1, 1, 300, 1), 300, 130, 32),  # one column broadcast over the keys
]


@needs_torch
@pytest.mark.parametrize("case", CONVERSION_CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{c[2]}x{c[3]}-b{c[4]}")
def test_device_conversion_lists_equal_the_host_conversion(case):
    """The torch-op conversion lists the same blocks in the same order as the host one,
    each partial block with the same bits (ids differ: every block has bits on the device)."""
    from flashattn._torch_block_mask import block_mask_from_dense_tensor
    from flashattn.block_mask import _from_dense_numpy

    kind, shape, L, S, block = case
    mask = structured_mask(kind, shape, torch.Generator().manual_seed(3), block)
    mask4 = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    device_bm = block_mask_from_dense_tensor(mask4, (L, S), (block, block))
    host_bm = _from_dense_numpy(np.broadcast_to(mask4.numpy(), mask4.shape[:2] + (L, S)), (block, block), (L, S))
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
                 "full_q_num_blocks", "full_q_indices"):
        got, want = getattr(device_bm, name), getattr(host_bm, name)
        assert got.dtype == torch.int32 and tuple(got.shape) == want.shape, name
        assert np.array_equal(got.numpy(), want), name
    assert tuple(device_bm.kv_num_blocks.shape[:2]) == tuple(mask4.shape[:2])  # broadcast dimensions stay 1
    assert device_bm.partial_bits.shape[0] == mask4.shape[0] * mask4.shape[1] * host_bm.kv_indices.shape[2] * \
        host_bm.kv_indices.shape[3]
    counts = host_bm.kv_num_blocks
    listed = np.arange(host_bm.kv_indices.shape[-1]) < counts[..., None]
    got_ids, want_ids = device_bm.partial_ids.numpy()[listed], host_bm.partial_ids[listed]
    assert np.array_equal(device_bm.partial_bits.numpy()[got_ids], host_bm.partial_bits[want_ids])
    assert (device_bm.partial_ids.numpy()[~listed] == -1).all()
    q_listed = np.arange(host_bm.q_indices.shape[-1]) < host_bm.q_num_blocks[..., None]
    got_q, want_q = device_bm.q_partial_ids.numpy()[q_listed], host_bm.q_partial_ids[q_listed]
    assert np.array_equal(device_bm.partial_bits.numpy()[got_q], host_bm.partial_bits[want_q])


@needs_torch
@pytest.mark.parametrize("case", CONVERSION_CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{c[2]}x{c[3]}-b{c[4]}")
def test_device_conversion_gives_the_dense_masks_results_bitwise(case, monkeypatch):
    """On the CPU backend the converted mask gives bitwise the output and gradients of the
    dense mask read as it is (empty blocks contribute exact zeros, full blocks the same scores)."""
    from flashattn._torch_block_mask import block_mask_from_dense_tensor

    kind, shape, L, S, block = case
    mask = structured_mask(kind, shape, torch.Generator().manual_seed(4), block)
    q, k, v = (x.requires_grad_() for x in torch_inputs("cpu", B=2, H=4, Hkv=2, L=L, S=S, E=32, seed=5))
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(6))
    mask4 = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    bm = block_mask_from_dense_tensor(mask4, (L, S), (block, block))
    results = []
    for keywords in (dict(attn_mask=mask), dict(block_mask=bm)):
        out = sdpa_dense(monkeypatch, q, k, v, enable_gqa=True, **keywords)
        results.append((out,) + torch.autograd.grad(out, (q, k, v), dout))
    for dense, converted in zip(*results):
        assert torch.equal(dense, converted)
    assert (results[0][0] - torch.from_numpy(reference(*(x.detach().numpy() for x in (q, k, v)),
                                                       mask4.expand(2, 4, L, S).numpy(), gqa=True))).abs().max() < 1e-5


@needs_torch
def test_sdpa_converts_a_dense_mask_under_torch_compile(monkeypatch):
    """Compiled (aot_eager on the CPU), a boolean attn_mask is converted in the graph (the
    host path cannot be traced) and gives bitwise the dense mask's output and gradients."""
    generator = torch.Generator().manual_seed(7)
    mask = structured_mask("blocks", (2, 1, 300, 260), generator)
    q, k, v = (x.requires_grad_() for x in torch_inputs("cpu", L=300, S=260, seed=8))

    def loss(q, k, v, mask):
        out = flashattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return (out ** 2).sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    from flashattn import _torch_block_mask

    calls = []
    original = _torch_block_mask.block_mask_from_dense_tensor
    monkeypatch.setattr(_torch_block_mask, "block_mask_from_dense_tensor",
                        lambda *a: calls.append(1) or original(*a))
    got = compiled(q, k, v, mask)
    assert calls, "the compiled call did not convert the mask"
    got_grads = torch.autograd.grad(got, (q, k, v))
    monkeypatch.undo()
    out = sdpa_dense(monkeypatch, q, k, v, attn_mask=mask, enable_gqa=True)
    want = (out ** 2).sum()
    assert torch.equal(got, want)
    for a, b in zip(got_grads, torch.autograd.grad(want, (q, k, v))):
        assert torch.equal(a, b)


@needs_cuda
@pytest.mark.parametrize("case", CONVERSION_CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{c[2]}x{c[3]}-b{c[4]}")
def test_cuda_conversion_equals_the_cpu_conversion_and_syncs_nothing(case):
    from flashattn._torch_block_mask import block_mask_from_dense_tensor

    kind, shape, L, S, block = case
    mask = structured_mask(kind, shape, torch.Generator().manual_seed(3), block)
    mask4 = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    cpu_bm = block_mask_from_dense_tensor(mask4, (L, S), (block, block))
    cuda_mask = mask4.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
    try:
        cuda_bm = block_mask_from_dense_tensor(cuda_mask, (L, S), (block, block))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
                 "full_q_num_blocks", "full_q_indices", "partial_bits", "partial_ids", "q_partial_ids"):
        assert torch.equal(getattr(cuda_bm, name).cpu(), getattr(cpu_bm, name)), name


@needs_cuda
@pytest.mark.parametrize("kind,mask_shape,L,S", [("random", (2, 4, 300, 260), 300, 260),
                                                 ("blocks", (1, 4, 512, 384), 512, 384),
                                                 ("causal", (1, 1, 1024, 1024), 1024, 1024),
                                                 ("random", (2, 1, 1, 333), 257, 333)])
def test_cuda_dense_mask_goes_block_sparse_with_the_dense_results(kind, mask_shape, L, S, monkeypatch):
    """On the GPU a boolean attn_mask is converted on the device; output and gradients
    are as close to the float64 oracle as the dense mask read as it is (STYLE.md's 2x/3x
    rule: the kernels' tile order may differ between the two), and where the torch ops
    convert it (a broadcast mask) the output equals the host conversion's bitwise (same
    block lists, same kernels; gradients may add with atomics, so they are held to the
    rule only)."""
    from flashattn import sdpa

    mask = structured_mask(kind, mask_shape, torch.Generator().manual_seed(9)).cuda()
    q, k, v = (x.requires_grad_() for x in torch_inputs("cuda", B=2, H=4, Hkv=2, L=L, S=S, E=64, seed=10))
    dout = torch.randn(q.shape, device="cuda", dtype=q.dtype)
    seen = []
    original = sdpa._convert_dense
    monkeypatch.setattr(sdpa, "_convert_dense", lambda *a, **kw: seen.append(original(*a, **kw)) or seen[-1])
    out = flashattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    monkeypatch.undo()
    # A mask with every row and column of its own is converted by the library at its
    # kernels' tiles (sdpa._convert_dense leaves it: None); a broadcast one by the torch ops.
    library_converts = mask.shape[-2:] == (L, S)
    assert seen and (seen[0] is None if library_converts else seen[0].partial_bits.is_cuda)
    converted = (out,) + torch.autograd.grad(out, (q, k, v), dout)
    out = sdpa_dense(monkeypatch, q, k, v, attn_mask=mask, enable_gqa=True)
    dense = (out,) + torch.autograd.grad(out, (q, k, v), dout)
    # A BlockMask has one row of blocks per query block: a mask broadcast over the
    # queries (size-1 rows) is expanded to L rows before the host conversion.
    host_bm = flashattn.block_mask_from_dense(mask.expand(*mask.shape[:-2], L, S).cpu(), BLOCK_SIZE=128).to("cuda")
    out = flashattn.scaled_dot_product_attention(q, k, v, block_mask=host_bm, enable_gqa=True)
    host = (out,) + torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    s = q64 @ k64.repeat_interleave(2, 1).transpose(-1, -2) / np.sqrt(64)
    oracle_out = (torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0) @ v64.repeat_interleave(2, 1))
    oracle = (oracle_out,) + torch.autograd.grad(oracle_out, (q64, k64, v64), dout.double())
    if not library_converts:  # same block lists as the host conversion, same kernels
        assert torch.equal(converted[0], host[0])
    for i, (c, d, h, o) in enumerate(zip(converted, dense, host, oracle)):
        factor = 2 if i == 0 else 3
        assert (c.double() - o).abs().max() <= factor * (d.double() - o).abs().max() + 1e-3


@needs_cuda
def test_cuda_graph_captures_the_mask_conversion():
    """The conversion runs inside capture (it would raise on a host synchronisation) and
    a replay reads the mask's current contents."""
    q, k, v = torch_inputs("cuda", L=512, S=512)
    generator = torch.Generator().manual_seed(11)
    static_mask = structured_mask("blocks", (1, 1, 512, 512), generator).cuda()
    run = lambda: flashattn.scaled_dot_product_attention(q, k, v, attn_mask=static_mask, enable_gqa=True)  # noqa: E731
    graph, static_out = capture_cuda_graph(run)
    for kind in ("causal", "random", "blocks"):
        static_mask.copy_(structured_mask(kind, (1, 1, 512, 512), generator).cuda())
        graph.replay()
        torch.testing.assert_close(static_out, run(), rtol=0, atol=0)


@needs_cuda
def test_cuda_torch_compile_inductor_converts_the_mask_and_draws_dropout():
    """The full inductor stack on the GPU: the mask conversion is compiled into the graph
    (same output as eager, bitwise: the same block lists reach the same kernels), and
    dropout draws a fresh mask per compiled call."""
    q, k, v = torch_inputs("cuda", L=384, S=320)
    mask = structured_mask("blocks", (2, 1, 384, 320), torch.Generator().manual_seed(12)).cuda()

    def run(q, k, v, mask, dropout_p):
        return flashattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=True)

    compiled = torch.compile(run, fullgraph=True, backend="inductor")
    torch.testing.assert_close(compiled(q, k, v, mask, 0.0), run(q, k, v, mask, 0.0), rtol=0, atol=0)
    assert not torch.equal(compiled(q, k, v, mask, 0.25), compiled(q, k, v, mask, 0.25))


# --- a torch BlockMask is converted once; top-left causal L < S is built once ----------------------

def flex_block_mask(device, L, S, mask_mod):
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(mask_mod, None, None, L, S, device=device)


def causal_documents(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx // 100 == kv_idx // 100)


@needs_torch
@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_torch_block_mask_is_converted_once_and_again_after_an_inplace_change(device, monkeypatch):
    """The conversion (mask_mod evaluated on the host, copied) runs at the first call only:
    repeated per call it would dominate the attention and break CUDA-graph capture. An
    in-place change of the BlockMask's lists converts anew; the results always equal the
    dense mask's."""
    from flashattn import block_mask as block_mask_module

    q, k, v = torch_inputs(device, L=300, S=300)
    block_mask = flex_block_mask(device, 300, 300, causal_documents)
    calls = []
    original = block_mask_module._convert_torch_block_mask
    monkeypatch.setattr(block_mask_module, "_convert_torch_block_mask",
                        lambda *a, **kw: calls.append(1) or original(*a, **kw))
    rows, cols = torch.arange(300, device=device)[:, None], torch.arange(300, device=device)[None, :]
    dense = causal_documents(None, None, rows, cols)
    expected = flashattn.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True)
    for _ in range(3):
        out = flashattn.scaled_dot_product_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert len(calls) == 1
    # An in-place write to a list (here one that keeps its values, so the q-side lists
    # stay consistent) bumps its version: the next call converts anew.
    block_mask.kv_indices.add_(0)
    out = flashattn.scaled_dot_product_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
    assert len(calls) == 2
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    # A new BlockMask (another object) is converted for itself.
    flashattn.scaled_dot_product_attention(q, k, v, block_mask=flex_block_mask(device, 300, 300, causal_documents),
                                           enable_gqa=True)
    assert len(calls) == 3


@needs_torch
def test_top_left_causal_mask_with_fewer_queries_is_built_once(monkeypatch):
    from flashattn import sdpa

    sdpa._cached_top_left_causal_mask.cache_clear()
    built = []
    original = sdpa.block_mask_from_rule
    monkeypatch.setattr(sdpa, "block_mask_from_rule", lambda *a, **kw: built.append(1) or original(*a, **kw))
    q, k, v = torch_inputs("cpu", L=97, S=230)
    first = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    second = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert len(built) == 1
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(first, expected, rtol=2e-5, atol=2e-5)


@needs_torch
def test_torch_block_mask_made_under_inference_mode_is_converted_per_call():
    """Inference tensors have no version counter: such a BlockMask is not cached, and works."""
    q, k, v = torch_inputs("cpu", L=200, S=200)
    with torch.inference_mode():
        block_mask = flex_block_mask("cpu", 200, 200, causal_documents)
        out = flashattn.scaled_dot_product_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
    rows, cols = torch.arange(200)[:, None], torch.arange(200)[None, :]
    expected = flashattn.scaled_dot_product_attention(q, k, v, attn_mask=causal_documents(None, None, rows, cols),
                                                      enable_gqa=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert getattr(block_mask, "_flashattn_converted", None) is None
