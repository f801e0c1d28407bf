"""Hostile input (issue 18): every rejection names the argument and says what is wrong,
nothing is accepted that cannot be computed right, and the NaN rule of README.md holds on
every CPU algorithm. Cases that used to hang or crash the process run in a subprocess."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import flashattn
from flashattn import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
    merge_attention_states,
)

RNG = np.random.default_rng(0)
Q = RNG.standard_normal((1, 8, 2, 16)).astype(np.float32)
QV = Q.reshape(8, 2, 16)
CU = np.array([0, 8], np.int32)
CACHE = RNG.standard_normal((1, 16, 2, 16)).astype(np.float32)

CASES = [
    ("softcap 1e-50 (float32 0)", lambda: flash_attn_func(Q, Q, Q, softcap=1e-50), ValueError, "softcap: out of range"),
    ("softcap 1e39 (float32 inf)", lambda: flash_attn_func(Q, Q, Q, softcap=1e39), ValueError, "softcap: out of range"),
    ("scale 1e39", lambda: flash_attn_func(Q, Q, Q, softmax_scale=1e39), ValueError, "softmax_scale: out of range"),
    ("scale 1e-40 (subnormal)", lambda: flash_attn_func(Q, Q, Q, softmax_scale=1e-40), ValueError, "softmax_scale"),
    ("scale 'x'", lambda: flash_attn_func(Q, Q, Q, softmax_scale="x"), TypeError, "softmax_scale: expected a real number"),
    ("softcap None", lambda: flash_attn_func(Q, Q, Q, softcap=None), TypeError, "softcap: expected a real number"),
    ("causal array", lambda: flash_attn_func(Q, Q, Q, causal=np.array([True, False])), TypeError, "causal: expected a bool"),
    ("window 1.5", lambda: flash_attn_func(Q, Q, Q, window_size=(1.5, 0)), TypeError, "window_size: expected an integer"),
    ("window -0.5", lambda: flash_attn_func(Q, Q, Q, window_size=(-0.5, -1)), TypeError, "window_size: expected an integer"),
    ("window strings", lambda: flash_attn_func(Q, Q, Q, window_size=("3", "1")), TypeError, "window_size"),
    ("window inf", lambda: flash_attn_func(Q, Q, Q, window_size=(float("inf"), 0)), TypeError, "window_size"),
    ("window 2**64", lambda: flash_attn_func(Q, Q, Q, window_size=(2**64, 0)), ValueError, "window_size: out of range"),
    ("window of 3", lambda: flash_attn_func(Q, Q, Q, window_size=(1, 2, 3)), ValueError, "window_size: expected a pair"),
    ("max_seqlen_q 2**63-1", lambda: flash_attn_varlen_func(QV, QV, QV, CU, CU, 2**63 - 1, 8), ValueError,
     "max_seqlen_q: expected <= 8 (rows of q)"),
    ("max_seqlen_k 2**64", lambda: flash_attn_varlen_func(QV, QV, QV, CU, CU, 8, 2**64), ValueError,
     "max_seqlen_k: out of range"),
    ("max_seqlen_q None", lambda: flash_attn_varlen_func(QV, QV, QV, CU, CU, None, 8), TypeError,
     "max_seqlen_q: expected an integer"),
    ("big-endian q", lambda: flash_attn_func(Q.astype(">f4"), Q, Q), TypeError, "q: unsupported dtype"),
    ("object v", lambda: flash_attn_func(Q, Q, Q.astype(object)), TypeError, "v: unsupported dtype"),
    ("string q", lambda: flash_attn_func(Q.astype(str), Q, Q), TypeError, "q: unsupported dtype"),
    ("datetime k", lambda: flash_attn_func(Q, Q.astype("datetime64[s]"), Q), TypeError, "k: unsupported dtype"),
    ("structured q", lambda: flash_attn_func(np.zeros(Q.shape, [("a", "f4")]), Q, Q), TypeError, "q: unsupported dtype"),
    ("k None", lambda: flash_attn_func(Q, None, Q), TypeError, "k: expected a tensor like q, got None"),
    ("qkv list", lambda: flash_attn_qkvpacked_func([Q, Q, Q]), TypeError, "qkv: expected a torch.Tensor or a numpy"),
    ("kv None", lambda: flash_attn_kvpacked_func(Q, None), TypeError, "kv: expected a torch.Tensor or a numpy"),
    ("k_cache None", lambda: flash_attn_with_kvcache(Q[:, :1], None, CACHE), TypeError, "k_cache: expected a tensor"),
    ("cache_seqlens 2**64", lambda: flash_attn_with_kvcache(Q[:, :1], CACHE, CACHE, cache_seqlens=2**64), ValueError,
     "cache_seqlens: out of range"),
    ("num_splits 2**64", lambda: flash_attn_with_kvcache(Q[:, :1], CACHE, CACHE, num_splits=2**64), ValueError,
     "num_splits: out of range"),
    ("lse_b None", lambda: merge_attention_states(Q, np.zeros((1, 2, 8), np.float32), Q, None), TypeError,
     "lse_b: expected a tensor like out_a, got None"),
    ("head_dim 2^40 by broadcast_to", lambda: flash_attn_func(np.broadcast_to(np.float32(1), (1, 1, 1, 2**40)), Q, Q),
     ValueError, "q: last dimension must be contiguous"),
]


@pytest.mark.parametrize("label,call,error,message", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_rejected_naming_the_argument(label, call, error, message):
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value)
    assert str(info.value).startswith("flashattn: ")


def test_integer_windows_of_every_kind_and_causal_with_a_window():
    expected = flash_attn_func(Q, Q, Q, window_size=(2, 0))
    for window in [(np.int64(2), np.int32(0)), np.array([2, 0]), [2, 0], (2, 0)]:
        np.testing.assert_array_equal(flash_attn_func(Q, Q, Q, window_size=window), expected)
    # causal keeps window_left and sets window_right = 0 (flash_attn's rule, issue 14).
    np.testing.assert_array_equal(flash_attn_func(Q, Q, Q, causal=True, window_size=(2, 5)), expected)
    # A window at least as long as the sequences is unbounded, whatever its size.
    np.testing.assert_array_equal(flash_attn_func(Q, Q, Q, window_size=(2**62, 2**62)), flash_attn_func(Q, Q, Q))


def test_read_only_cache_is_accepted_when_nothing_is_appended():
    cache = CACHE.copy()
    cache.flags.writeable = False
    out = flash_attn_with_kvcache(Q[:, :1], cache, cache, cache_seqlens=4)
    assert np.isfinite(out).all()
    with pytest.raises(TypeError, match="k_cache: expected a writable array"):
        flash_attn_with_kvcache(Q[:, :1], cache, cache, k=Q[:, :1], v=Q[:, :1], cache_seqlens=4)


def test_paged_cache_past_its_capacity_names_block_table_and_writes_nothing():
    k_cache = RNG.standard_normal((4, 16, 2, 16)).astype(np.float32)
    v_cache = k_cache.copy()
    before = k_cache.copy()
    table = np.array([[0, 1]], np.int32)  # capacity 32
    new = RNG.standard_normal((1, 2, 2, 16)).astype(np.float32)
    with pytest.raises(ValueError, match="block_table: entry 0: 31 cached"):
        flash_attn_with_kvcache(Q[:, :1], k_cache, v_cache, k=new, v=new, cache_seqlens=np.array([31], np.int32),
                                block_table=table)
    np.testing.assert_array_equal(k_cache, before)


def test_block_table_entry_past_the_page_pool_is_rejected():
    table = np.array([[0, 7]], np.int32)  # page 7 of a 4-page cache
    k_cache = RNG.standard_normal((4, 16, 2, 16)).astype(np.float32)
    with pytest.raises(ValueError, match=r"block_table: entry \[0, 1\]"):
        flash_attn_with_kvcache(Q[:, :1], k_cache, k_cache, cache_seqlens=np.array([20], np.int32), block_table=table)


# --- the NaN rule, every CPU algorithm (the native call takes the algorithm by name) ---


def _forward(q, k, v, algorithm, causal):
    out = np.empty_like(q)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), np.float32)
    flashattn._C.forward(q, k, v, out, lse, None, None, 0, 0, None, causal, -1, -1, 0.0, algorithm, 0, 0)
    return out, lse


@pytest.mark.parametrize("algorithm", ["automatic", "reference", "flash1"])
def test_nan_rule(algorithm):
    q, k, v = (RNG.standard_normal((1, 64, 2, 16)).astype(np.float32) for _ in range(3))
    clean, clean_lse = _forward(q, k, v, algorithm, True)
    v[0, 40, 0, 3] = np.nan  # hidden from rows < 40 by the causal mask
    k[0, 50, 1, 0] = np.nan  # hidden from rows < 50
    q[0, 10, 0, :] = np.nan  # a NaN query row
    out, lse = _forward(q, k, v, algorithm, True)
    np.testing.assert_allclose(out[0, :40, 1], clean[0, :40, 1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[0, 11:40], clean[0, 11:40], rtol=1e-5, atol=1e-6)
    assert np.isnan(out[0, 10, 0]).all() and np.isnan(lse[0, 0, 10])  # never a finite output with LSE -inf
    assert np.isnan(out[0, 40:, 0, 3]).all()  # visible NaN value propagates
    assert np.isnan(lse[0, 1, 50:]).all() and np.isnan(out[0, 50:, 1]).all()  # visible NaN key: row NaN
    assert np.isfinite(lse[0, 1, :50]).all()


def test_values_near_the_float32_maximum_do_not_overflow():
    q = RNG.standard_normal((1, 64, 2, 16)).astype(np.float32)
    v = np.full((1, 64, 2, 16), 1e38, np.float32)
    np.testing.assert_allclose(flash_attn_func(q, q, v), 1e38, rtol=1e-5)


# --- cases that used to hang or crash the interpreter: each in its own process ---

CRASHERS = {
    "max_seqlen_q 2**62": ("flash_attn_varlen_func(q.reshape(8, 2, 16), q.reshape(8, 2, 16), q.reshape(8, 2, 16), "
                           "cu, cu, 2**62, 8)", "ValueError", "max_seqlen_q"),
    "native num_threads 100000": ("flashattn._C.forward(q, q, q, np.empty_like(q), None, None, None, 0, 0, None, False, "
                                  "-1, -1, 0.0, 'automatic', 100000, 0)", "ValueError", "num_threads"),
    "native num_threads -5": ("flashattn._C.forward(q, q, q, np.empty_like(q), None, None, None, 0, 0, None, False, "
                              "-1, -1, 0.0, 'automatic', -5, 0)", "ValueError", "num_threads"),
}


@pytest.mark.parametrize("label", sorted(CRASHERS))
def test_former_crashers_fail_cleanly_in_a_subprocess(label):
    expression, error, argument = CRASHERS[label]
    script = textwrap.dedent(f"""
        import numpy as np, flashattn
        from flashattn import flash_attn_varlen_func
        q = np.ones((1, 8, 2, 16), np.float32)
        cu = np.array([0, 8], np.int32)
        try:
            {expression}
        except {error} as e:
            assert "flashattn: {argument}:" in str(e), str(e)
            print("REJECTED")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "REJECTED" in result.stdout, result.stdout + result.stderr


