"""FP8 (float8_e4m3fn) inputs from Python: the NumPy API of flashattn.fp8 (uint8 codes,
explicit), and torch's float8_e4m3fn tensors through flash_attn_func /
flash_attn_varlen_func with FA3's q_descale/k_descale/v_descale (CPU torch; skipped
without torch). The oracle: float64 attention of the dequantised inputs."""

import numpy as np
import pytest

import flashattn
import reference
from flashattn import fp8


def _gaussian(shape, seed, outliers=0.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if outliers:
        x += (rng.random(shape) < outliers) * rng.normal(0.0, 10.0, shape).astype(np.float32)
    return x


# --- NumPy ---------------------------------------------------------------------------


def test_quantize_numpy_descale_and_rounding():
    x = _gaussian((2, 33, 4, 32), 1, outliers=0.01)
    codes, descale = flashattn.quantize_fp8(x, heads_kv=2)
    assert codes.dtype == np.uint8 and codes.shape == x.shape
    assert descale.dtype == np.float32 and descale.shape == (2, 2)
    amax = np.abs(x.reshape(2, 33, 2, 2, 32)).max(axis=(1, 3, 4))
    np.testing.assert_array_equal(descale, (amax / np.float32(448.0)).astype(np.float32))
    back = fp8.dequantize_fp8(codes, descale)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4, plus the subnormal step 2^-10 * descale.
    per_head = np.repeat(descale, 2, axis=1)[:, None, :, None]
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0**-4 + per_head * 2.0**-10)
    assert np.any(codes == 0x7E)  # the amax element of each group lands on 448


def test_decode_table_matches_the_definition():
    codes = np.arange(256, dtype=np.uint8).reshape(1, 1, 1, 256)
    values = fp8.dequantize_fp8(codes, np.ones((1, 1), np.float32)).ravel()
    assert values[0x7E] == 448.0 and values[0x01] == 2.0**-9 and values[0x38] == 1.0 and values[0xB8] == -1.0
    assert np.isnan(values[0x7F]) and np.isnan(values[0xFF])
    assert np.signbit(values[0x80]) and values[0x80] == 0.0


def test_incoherent_quantization_preserves_dot_products():
    q = _gaussian((1, 16, 2, 64), 2, outliers=0.01)
    k = _gaussian((1, 16, 2, 64), 3, outliers=0.01)
    q8, qs = flashattn.quantize_fp8(q, incoherent=True, seed=5)
    k8, ks = flashattn.quantize_fp8(k, incoherent=True, seed=5)
    qr, kr = fp8.dequantize_fp8(q8, qs), fp8.dequantize_fp8(k8, ks)
    exact = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k.astype(np.float64))
    rotated = np.einsum("bqhd,bkhd->bhqk", qr.astype(np.float64), kr.astype(np.float64))
    scale = np.linalg.norm(q, axis=-1).max() * np.linalg.norm(k, axis=-1).max()
    assert np.abs(rotated - exact).max() < 0.15 * scale  # only the quantisation error remains
    k_other, _ = flashattn.quantize_fp8(k, incoherent=True, seed=6)
    assert not np.array_equal(k_other, k8)  # the seed picks the signs


@pytest.mark.parametrize("causal", [False, True])
def test_numpy_fp8_attention_matches_the_dequantised_oracle(causal):
    q = _gaussian((2, 37, 4, 64), 4, outliers=0.01)
    k = _gaussian((2, 50, 2, 64), 5, outliers=0.01)
    v = _gaussian((2, 50, 2, 64), 6, outliers=0.01)
    (q8, qs), (k8, ks), (v8, vs) = (flashattn.quantize_fp8(x, heads_kv=2) for x in (q, k, v))
    out, lse = fp8.flash_attn_func(q8, k8, v8, qs, ks, vs, causal=causal, return_softmax_lse=True)
    assert out.dtype == np.float16
    oracle, oracle_lse = reference.attention(fp8.dequantize_fp8(q8, qs), fp8.dequantize_fp8(k8, ks),
                                             fp8.dequantize_fp8(v8, vs), causal=causal)
    # float32 arithmetic, then one float16 rounding of out.
    np.testing.assert_allclose(out.astype(np.float64), oracle, rtol=2.0**-10, atol=1e-5)
    finite = np.isfinite(oracle_lse)
    np.testing.assert_allclose(lse[finite], oracle_lse[finite], rtol=0, atol=1e-4)


