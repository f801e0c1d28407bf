"""flashattn on PyTorch tensors: forward and gradients against scaled_dot_product_attention
on upcast inputs, varlen vs padded, GQA, bottom-right causal, torch.compile, opcheck, and
on CUDA: CUDA-graph capture and non-default streams. Skipped without torch; the CUDA
cases skip without a GPU (or without flashattn's CUDA backend)."""

import math

import numpy as np
import pytest

import flashattn

torch = pytest.importorskip("torch", reason="PyTorch is not installed: torch tests skipped")
F = torch.nn.functional
import flashattn._torch_ops  # noqa: E402,F401  registers torch.ops.flashattn.* for the opcheck tests

from flashattn import (  # noqa: E402
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
    merge_attention_states,
)

HAS_CUDA = torch.cuda.is_available() and flashattn.cuda_available()
CUDA_SKIP_REASON = (
    "no CUDA device visible to torch" if not torch.cuda.is_available()
    else "flashattn was built without its CUDA backend")
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason=CUDA_SKIP_REASON)

DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
DTYPES = {"cpu": [torch.float32, torch.float16, torch.bfloat16], "cuda": [torch.float16, torch.bfloat16]}
DEVICE_DTYPES = [("cpu", d) for d in DTYPES["cpu"]] + [pytest.param("cuda", d, marks=needs_cuda) for d in DTYPES["cuda"]]
FLOORS = {torch.float32: 1e-6, torch.float16: 1e-4, torch.bfloat16: 1e-3}


def dtype_id(value):
    return str(value).replace("torch.", "") if isinstance(value, torch.dtype) else None


# --- the reference ----------------------------------------------------------------------------


def allowed_mask(seqlen_q, seqlen_k, causal, window, device):
    """(seqlen_q, seqlen_k) bool, bottom-right aligned: SDPA's is_causal is top-left, so
    the reference always gets this explicit mask."""
    left, right = window
    if causal:
        right = 0
    rows = torch.arange(seqlen_q, device=device)[:, None] + seqlen_k - seqlen_q
    cols = torch.arange(seqlen_k, device=device)[None, :]
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= cols >= rows - left
    if right >= 0:
        mask &= cols <= rows + right
    return mask


def reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, softmax_scale=None, upcast=True):
    """(out, lse) in flash_attn's layout, differentiable. With upcast: float64 (the oracle);
    otherwise in the input dtype (the low-precision reference of the tolerance rule)."""
    dtype = torch.float64 if upcast else q.dtype
    group = q.shape[2] // k.shape[2]
    qt = q.to(dtype).transpose(1, 2)  # (batch, heads_q, seqlen_q, d)
    kt = k.to(dtype).repeat_interleave(group, dim=2).transpose(1, 2)
    vt = v.to(dtype).repeat_interleave(group, dim=2).transpose(1, 2)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    mask = allowed_mask(q.shape[1], k.shape[1], causal, window, q.device)
    scores = (qt @ kt.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # -inf for fully masked rows
    if softcap == 0 and bool(mask.any(dim=-1).all()):
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale)
    else:  # SDPA has no softcap and gives NaN on fully masked rows
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        out = probs @ vt
    return out.transpose(1, 2), lse


def random_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    def make(*shape):
        return torch.randn(*shape, generator=generator).to(dtype=dtype, device=device).requires_grad_()
    return (make(batch, seqlen_q, heads_q, head_dim), make(batch, seqlen_k, heads_kv, head_dim),
            make(batch, seqlen_k, heads_kv, head_dim))


def max_error(value, oracle):
    value, oracle = value.double(), oracle.double()
    finite = torch.isfinite(oracle)
    assert torch.equal(value[~finite], oracle[~finite]), "-inf entries differ"
    return (value[finite] - oracle[finite]).abs().max().item() if finite.any() else 0.0