# --- the same through torch CPU tensors, where torch is installed ---


def test_torch_path_gives_the_same_errors():
    torch = pytest.importorskip("torch")
    q = torch.from_numpy(Q)
    for kwargs, error, message in [
        ({"softcap": 1e-50}, ValueError, "softcap: out of range"),
        ({"softmax_scale": 1e39}, ValueError, "softmax_scale: out of range"),
        ({"window_size": (1.5, 0)}, TypeError, "window_size: expected an integer"),
    ]:
        with pytest.raises(error, match=message):
            flash_attn_func(q, q, q, **kwargs)
    with pytest.raises(TypeError, match="k: expected a tensor like q, got None"):
        flash_attn_func(q, None, q)
    qv = q.reshape(8, 2, 16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="max_seqlen_q: expected <= 8"):
        flash_attn_varlen_func(qv, qv, qv, cu, cu, 2**62, 8)
    v = torch.randn(1, 64, 2, 16)
    v[0, 40] = float("nan")
    out = flash_attn_func(torch.randn(1, 64, 2, 16), torch.randn(1, 64, 2, 16), v, causal=True)
    assert torch.isfinite(out[0, :40]).all() and torch.isnan(out[0, 40:]).all()


def test_torch_thread_count_above_the_native_limit_is_clamped():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    q = torch.randn(1, 8, 2, 16, requires_grad=True)
    try:
        torch.set_num_threads(flashattn._C.MAX_THREADS + 976)  # 2000: torch accepts it, the native range ends at 1024
        out = flash_attn_func(q, q, q, causal=True)  # the autograd path: forward and backward
        out.sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
        with torch.no_grad():
            assert torch.isfinite(flash_attn_func(q, q, q)).all()  # the inference path
    finally:
        torch.set_num_threads(before)
    # the native API still rejects a num_threads out of range that is passed to it
    with pytest.raises(ValueError, match="num_threads"):
        flashattn._C.forward(Q, Q, Q, np.empty_like(Q), None, None, None, 0, 0, None, False, -1, -1, 0.0, "automatic", 2000, 0)