def test_numpy_fp8_scalar_descales_and_varlen():
    cu = np.array([0, 7, 7, 20], dtype=np.int32)
    x = _gaussian((20, 2, 32), 7)
    codes, descale = flashattn.quantize_fp8(x)  # rank 3: one batch, descale (1, heads)
    assert descale.shape == (1, 2)
    out = fp8.flash_attn_func(codes, codes, codes, descale, descale, 0.5, cu_seqlens_q=cu, cu_seqlens_k=cu,
                              max_seqlen_q=13, max_seqlen_k=13, causal=True)
    dequantised = fp8.dequantize_fp8(codes, descale)
    for b in range(3):
        rows = slice(cu[b], cu[b + 1])
        if cu[b] == cu[b + 1]:
            continue
        oracle, _ = reference.attention(dequantised[None, rows], dequantised[None, rows], 0.5 * fp8.dequantize_fp8(
            codes, np.ones((1, 2), np.float32))[None, rows], causal=True)
        np.testing.assert_allclose(out[rows].astype(np.float64), oracle[0], rtol=2.0**-10, atol=1e-5)


def test_numpy_errors_name_the_argument():
    codes = np.zeros((1, 4, 2, 32), dtype=np.uint8)
    with pytest.raises(TypeError, match="flashattn.fp8.flash_attn_func"):
        flashattn.flash_attn_func(codes, codes, codes, q_descale=1.0)
    with pytest.raises(TypeError, match="q: expected a uint8"):
        fp8.flash_attn_func(codes.astype(np.float32), codes, codes)
    with pytest.raises(TypeError, match="k_descale"):
        fp8.flash_attn_func(codes, codes, codes, k_descale=np.ones((1, 2), np.float64))
    with pytest.raises(ValueError, match="v_descale: not broadcastable"):
        fp8.flash_attn_func(codes, codes, codes, v_descale=np.ones((1, 3), np.float32))
    with pytest.raises(TypeError, match="out_dtype"):
        fp8.flash_attn_func(codes, codes, codes, out_dtype=np.float32)
    with pytest.raises(ValueError, match="q_descale: given, but the inputs are not float8_e4m3fn"):
        flashattn.flash_attn_func(np.zeros((1, 4, 2, 32), np.float32), np.zeros((1, 4, 2, 32), np.float32),
                                  np.zeros((1, 4, 2, 32), np.float32), q_descale=1.0)
    with pytest.raises(NotImplementedError, match="head_dim must be a power of two"):
        flashattn.quantize_fp8(np.zeros((1, 4, 2, 48), np.float32), incoherent=True)
    with pytest.raises(ValueError, match="heads_kv"):
        flashattn.quantize_fp8(np.zeros((1, 4, 3, 32), np.float32), heads_kv=2)


# --- torch (CPU) -----------------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed: torch FP8 tests skipped")


def test_torch_quantize_matches_torchs_cast():
    torch = _torch()
    x = torch.from_numpy(_gaussian((2, 19, 4, 64), 8, outliers=0.01))
    codes, descale = flashattn.quantize_fp8(x, heads_kv=4)
    assert codes.dtype == torch.float8_e4m3fn and descale.shape == (2, 4)
    expected = (x / descale[:, None, :, None]).to(torch.float8_e4m3fn)  # PyTorch's own rounding
    assert torch.equal(codes.view(torch.uint8), expected.view(torch.uint8))
    numpy_codes, numpy_descale = flashattn.quantize_fp8(x.numpy(), heads_kv=4)
    assert np.array_equal(numpy_codes, codes.view(torch.uint8).numpy())
    assert np.array_equal(numpy_descale, descale.numpy())


@pytest.mark.parametrize("causal", [False, True])
def test_torch_fp8_flash_attn_func(causal):
    torch = _torch()
    q, k, v = (torch.from_numpy(_gaussian(shape, seed, 0.01)) for shape, seed in
               (((2, 40, 4, 64), 9), ((2, 33, 2, 64), 10), ((2, 33, 2, 64), 11)))
    (q8, qs), (k8, ks), (v8, vs) = (flashattn.quantize_fp8(x, heads_kv=2) for x in (q, k, v))
    out, lse, _ = flashattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qs, k_descale=ks, v_descale=vs,
                                            return_attn_probs=True)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape and lse.dtype == torch.float32
    oracle, oracle_lse = reference.attention(*(fp8.dequantize_fp8(x, s).double().numpy()
                                               for x, s in ((q8, qs), (k8, ks), (v8, vs))), causal=causal)
    np.testing.assert_allclose(out.double().numpy(), oracle, rtol=2.0**-7, atol=1e-5)
    finite = np.isfinite(oracle_lse)
    np.testing.assert_allclose(lse.numpy()[finite], oracle_lse[finite], atol=1e-4)