def assert_within_rule(value, oracle, lowprec, dtype, factor, what):
    """max|value - oracle| <= factor * max|lowprec - oracle| + floor; the floor, a few ulps,
    scales with the largest magnitude (gradients reach 10 and more)."""
    assert not torch.isnan(value).any(), f"{what}: NaN"
    error = max_error(value, oracle)
    finite = oracle[torch.isfinite(oracle)]
    magnitude = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
    bound = factor * max_error(lowprec, oracle) + FLOORS[dtype] * magnitude
    assert error <= bound, f"{what}: max error {error:.3g} > bound {bound:.3g}"


def assert_close_ulps(got, expected, ulps=4):
    """|got - expected| <= ulps * eps(dtype) * max(1, max|expected|): for two runs of our
    kernels that may round differently (different tilings), not for accuracy."""
    scale = max(1.0, expected.double().abs().max().item()) if expected.numel() else 1.0
    tolerance = ulps * torch.finfo(expected.dtype).eps * scale
    torch.testing.assert_close(got, expected, rtol=0, atol=tolerance)


def grads(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout)


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
SHAPES = [
    (2, 33, 33, 4, 4, 64),
    (1, 97, 113, 4, 2, 32),
    (2, 129, 65, 4, 1, 128),
    (1, 1, 203, 8, 2, 64),
]
MASKS = {
    "full": {},
    "causal": {"causal": True},
    "window": {"window": (16, 4)},
    "causal_softcap": {"causal": True, "softcap": 5.0},
}


def call_kwargs(mask):
    kwargs = {"causal": mask.get("causal", False), "window_size": mask.get("window", (-1, -1))}
    if "softcap" in mask:
        kwargs["softcap"] = mask["softcap"]
    return kwargs


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES, ids=dtype_id)
def test_forward_and_gradients_vs_sdpa(device, dtype, shape, mask_name):
    mask = MASKS[mask_name]
    q, k, v = random_qkv(*shape, dtype, device)
    out, lse, probs = flash_attn_func(q, k, v, return_attn_probs=True, **call_kwargs(mask))
    assert probs is None and out.dtype == dtype and out.shape == q.shape and lse.dtype == torch.float32
    oracle_out, oracle_lse = reference(q, k, v, **mask)
    lowprec_out, lowprec_lse = reference(q, k, v, upcast=False, **mask)
    assert_within_rule(out, oracle_out, lowprec_out, dtype, 2, "out")
    assert_within_rule(lse, oracle_lse, lowprec_lse.float(), dtype, 2, "lse")

    dout = torch.randn_like(out)
    for name, ours, oracle, lowprec in zip(("dq", "dk", "dv"), grads(out, (q, k, v), dout),
                                           grads(oracle_out, (q, k, v), dout.double()),
                                           grads(lowprec_out, (q, k, v), dout)):
        assert ours.dtype == dtype
        assert_within_rule(ours, oracle, lowprec, dtype, 3, name)