def test_torch_fp8_on_cuda_matches_the_dequantised_oracle():
    """The public CUDA path (torch float8 on the GPU: validation, the backend's FP8
    dispatch, the Hopper FP8 kernel), GQA, causal, per-(batch, kv head) descales."""
    torch = _torch()
    if not (torch.cuda.is_available() and flashattn.cuda_available()):
        pytest.skip("needs CUDA (torch and flashattn's CUDA backend)")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the FP8 kernel needs compute capability 9.0")
    for causal in (False, True):
        q, k, v = (torch.from_numpy(_gaussian(shape, seed)) for shape, seed in
                   (((2, 130, 4, 128), 21), ((2, 257, 2, 128), 22), ((2, 257, 2, 128), 23)))
        (q8, qs), (k8, ks), (v8, vs) = (flashattn.quantize_fp8(x, heads_kv=2) for x in (q, k, v))
        out, lse, _ = flashattn.flash_attn_func(q8.cuda(), k8.cuda(), v8.cuda(), causal=causal, q_descale=qs.cuda(),
                                                k_descale=ks.cuda(), v_descale=vs.cuda(), return_attn_probs=True)
        assert out.is_cuda and out.dtype == torch.bfloat16 and out.shape == q.shape
        oracle, oracle_lse = reference.attention(*(fp8.dequantize_fp8(x, s).double().numpy()
                                                   for x, s in ((q8, qs), (k8, ks), (v8, vs))), causal=causal)
        # P is rounded to e4m3 for the tensor cores (relative error up to 2^-4 per
        # probability): on N(0, 1) inputs an output element errs by ~2e-3 (RMS), ~1e-2
        # at the tail of 1e5 elements; a wrong kernel by O(0.1).
        np.testing.assert_allclose(out.double().cpu().numpy(), oracle, rtol=2.0**-5, atol=3e-2)
        assert np.sqrt(np.mean((out.double().cpu().numpy() - oracle) ** 2)) < 8e-3
        finite = np.isfinite(oracle_lse)
        np.testing.assert_allclose(lse.cpu().numpy()[finite], oracle_lse[finite], atol=1e-3)


def test_torch_fp8_float_descales_and_varlen():
    torch = _torch()
    x = torch.from_numpy(_gaussian((20, 2, 32), 12))
    codes = (x * 64).to(torch.float8_e4m3fn)
    cu = torch.tensor([0, 5, 20], dtype=torch.int32)
    out = flashattn.flash_attn_varlen_func(codes, codes, codes, cu, cu, 15, 15, q_descale=1 / 64, k_descale=1 / 64,
                                           v_descale=torch.full((2, 2), 1 / 64))
    dequantised = codes.double() / 64
    for b in range(2):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        oracle, _ = reference.attention(*(dequantised[None, rows].numpy(),) * 3)
        np.testing.assert_allclose(out[rows].double().numpy(), oracle[0], rtol=2.0**-7, atol=1e-5)


def test_torch_fp8_backward_raises_naming_the_dtype():
    torch = _torch()
    q = torch.from_numpy(_gaussian((1, 8, 2, 32), 13)).to(torch.float8_e4m3fn).requires_grad_()
    out = flashattn.flash_attn_func(q, q.detach(), q.detach())
    with pytest.raises(NotImplementedError, match="q: float8_e4m3fn: the backward pass does not support FP8"):
        out.float().sum().backward()


def test_torch_fp8_errors():
    torch = _torch()
    q = torch.zeros((1, 8, 2, 32), dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="k: dtype mismatch"):
        flashattn.flash_attn_func(q, q.to(torch.bfloat16), q)
    with pytest.raises(TypeError, match="q_descale"):
        flashattn.flash_attn_func(q, q, q, q_descale=torch.ones((1, 2), dtype=torch.float64))
    with pytest.raises(ValueError, match="k_descale: not broadcastable"):
        flashattn.flash_attn_func(q, q, q, k_descale=torch.ones((1, 3)))
    with pytest.raises(ValueError, match="v_descale: given, but the inputs are not float8_e4m3fn"):
        flashattn.flash_attn_func(q.float(), q.float(), q.float(), v_descale=1.0)