@pytest.mark.parametrize("device", DEVICES)
def test_causal_bottom_right_with_more_queries_than_keys(device):
    # Rows 0..5 see no key: output 0, LSE -inf, gradients 0, never NaN.
    q, k, v = random_qkv(1, 10, 4, 2, 2, 32, torch.float32 if device == "cpu" else torch.float16, device)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.all(out[:, :6] == 0) and torch.all(torch.isneginf(lse[:, :, :6]))
    dq, dk, dv = grads(out, (q, k, v), torch.randn_like(out))
    assert torch.all(dq[:, :6] == 0)
    assert not any(torch.isnan(g).any() for g in (dq, dk, dv))


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_equals_padded(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    lengths_q, lengths_k = [7, 0, 33, 18], [11, 5, 33, 1]
    heads_q, heads_kv, head_dim = 4, 2, 64
    q, k, v = random_qkv(1, sum(lengths_q), sum(lengths_k), heads_q, heads_kv, head_dim, dtype, device, seed=1)
    q, k, v = (x.detach()[0].requires_grad_() for x in (q, k, v))  # (total, heads, d)
    cu_q = torch.tensor([0] + list(np.cumsum(lengths_q)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(np.cumsum(lengths_k)), dtype=torch.int32, device=device)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True,
                                         deterministic=True, return_attn_probs=True)
    assert lse.shape == (heads_q, q.shape[0])
    dout = torch.randn_like(out)
    dq, dk, dv = grads(out, (q, k, v), dout)
    for b in range(len(lengths_q)):
        rq = slice(int(cu_q[b]), int(cu_q[b + 1]))
        rk = slice(int(cu_k[b]), int(cu_k[b + 1]))
        qb, kb, vb = (x.detach()[r][None].requires_grad_() for x, r in ((q, rq), (k, rk), (v, rk)))
        out_b, lse_b, _ = flash_attn_func(qb, kb, vb, causal=True, deterministic=True, return_attn_probs=True)
        assert_close_ulps(out[rq], out_b[0])
        assert_close_ulps(lse[:, rq], lse_b[0])
        if lengths_q[b] and lengths_k[b]:
            dqb, dkb, dvb = grads(out_b, (qb, kb, vb), dout[rq][None])
            assert_close_ulps(dq[rq], dqb[0])
            assert_close_ulps(dk[rk], dkb[0])
            assert_close_ulps(dv[rk], dvb[0])


@pytest.mark.parametrize("device", DEVICES)
def test_packed_forms_equal_separate_tensors_with_gradients(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    generator = torch.Generator().manual_seed(2)
    qkv = torch.randn(2, 19, 3, 4, 64, generator=generator).to(device=device, dtype=dtype).requires_grad_()
    # deterministic: the GPU's dQ otherwise accumulates with atomics in any order.
    out_packed = flash_attn_qkvpacked_func(qkv, causal=True, deterministic=True)
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    out = flash_attn_func(q, k, v, causal=True, deterministic=True)
    torch.testing.assert_close(out_packed, out, rtol=0, atol=0)
    dout = torch.randn_like(out)
    (dqkv,) = grads(out_packed, (qkv,), dout)
    torch.testing.assert_close(dqkv, torch.stack(grads(out, (q, k, v), dout), dim=2), rtol=0, atol=0)

    kv = qkv.detach()[:, :, 1:].clone().requires_grad_()
    torch.testing.assert_close(flash_attn_kvpacked_func(q, kv, causal=True), out, rtol=0, atol=0)
    cu = torch.tensor([0, 19, 38], dtype=torch.int32, device=device)
    flat = qkv.detach().reshape(38, 3, 4, 64)
    torch.testing.assert_close(flash_attn_varlen_qkvpacked_func(flat, cu, 19, causal=True).reshape(out.shape), out,
                               rtol=0, atol=0)
    torch.testing.assert_close(
        flash_attn_varlen_kvpacked_func(flat[:, 0], flat[:, 1:], cu, cu, 19, 19, causal=True).reshape(out.shape), out,
        rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_inference_fast_path_equals_autograd_path(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = random_qkv(2, 40, 50, 4, 2, 64, dtype, device, seed=3)
    with_graph = flash_attn_func(q, k, v, causal=True)
    assert with_graph.requires_grad
    with torch.no_grad():
        without_graph = flash_attn_func(q, k, v, causal=True)
    assert not without_graph.requires_grad
    torch.testing.assert_close(with_graph, without_graph, rtol=0, atol=0)


# Eager autograd runs through a plain torch.autograd.Function; torch.compile (and anyone
# calling torch.ops.flashattn._fwd) through the custom op with register_autograd. Both
# must give the same bits: same native forward, same native backward.
ROUTE_CASES = {
    "causal": dict(shape=(2, 40, 50, 4, 2, 64), kwargs={"causal": True}),
    "window_softcap_scale": dict(shape=(1, 33, 33, 4, 4, 64),
                                 kwargs={"window_size": (8, 3), "softcap": 4.0, "softmax_scale": 0.3}),
    "gqa_full": dict(shape=(2, 17, 65, 8, 2, 64), kwargs={}),
}


def op_route(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, softmax_scale=None, deterministic=False):
    return torch.ops.flashattn._fwd(q, k, v, None, None, 0, 0, softmax_scale, causal, window_size[0],
                                    window_size[1], softcap, deterministic)


@pytest.mark.parametrize("case", list(ROUTE_CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_eager_function_route_equals_custom_op_route(device, case):
    dtype = torch.float32 if device == "cpu" else torch.float16
    shape, kwargs = ROUTE_CASES[case]["shape"], dict(ROUTE_CASES[case]["kwargs"], deterministic=True)
    q, k, v = random_qkv(*shape, dtype, device, seed=40)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **kwargs)
    assert type(out.grad_fn).__name__ == "_FlashAttentionBackward", "eager autograd must not go through the op"
    out_plain = flash_attn_func(q, k, v, **kwargs)  # without the LSE output: one output, the same bits
    op_out, op_lse = op_route(q, k, v, **kwargs)
    assert "_FlashAttention" not in type(op_out.grad_fn).__name__
    assert torch.equal(out, op_out) and torch.equal(out_plain, op_out) and torch.equal(lse, op_lse)
    dout = torch.randn_like(out)
    function_grads = grads(out, (q, k, v), dout)
    plain_grads = grads(out_plain, (q, k, v), dout)
    op_grads = grads(op_out, (q, k, v), dout)
    for name, a, b, c in zip(("dq", "dk", "dv"), function_grads, plain_grads, op_grads):
        assert torch.equal(a, c), f"{name}: the Function and custom-op routes differ"
        assert torch.equal(b, c), f"{name}: with and without the LSE output differ"


@pytest.mark.parametrize("device", DEVICES)
def test_eager_function_route_equals_custom_op_route_varlen(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = random_qkv(1, 30, 41, 4, 2, 64, dtype, device, seed=41)
    q, k, v = (x.detach()[0].requires_grad_() for x in (q, k, v))
    cu_q = torch.tensor([0, 12, 30], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 20, 41], dtype=torch.int32, device=device)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 18, 21, causal=True, deterministic=True)
    assert type(out.grad_fn).__name__ == "_FlashAttentionBackward"
    op_out, _ = torch.ops.flashattn._fwd(q, k, v, cu_q, cu_k, 18, 21, None, True, -1, -1, 0.0, True)
    assert torch.equal(out, op_out)
    dout = torch.randn_like(out)
    for a, b in zip(grads(out, (q, k, v), dout), grads(op_out, (q, k, v), dout)):
        assert torch.equal(a, b)


def test_eager_function_route_is_once_differentiable():
    q, k, v = random_qkv(1, 8, 8, 2, 2, 16, torch.float32, "cpu", seed=42)
    weight = torch.randn(q.shape, requires_grad=True)  # makes the incoming gradient differentiable
    out = flash_attn_func(q, k, v)
    (dq,) = torch.autograd.grad((out * weight).sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.sum().backward()


def test_native_call_takes_dlpack_capsules_too():
    # Older torch (no __dlpack_c_exchange_api__) and other frameworks reach the native
    # module through DLPack capsules / __dlpack__: the same arrays, the same bits.
    from torch.utils.dlpack import to_dlpack
    q, k, v = (x.detach() for x in random_qkv(2, 9, 12, 4, 2, 32, torch.float32, "cpu", seed=43))
    expected, expected_lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    out, lse = torch.empty_like(q), torch.empty_like(expected_lse)
    flashattn._C.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), to_dlpack(lse), None, None, 0, 0,
                         None, True, -1, -1, 0.0, "automatic", 0, 0)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    # The package's own capsule route (torch without the C exchange API) gives the same bits.
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    flashattn._torch_ops._with_capsules(flashattn._C.forward)(q, k, v, out, lse, None, None, 0, 0, None, True, -1, -1,
                                                              0.0, "automatic", 0, None)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    with pytest.raises(TypeError, match="k: expected a torch.Tensor like q, got PyCapsule"):
        flashattn._C.forward(q, to_dlpack(k), v, out, None, None, None, 0, 0, None, True, -1, -1, 0.0, "automatic", 0,
                             None)


def test_native_backward_asks_for_scratch_only_when_needed():
    q, k, v = (x.detach() for x in random_qkv(1, 16, 16, 2, 2, 32, torch.float32, "cpu", seed=44))
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    dout = torch.randn_like(out)
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))

    def no_scratch_on_the_cpu(nbytes):
        raise AssertionError(f"asked for {nbytes} bytes of scratch on the CPU")

    flashattn._C.backward(q, k, v, out, dout, lse, dq, dk, dv, no_scratch_on_the_cpu, None, None, 0, 0, None, False,
                          -1, -1, 0.0, False, "automatic", 0, None)
    for got, want in zip((dq, dk, dv), grads(flash_attn_func(*(x.requires_grad_() for x in (q, k, v))), (q, k, v),
                                             dout)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_backward_is_bitwise_repeatable(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = random_qkv(2, 150, 150, 4, 1, 64, dtype, device, seed=4)
    dout = torch.randn(q.shape, dtype=dtype, device=device)
    first = grads(flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), dout)
    second = grads(flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), dout)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = random_qkv(2, 64, 80, 4, 2, 64, dtype, device, seed=5)

    def loss(q, k, v):
        out = flash_attn_func(q, k, v, causal=True, window_size=(32, 0), deterministic=True)
        return (out.float() ** 2).sum()

    # The forward graph is compiled whole; AOT autograd derives the compiled backward,
    # which calls flashattn::_bwd. On the CPU aot_eager exercises dynamo + fake tensors
    # + AOT autograd without compiling C++; on the GPU the full inductor stack.
    backend = "aot_eager" if device == "cpu" else "inductor"
    compiled = torch.compile(loss, fullgraph=True, backend=backend)
    got = compiled(q, k, v)
    expected = loss(q, k, v)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for got_grad, expected_grad in zip(grads(got, (q, k, v), None), grads(expected, (q, k, v), None)):
        torch.testing.assert_close(got_grad, expected_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_varlen_fullgraph(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = random_qkv(1, 30, 30, 2, 2, 32, dtype, device, seed=6)
    q, k, v = (x.detach()[0] for x in (q, k, v))
    cu = torch.tensor([0, 10, 30], dtype=torch.int32, device=device)

    def run(q, k, v, cu):
        return flash_attn_varlen_func(q, k, v, cu, cu, 20, 20, causal=True)

    compiled = torch.compile(run, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    torch.testing.assert_close(compiled(q, k, v, cu), run(q, k, v, cu), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = random_qkv(2, 24, 40, 4, 2, 32, dtype, device, seed=7)
    fwd_args = (q, k, v, None, None, 0, 0, None, True, -1, -1, 0.0, False)
    torch.library.opcheck(torch.ops.flashattn._fwd.default, fwd_args)
    torch.library.opcheck(torch.ops.flashattn._fwd.default, (q, k, v, None, None, 0, 0, 0.2, False, 8, 3, 4.0, True))

    # (batch, seqlen, heads, d) views of (batch, heads, seqlen, d) storage: strides are preserved, not copied.
    q_strided = q.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    assert not q_strided.is_contiguous()
    torch.library.opcheck(torch.ops.flashattn._fwd.default, (q_strided,) + fwd_args[1:])

    qv, kv, vv = (x.detach()[0] for x in (q, k, v))
    cu_q = torch.tensor([0, 9, 24], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 30, 40], dtype=torch.int32, device=device)
    varlen_args = (qv.requires_grad_(), kv.requires_grad_(), vv.requires_grad_(), cu_q, cu_k, 15, 30, None, True, -1,
                   -1, 0.0, False)
    torch.library.opcheck(torch.ops.flashattn._fwd.default, varlen_args)

    out, lse = torch.ops.flashattn._fwd(*(x.detach() if isinstance(x, torch.Tensor) else x for x in fwd_args))
    bwd_args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, None, None, 0, 0, None, True,
                -1, -1, 0.0, False)
    torch.library.opcheck(torch.ops.flashattn._bwd.default, bwd_args)

    torch.library.opcheck(torch.ops.flashattn._bwd.default, (bwd_args[0], q_strided.detach()) + bwd_args[2:])

    lse_b = torch.randn_like(lse)
    torch.library.opcheck(torch.ops.flashattn._merge.default, (out, lse, torch.randn_like(out), lse_b))


@pytest.mark.parametrize("device", DEVICES)
def test_merge_attention_states(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    with torch.no_grad():
        q, k, v = random_qkv(2, 12, 30, 4, 4, 64, dtype, device, seed=8)
        out_a, lse_a, _ = flash_attn_func(q, k[:, :11], v[:, :11], return_attn_probs=True)
        out_b, lse_b, _ = flash_attn_func(q, k[:, 11:], v[:, 11:], return_attn_probs=True)
        out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
        full_out, full_lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert_close_ulps(out, full_out, ulps=32)
    assert_close_ulps(lse, full_lse, ulps=64)


def test_error_types_and_messages():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(TypeError, match="k: dtype mismatch: expected float32 \\(like q\\), got bfloat16"):
        flash_attn_func(q, q.bfloat16(), q)
    with pytest.raises(TypeError, match="q: unsupported dtype"):
        flash_attn_func(q.double(), q.double(), q.double())
    with pytest.raises(TypeError, match="k: expected a torch.Tensor like q, got ndarray"):
        flash_attn_func(q, q.numpy(), q)
    with pytest.raises(ValueError, match="q: wrong rank: expected 4, got 3"):
        flash_attn_func(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="dropout_p: must be in"):
        flash_attn_func(q, q, q, dropout_p=1.5)
    with pytest.raises(ValueError, match="alibi_slopes: shape mismatch"):
        flash_attn_func(q, q, q, alibi_slopes=torch.zeros(3))
    # flash_attn's rule: causal with a window keeps window_left, window_right becomes 0.
    assert torch.equal(flash_attn_func(q, q, q, causal=True, window_size=(3, 2)),
                       flash_attn_func(q, q, q, window_size=(3, 0)))
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        flash_attn_func(q, torch.randn(1, 8, 2, 32)[..., ::2], q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")
def test_device_mismatch_is_rejected():
    q = torch.randn(1, 8, 2, 64, dtype=torch.float16)
    with pytest.raises((ValueError, NotImplementedError), match="k: device mismatch|cuda"):
        flash_attn_func(q.cuda() if HAS_CUDA else q, q if HAS_CUDA else q.cuda(), q)


# --- KV cache ---------------------------------------------------------------------------------


def kvcache_problem(device, dtype, seed=30):
    generator = torch.Generator().manual_seed(seed)
    def make(*shape):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)
    k_cache, v_cache = make(2, 256, 2, 64), make(2, 256, 2, 64)
    q, k_new, v_new = make(2, 1, 8, 64), make(2, 1, 2, 64), make(2, 1, 2, 64)
    cache_seqlens = torch.tensor([17, 200], dtype=torch.int32, device=device)
    return q, k_cache, v_cache, k_new, v_new, cache_seqlens


@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_append_and_decode(device, num_splits):
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k_cache, v_cache, k_new, v_new, cache_seqlens = kvcache_problem(device, dtype)
    k_before = k_cache.clone()
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens, causal=True,
                                       num_splits=num_splits, return_softmax_lse=True)
    for b, length in enumerate(cache_seqlens.tolist()):
        assert torch.equal(k_cache[b, length], k_new[b, 0]) and torch.equal(v_cache[b, length], v_new[b, 0])
        assert torch.equal(k_cache[b, :length], k_before[b, :length])
        keys, values = k_cache[b:b + 1, :length + 1], v_cache[b:b + 1, :length + 1]
        oracle_out, oracle_lse = reference(q[b:b + 1], keys, values, causal=True)
        lowprec_out, lowprec_lse = reference(q[b:b + 1], keys, values, causal=True, upcast=False)
        assert_within_rule(out[b:b + 1], oracle_out, lowprec_out, dtype, 2, "out")
        assert_within_rule(lse[b:b + 1], oracle_lse, lowprec_lse.float(), dtype, 2, "lse")


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_torch_compile_fullgraph(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k_cache, v_cache, k_new, v_new, cache_seqlens = kvcache_problem(device, dtype, seed=31)

    def step(q, k_cache, v_cache, k_new, v_new, cache_seqlens):
        return flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens, causal=True)

    eager_caches = (k_cache.clone(), v_cache.clone())
    expected = step(q, *eager_caches, k_new, v_new, cache_seqlens)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    got = compiled(q, k_cache, v_cache, k_new, v_new, cache_seqlens)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert torch.equal(k_cache, eager_caches[0]) and torch.equal(v_cache, eager_caches[1])


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_opcheck(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k_cache, v_cache, k_new, v_new, cache_seqlens = kvcache_problem(device, dtype, seed=32)
    torch.library.opcheck(torch.ops.flashattn._kvcache.default,
                          (q, k_cache, v_cache, k_new, v_new, None, None, cache_seqlens, None, None, None, None, None,
                           True, -1, -1, 0.0, True, 0))
    torch.library.opcheck(torch.ops.flashattn._kvcache.default,
                          (q, k_cache, v_cache, None, None, None, None, None, 100, None, None, None, 0.3, False, 16,
                           0, 2.0, True, 2))


# --- CUDA only: graphs and streams -------------------------------------------------------------


@needs_cuda
def test_cuda_graph_capture_and_replay():
    q, k, v = (x.detach() for x in random_qkv(2, 128, 128, 8, 2, 64, torch.float16, "cuda", seed=9))
    static = [x.clone() for x in (q, k, v)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        flash_attn_func(*static, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = flash_attn_func(*static, causal=True)
    for seed in (10, 11):
        fresh = [x.detach() for x in random_qkv(2, 128, 128, 8, 2, 64, torch.float16, "cuda", seed=seed)]
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.testing.assert_close(static_out, flash_attn_func(*fresh, causal=True), rtol=0, atol=0)


@needs_cuda
def test_cuda_graph_capture_of_forward_and_backward():
    q, k, v = random_qkv(1, 96, 96, 4, 4, 64, torch.float16, "cuda", seed=12)
    dout = torch.randn(q.shape, dtype=torch.float16, device="cuda")
    expected = grads(flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), dout)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        grads(flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), dout)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = grads(flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), dout)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def forward_through_capsules(q, k, v, causal):
    """The capsule route of torch without the DLPack C exchange API, stream from Python."""
    out = torch.empty_like(q)
    flashattn._torch_ops._with_capsules(flashattn._C.forward)(q, k, v, out, None, None, None, 0, 0, None, causal, -1,
                                                              -1, 0.0, "automatic", 0, None)
    return out


@needs_cuda
@pytest.mark.parametrize("route", ["exchange_api", "capsules"])
def test_non_default_stream(route):
    # The inputs are written on a side stream only after a long sleep there. A kernel
    # launched on the caller's current stream (the side stream) waits for them; one
    # wrongly launched on the default stream would run at once and read the zeros.
    attention = flash_attn_func if route == "exchange_api" else forward_through_capsules
    source = [x.detach() for x in random_qkv(2, 256, 256, 8, 2, 64, torch.float16, "cuda", seed=13)]
    expected = flash_attn_func(*source, causal=True)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        q, k, v = (torch.zeros_like(x) for x in source)
        torch.cuda._sleep(100_000_000)  # tens of milliseconds of GPU time on `stream`
        for dst, src in zip((q, k, v), source):
            dst.copy_(src)
        out = attention(q, k, v, causal=True)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@needs_cuda
def test_cuda_varlen_gradients_vs_reference():
    lengths = [17, 64, 1, 129]
    heads_q, heads_kv, head_dim = 8, 2, 128
    total = sum(lengths)
    q, k, v = random_qkv(1, total, total, heads_q, heads_kv, head_dim, torch.bfloat16, "cuda", seed=14)
    q, k, v = (x.detach()[0].requires_grad_() for x in (q, k, v))
    cu = torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int32, device="cuda")
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
    dout = torch.randn_like(out)
    ours = grads(out, (q, k, v), dout)
    for b in range(len(lengths)):
        r = slice(int(cu[b]), int(cu[b + 1]))
        qb, kb, vb = (x.detach()[r][None].requires_grad_() for x in (q, k, v))
        oracle_out, _ = reference(qb, kb, vb, causal=True)
        lowprec_out, _ = reference(qb, kb, vb, causal=True, upcast=False)
        assert_within_rule(out[r][None], oracle_out, lowprec_out, torch.bfloat16, 2, "out")
        db = dout[r][None]
        for got, oracle, lowprec in zip(ours, grads(oracle_out, (qb, kb, vb), db.double()),
                                        grads(lowprec_out, (qb, kb, vb), db)):
            assert_within_rule(got[r][None], oracle, lowprec, torch.bfloat16, 3, "grad")


def _paged_copy(k, v, cu_k, page_size, seed):
    """k/v (total_k, heads, d) of the sequences cu_k as shuffled pages of one pool, -1 in unused table slots."""
    lengths = [int(n) for n in (cu_k[1:] - cu_k[:-1]).tolist()]
    pages = [-(-n // page_size) for n in lengths]
    generator = torch.Generator().manual_seed(seed)
    num_blocks = sum(pages) + 1
    order = torch.randperm(num_blocks, generator=generator).tolist()
    k_pool = torch.randn((num_blocks, page_size) + tuple(k.shape[1:]), generator=generator).to(k.dtype).to(k.device)
    v_pool = torch.randn(k_pool.shape, generator=generator).to(v.dtype).to(v.device)
    table = torch.full((len(lengths), max(pages) + 1), -1, dtype=torch.int32)
    used = 0
    starts = cu_k.tolist()
    for b, n in enumerate(lengths):
        for page in range(pages[b]):
            table[b, page] = order[used]
            used += 1
            rows = slice(page * page_size, min(n, (page + 1) * page_size))
            count = rows.stop - rows.start
            k_pool[order[used - 1], :count] = k[starts[b] + rows.start:starts[b] + rows.stop]
            v_pool[order[used - 1], :count] = v[starts[b] + rows.start:starts[b] + rows.stop]
    return k_pool, v_pool, table.to(k.device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [1, 16, 256])
def test_paged_varlen_equals_packed_varlen(device, page_size):
    dtype = torch.float16
    generator = torch.Generator().manual_seed(page_size)
    cu_q = torch.tensor([0, 5, 5, 6, 76], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 12, 12, 141], dtype=torch.int32)
    q = torch.randn((76, 4, 64), generator=generator).to(dtype).to(device)
    k = torch.randn((141, 2, 64), generator=generator).to(dtype).to(device)
    v = torch.randn((141, 2, 64), generator=generator).to(dtype).to(device)
    k_pool, v_pool, table = _paged_copy(k, v, cu_k, page_size, seed=page_size + 1)
    cu_q, cu_k = cu_q.to(device), cu_k.to(device)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 70, 129, causal=True, return_attn_probs=True)
    paged, paged_lse, _ = flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, 70, 129, causal=True,
                                                 return_attn_probs=True, block_table=table)
    assert torch.equal(paged, out)
    assert torch.equal(paged_lse, lse)
    with pytest.raises(NotImplementedError, match="block_table"):
        flash_attn_varlen_func(q.requires_grad_(), k_pool, v_pool, cu_q, cu_k, 70, 129, block_table=table)


@needs_cuda
@pytest.mark.parametrize("head_dim", [1, 7, 59, 111, 255])
def test_cuda_head_dims_not_a_multiple_of_8(head_dim):
    # Staged zero-padded to the next multiple of 8; the scale stays 1/sqrt(head_dim).
    generator = torch.Generator().manual_seed(head_dim)
    q, k, v = (torch.randn((2, 97, 2, head_dim), generator=generator).to(torch.float16).cuda().requires_grad_()
               for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    dout = torch.randn(out.shape, generator=generator).to(torch.float16).cuda()
    out.backward(dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q64, k64) / math.sqrt(head_dim)
    mask = torch.ones(97, 97, dtype=torch.bool, device="cuda").tril()
    probabilities = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    reference = torch.einsum("bhqk,bkhd->bqhd", probabilities, v64)
    reference.backward(dout.double())
    torch.testing.assert_close(out.double(), reference, atol=2e-3, rtol=0)
    for ours, exact in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(ours.double(), exact, atol=2e-2 * max(1.0, exact.abs().max().item()), rtol=0)
