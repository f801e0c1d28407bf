"""flashattn on NumPy arrays (DLPack -> the CPU backend): values against the float64
oracle, variable-length batches, edge cases and error messages. Needs no torch, no GPU."""

import numpy as np
import pytest

import flashattn
from flashattn import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
    merge_attention_states,
)
from reference import absolute_floor, assert_close_to_oracle, attention


def random_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, seqlen_q, heads_q, head_dim)).astype(dtype)
    k = rng.standard_normal((batch, seqlen_k, heads_kv, head_dim)).astype(dtype)
    v = rng.standard_normal((batch, seqlen_k, heads_kv, head_dim)).astype(dtype)
    return q, k, v


def check_against_oracle(q, k, v, out, lse, **mask):
    oracle_out, oracle_lse = attention(q, k, v, dtype=np.float64, **mask)
    lowprec_out, lowprec_lse = attention(q, k, v, dtype=q.dtype.type, **mask)
    floor = absolute_floor(q.dtype)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == oracle_lse.shape
    assert_close_to_oracle(out, oracle_out, lowprec_out, floor, what="out")
    assert_close_to_oracle(lse, oracle_lse, lowprec_lse, floor, what="lse")


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim): awkward sizes on purpose,
# seqlen_q != seqlen_k both ways, GQA and MQA, a decode step (seqlen_q = 1).
SHAPES = [
    (2, 17, 17, 4, 4, 32),
    (1, 97, 113, 4, 2, 64),
    (2, 129, 65, 2, 1, 16),
    (1, 1, 203, 8, 2, 128),
    (3, 31, 1, 3, 3, 8),
]
MASKS = {
    "full": {},
    "causal": {"causal": True},
    "window_left": {"window": (16, 0)},
    "window_both": {"window": (7, 5)},
    "causal_softcap": {"causal": True, "softcap": 5.0},
    "scale": {"softmax_scale": 0.3},
}


def call_kwargs(mask):
    kwargs = {}
    if mask.get("causal"):
        kwargs["causal"] = True
    if "window" in mask:
        kwargs["window_size"] = mask["window"]
    if "softcap" in mask:
        kwargs["softcap"] = mask["softcap"]
    if "softmax_scale" in mask:
        kwargs["softmax_scale"] = mask["softmax_scale"]
    return kwargs


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_matches_oracle(shape, mask_name, dtype):
    q, k, v = random_qkv(*shape, dtype)
    mask = MASKS[mask_name]
    out, lse, probs = flash_attn_func(q, k, v, return_attn_probs=True, **call_kwargs(mask))
    assert probs is None
    check_against_oracle(q, k, v, out, lse, **mask)


def test_return_value_without_attn_probs_is_the_output():
    q, k, v = random_qkv(1, 8, 8, 2, 2, 16, np.float32)
    out = flash_attn_func(q, k, v)
    assert isinstance(out, np.ndarray) and out.shape == q.shape


def test_gqa_equals_mha_with_repeated_kv_heads():
    q, k, v = random_qkv(2, 33, 40, 6, 2, 32, np.float32)
    grouped = flash_attn_func(q, k, v, causal=True)
    repeated = flash_attn_func(q, np.repeat(k, 3, axis=2), np.repeat(v, 3, axis=2), causal=True)
    np.testing.assert_allclose(grouped, repeated, rtol=0, atol=1e-6)


def test_batch_items_are_independent():
    q, k, v = random_qkv(3, 20, 24, 2, 2, 16, np.float32)
    full = flash_attn_func(q, k, v, causal=True)
    alone = flash_attn_func(q[1:2], k[1:2], v[1:2], causal=True)
    np.testing.assert_array_equal(full[1:2], alone)


def test_permuting_kv_rows_together_changes_nothing():
    q, k, v = random_qkv(1, 16, 40, 2, 2, 32, np.float32)
    order = np.random.default_rng(1).permutation(40)
    np.testing.assert_allclose(flash_attn_func(q, k, v), flash_attn_func(q, k[:, order], v[:, order]), atol=2e-6)


# --- variable-length batches ---------------------------------------------------------


def pack(sequences):
    """Concatenate per-sequence arrays (seqlen, heads, d) along rows; cu_seqlens int32."""
    lengths = [s.shape[0] for s in sequences]
    cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return np.concatenate(sequences, axis=0), cu_seqlens, max(lengths)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("mask_name", ["full", "causal", "window_both"])
def test_varlen_matches_oracle_per_sequence(mask_name, dtype):
    rng = np.random.default_rng(2)
    lengths_q = [5, 0, 17, 1, 33]
    lengths_k = [9, 3, 17, 0, 20]
    heads_q, heads_kv, head_dim = 4, 2, 32
    qs = [rng.standard_normal((n, heads_q, head_dim)).astype(dtype) for n in lengths_q]
    ks = [rng.standard_normal((n, heads_kv, head_dim)).astype(dtype) for n in lengths_k]
    vs = [rng.standard_normal((n, heads_kv, head_dim)).astype(dtype) for n in lengths_k]
    q, cu_q, max_q = pack(qs)
    k, cu_k, max_k = pack(ks)
    v, _, _ = pack(vs)
    mask = MASKS[mask_name]
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, return_attn_probs=True,
                                         **call_kwargs(mask))
    assert out.shape == q.shape and lse.shape == (heads_q, q.shape[0])
    for b in range(len(lengths_q)):
        rows = slice(cu_q[b], cu_q[b + 1])
        check_against_oracle(qs[b][None], ks[b][None], vs[b][None], out[rows][None], lse[:, rows][None], **mask)


def test_varlen_equals_padded_batch():
    q, k, v = random_qkv(3, 24, 24, 2, 2, 16, np.float32, seed=3)
    padded = flash_attn_func(q, k, v, causal=True)
    cu = np.arange(0, 3 * 24 + 1, 24, dtype=np.int32)
    packed = flash_attn_varlen_func(q.reshape(-1, 2, 16), k.reshape(-1, 2, 16), v.reshape(-1, 2, 16), cu, cu, 24,
                                    24, causal=True)
    np.testing.assert_allclose(packed.reshape(q.shape), padded, rtol=0, atol=1e-6)


# --- packed layouts: strided views, no copies ------------------------------------------


def test_qkvpacked_and_kvpacked_equal_separate_tensors():
    rng = np.random.default_rng(4)
    qkv = rng.standard_normal((2, 19, 3, 4, 32)).astype(np.float32)
    q, k, v = (np.ascontiguousarray(qkv[:, :, i]) for i in range(3))
    expected = flash_attn_func(q, k, v, causal=True)
    np.testing.assert_array_equal(flash_attn_qkvpacked_func(qkv, causal=True), expected)
    kv = np.ascontiguousarray(qkv[:, :, 1:])
    np.testing.assert_array_equal(flash_attn_kvpacked_func(q, kv, causal=True), expected)


def test_varlen_packed_forms_equal_separate_tensors():
    rng = np.random.default_rng(5)
    cu = np.array([0, 7, 7, 20], dtype=np.int32)
    qkv = rng.standard_normal((20, 3, 2, 16)).astype(np.float32)
    q, k, v = (np.ascontiguousarray(qkv[:, i]) for i in range(3))
    expected = flash_attn_varlen_func(q, k, v, cu, cu, 13, 13, causal=True)
    np.testing.assert_array_equal(flash_attn_varlen_qkvpacked_func(qkv, cu, 13, causal=True), expected)
    np.testing.assert_array_equal(flash_attn_varlen_kvpacked_func(q, qkv[:, 1:], cu, cu, 13, 13, causal=True),
                                  expected)


def test_packed_shape_errors():
    with pytest.raises(ValueError, match=r"qkv: expected rank 5 with size 3 in dimension 2, got shape \[2, 4, 2, 1, 8\]"):
        flash_attn_qkvpacked_func(np.zeros((2, 4, 2, 1, 8), np.float32))
    with pytest.raises(ValueError, match="kv: expected rank 4 with size 2 in dimension 1"):
        flash_attn_varlen_kvpacked_func(np.zeros((4, 1, 8), np.float32), np.zeros((4, 1, 8), np.float32),
                                        np.array([0, 4], np.int32), np.array([0, 4], np.int32), 4, 4)


def test_non_contiguous_inputs():
    q, k, v = random_qkv(2, 16, 16, 4, 4, 32, np.float32, seed=6)
    q_strided = np.swapaxes(np.ascontiguousarray(np.swapaxes(q, 1, 2)), 1, 2)  # (b, s, h, d) view of (b, h, s, d)
    assert not q_strided.flags.c_contiguous
    np.testing.assert_array_equal(flash_attn_func(q_strided, k, v), flash_attn_func(q, k, v))


# --- edge cases ---------------------------------------------------------------------------


def test_fully_masked_rows_give_zero_and_minus_infinity():
    # causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see no key.
    q, k, v = random_qkv(1, 10, 4, 2, 2, 16, np.float32)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert np.all(out[:, :6] == 0) and np.all(np.isneginf(lse[:, :, :6]))
    assert np.all(np.isfinite(lse[:, :, 6:]))
    check_against_oracle(q, k, v, out, lse, causal=True)


@pytest.mark.parametrize("seqlens", [(0, 8), (8, 0), (0, 0)])
def test_empty_sequences(seqlens):
    q, k, v = random_qkv(2, seqlens[0], seqlens[1], 2, 2, 16, np.float32)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (2, 2, seqlens[0])
    assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_empty_batch():
    q, k, v = random_qkv(0, 8, 8, 2, 2, 16, np.float32)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (0, 2, 8)


def test_merge_of_two_key_halves_equals_attention_over_all_keys():
    q, k, v = random_qkv(2, 12, 30, 4, 4, 32, np.float32, seed=7)
    out_a, lse_a, _ = flash_attn_func(q, k[:, :11], v[:, :11], return_attn_probs=True)
    out_b, lse_b, _ = flash_attn_func(q, k[:, 11:], v[:, 11:], return_attn_probs=True)
    out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    full_out, full_lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    np.testing.assert_allclose(out, full_out, rtol=0, atol=2e-6)
    np.testing.assert_allclose(lse, full_lse, rtol=0, atol=2e-6)


def test_merge_with_an_empty_part():
    rng = np.random.default_rng(8)
    out_a = rng.standard_normal((1, 3, 2, 8)).astype(np.float32)
    lse_a = rng.standard_normal((1, 2, 3)).astype(np.float32)
    out_b = np.full_like(out_a, np.nan)  # an empty part may hold anything
    lse_b = np.full_like(lse_a, -np.inf)
    out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    np.testing.assert_array_equal(out, out_a)
    np.testing.assert_array_equal(lse, lse_a)


# --- bad input: the C++ messages, the right Python exception types ---------------------------


def test_cuda_available_is_a_bool():
    assert isinstance(flashattn.cuda_available(), bool)


def bad(**overrides):
    q, k, v = random_qkv(1, 8, 8, 2, 2, 16, np.float32)
    args = {"q": q, "k": k, "v": v}
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    "overrides, kwargs, error, message",
    [
        ({"k": np.zeros((1, 8, 2, 16), np.float16)}, {}, TypeError, "k: dtype mismatch: expected float32 (like q), got float16"),
        ({"q": np.zeros((1, 8, 2, 16), np.float64)}, {}, TypeError, "q: unsupported dtype"),
        ({"q": np.zeros((1, 8, 2, 16), np.int32)}, {}, TypeError, "q: unsupported dtype"),
        ({"v": np.zeros((1, 8, 2, 8), np.float32)}, {}, ValueError, "v: head_dim mismatch: expected 16 (like q), got 8"),
        ({"q": np.zeros((8, 2, 16), np.float32)}, {}, ValueError, "q: wrong rank: expected 4, got 3 [8, 2, 16]"),
        ({"q": np.zeros((1, 8, 3, 16), np.float32)}, {}, ValueError, "heads_q must be a multiple of heads_kv"),
        ({"k": np.zeros((2, 8, 2, 16), np.float32), "v": np.zeros((2, 8, 2, 16), np.float32)}, {}, ValueError,
         "k: batch mismatch: expected 1 (like q), got 2"),
        ({"k": np.zeros((1, 8, 2, 32), np.float32)[..., ::2]}, {}, ValueError, "k: last dimension must be contiguous"),
        ({}, {"softmax_scale": -1.0}, ValueError, "softmax_scale: must be finite and > 0"),
        ({}, {"softcap": -1.0}, ValueError, "softcap: must be finite and >= 0"),
        ({}, {"window_size": (-2, 0)}, ValueError, "window_left: must be >= -1"),
        ({}, {"window_size": 4}, ValueError, "window_size: expected a pair (left, right)"),
        ({}, {"dropout_p": 1.0}, ValueError, "dropout_p: must be in [0, 1)"),
        ({}, {"dropout_p": "0.1"}, TypeError, "dropout_p: expected a real number"),
        ({}, {"alibi_slopes": np.zeros(3, np.float32)}, ValueError, "alibi_slopes: shape mismatch"),
        ({}, {"alibi_slopes": np.zeros(4, np.float64)}, TypeError, "alibi_slopes: unsupported dtype"),
    ],
)
def test_bad_input_messages(overrides, kwargs, error, message):
    args = bad(**overrides)
    with pytest.raises(error) as raised:
        flash_attn_func(args["q"], args["k"], args["v"], **kwargs)
    assert message in str(raised.value)
    assert str(raised.value).startswith("flashattn: ")


def test_not_an_array():
    with pytest.raises(TypeError, match="q: expected a torch.Tensor or a numpy.ndarray, got list"):
        flash_attn_func([1.0], [1.0], [1.0])


def varlen_args():
    rng = np.random.default_rng(9)
    q = rng.standard_normal((10, 2, 16)).astype(np.float32)
    cu = np.array([0, 4, 10], dtype=np.int32)
    return q, cu


@pytest.mark.parametrize(
    "cu_q, cu_k, max_q, error, message",
    [
        (np.array([0, 4, 10], np.int64), None, 6, TypeError, "cu_seqlens_q: dtype mismatch: expected int32, got int64"),
        (np.array([1, 4, 10], np.int32), None, 6, ValueError, "cu_seqlens_q: must start at 0, got 1"),
        (np.array([0, 6, 4], np.int32), None, 6, ValueError, "cu_seqlens_q: must be non-decreasing"),
        (None, None, 5, ValueError, "max_seqlen_q: sequence 1 has length 6 > max_seqlen_q = 5"),
        (None, np.array([0, 10], np.int32), 6, ValueError, "cu_seqlens_k: shape mismatch"),
        (np.array([0, 4, 11], np.int32), None, 7, ValueError, "cu_seqlens_q: last entry expected <= 10"),
    ],
)
def test_bad_varlen_messages(cu_q, cu_k, max_q, error, message):
    q, cu = varlen_args()
    cu_q = cu if cu_q is None else cu_q
    cu_k = cu if cu_k is None else cu_k
    with pytest.raises(error) as raised:
        flash_attn_varlen_func(q, q, q, cu_q, cu_k, max_q, 6)
    assert message in str(raised.value)


def test_only_one_cu_seqlens_is_rejected():
    q, cu = varlen_args()
    with pytest.raises(ValueError, match="cu_seqlens_k: missing"):
        flashattn._C.forward(q, q, q, np.empty_like(q), None, cu, None, 6, 6, None, False, -1, -1, 0.0,
                             "automatic", 0, 0)


def paged_copy(k, v, cu_k, page_size, seed):
    """k/v (total_k, heads, d) of the sequences cu_k as shuffled pages of a pool, with a
    spare page and -1 in the table slots no sequence touches."""
    lengths = np.diff(cu_k)
    pages = [-(-int(n) // page_size) for n in lengths]
    max_blocks = max(pages) + 1
    num_blocks = sum(pages) + 1
    order = np.random.default_rng(seed).permutation(num_blocks)
    k_pool = np.random.default_rng(seed + 1).standard_normal((num_blocks, page_size) + k.shape[1:]).astype(k.dtype)
    v_pool = np.random.default_rng(seed + 2).standard_normal(k_pool.shape).astype(v.dtype)
    table = np.full((len(lengths), max_blocks), -1, np.int32)
    used = 0
    for b, n in enumerate(lengths):
        for j in range(int(n)):
            page = j // page_size
            if table[b, page] < 0:
                table[b, page] = order[used]
                used += 1
            k_pool[table[b, page], j % page_size] = k[cu_k[b] + j]
            v_pool[table[b, page], j % page_size] = v[cu_k[b] + j]
    return k_pool, v_pool, table


@pytest.mark.parametrize("page_size", [1, 3, 16, 256])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_paged_varlen_equals_packed_varlen(page_size, dtype):
    rng = np.random.default_rng(page_size)
    cu_q = np.array([0, 5, 5, 6, 76], np.int32)
    cu_k = np.array([0, 9, 12, 12, 141], np.int32)
    q = rng.standard_normal((76, 4, 24)).astype(dtype)
    k = rng.standard_normal((141, 2, 24)).astype(dtype)
    v = rng.standard_normal((141, 2, 24)).astype(dtype)
    k_pool, v_pool, table = paged_copy(k, v, cu_k, page_size, seed=page_size + 1)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 70, 129, causal=True, return_attn_probs=True)
    paged, paged_lse, _ = flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, 70, 129, causal=True,
                                                 return_attn_probs=True, block_table=table)
    assert np.array_equal(paged, out)
    assert np.array_equal(paged_lse, lse)


def test_paged_varlen_errors_name_block_table():
    q, cu = varlen_args()
    k_pool = np.zeros((3, 4, 2, 16), np.float32)
    with pytest.raises(ValueError, match=r"block_table: entry \[1, 1\]"):
        flash_attn_varlen_func(q, k_pool, k_pool, cu, cu, 6, 6, block_table=np.array([[0, -1], [1, 3]], np.int32))
    with pytest.raises(ValueError, match="block_table: max_seqlen_k = 6 keys exceed the capacity 4"):
        flash_attn_varlen_func(q, k_pool, k_pool, cu, cu, 6, 6, block_table=np.zeros((2, 1), np.int32))
    with pytest.raises(ValueError, match="block_table: a paged KV cache needs cu_seqlens"):
        flashattn._C.forward(q[None], k_pool, k_pool, np.empty_like(q[None]), None, None, None, 0, 0, None, False,
                             -1, -1, 0.0, "automatic", 0, 0, block_table=np.zeros((1, 2), np.int32))


def test_bad_output_leaves_it_unchanged():
    # The native layer validates everything before writing: a rejected call leaves
    # a canary-filled output bitwise unchanged.
    q, k, v = random_qkv(1, 8, 8, 2, 2, 16, np.float32)
    out = np.full(q.shape, 7.25, np.float32)
    lse = np.full((1, 2, 9), 3.5, np.float32)  # wrong seqlen
    with pytest.raises(ValueError, match="lse: shape mismatch"):
        flashattn._C.forward(q, k, v, out, lse, None, None, 0, 0, None, False, -1, -1, 0.0, "automatic", 0, 0)
    assert np.all(out == 7.25) and np.all(lse == 3.5)


def test_unknown_algorithm():
    q, k, v = random_qkv(1, 4, 4, 1, 1, 8, np.float32)
    with pytest.raises(ValueError, match="algorithm: expected 'automatic', 'reference', 'flash2', 'flash1' or 'flash3'"):
        flashattn._C.forward(q, k, v, np.empty_like(q), None, None, None, 0, 0, None, False, -1, -1, 0.0, "fast", 0, 0)


@pytest.mark.parametrize("algorithm", ["reference", "flash2", "flash1"])
def test_native_algorithms_agree(algorithm):
    q, k, v = random_qkv(2, 37, 45, 4, 2, 32, np.float32, seed=10)
    out = np.empty_like(q)
    lse = np.empty((2, 4, 37), np.float32)
    flashattn._C.forward(q, k, v, out, lse, None, None, 0, 0, None, True, -1, -1, 0.0, algorithm, 2, 0)
    check_against_oracle(q, k, v, out, lse, causal=True)


def test_read_only_inputs_are_accepted():
    q, k, v = random_qkv(1, 8, 8, 2, 2, 16, np.float32)
    for x in (q, k, v):
        x.flags.writeable = False
    out = flash_attn_func(q, k, v)
    q2, k2, v2 = random_qkv(1, 8, 8, 2, 2, 16, np.float32)
    np.testing.assert_array_equal(out, flash_attn_func(q2, k2, v2))


# --- KV cache (flash_attn_with_kvcache) -------------------------------------------------------


def random_cache(batch, capacity, heads_kv, head_dim, dtype=np.float32, seed=20):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, capacity, heads_kv, head_dim)).astype(dtype),
            rng.standard_normal((batch, capacity, heads_kv, head_dim)).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_kvcache_decode_matches_oracle_on_each_prefix(dtype):
    k_cache, v_cache = random_cache(3, 64, 2, 32, dtype)
    q, _, _ = random_qkv(3, 1, 1, 4, 2, 32, dtype, seed=21)
    cache_seqlens = np.array([10, 64, 0], np.int32)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, causal=True,
                                       return_softmax_lse=True)
    for b, length in enumerate(cache_seqlens):
        check_against_oracle(q[b:b + 1], k_cache[b:b + 1, :length], v_cache[b:b + 1, :length], out[b:b + 1],
                             lse[b:b + 1], causal=True)


def test_kvcache_append_writes_the_cache_in_place_and_attends_to_it():
    k_cache, v_cache = random_cache(2, 40, 2, 16)
    k_before, v_before = k_cache.copy(), v_cache.copy()
    q, k_new, v_new = random_qkv(2, 3, 3, 4, 2, 16, np.float32, seed=22)
    cache_seqlens = np.array([5, 37], np.int32)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens, causal=True)
    for b, length in enumerate(cache_seqlens):
        np.testing.assert_array_equal(k_cache[b, length:length + 3], k_new[b])
        np.testing.assert_array_equal(v_cache[b, length:length + 3], v_new[b])
        np.testing.assert_array_equal(k_cache[b, :length], k_before[b, :length])
        np.testing.assert_array_equal(k_cache[b, length + 3:], k_before[b, length + 3:])
        expected = flash_attn_func(q[b:b + 1], k_cache[b:b + 1, :length + 3], v_cache[b:b + 1, :length + 3],
                                   causal=True)
        np.testing.assert_allclose(out[b:b + 1], expected, rtol=0, atol=2e-6)


def test_kvcache_uniform_length_and_paged_cache_agree_with_contiguous():
    k_cache, v_cache = random_cache(2, 64, 2, 32, seed=23)
    q, _, _ = random_qkv(2, 2, 2, 4, 2, 32, np.float32, seed=24)
    contiguous = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=50, causal=True)
    expected = flash_attn_func(q, k_cache[:, :50], v_cache[:, :50], causal=True)
    np.testing.assert_allclose(contiguous, expected, rtol=0, atol=2e-6)
    # Paged: 16-row pages, sequence b's pages scattered through one pool.
    page_size, pages_per_sequence = 16, 4
    block_table = np.array([[5, 0, 7, 2], [1, 6, 3, 4]], np.int32)
    k_pages = np.zeros((8, page_size, 2, 32), np.float32)
    v_pages = np.zeros_like(k_pages)
    for b in range(2):
        for page in range(pages_per_sequence):
            rows = slice(page * page_size, (page + 1) * page_size)
            k_pages[block_table[b, page]] = k_cache[b, rows]
            v_pages[block_table[b, page]] = v_cache[b, rows]
    paged = flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=np.array([50, 50], np.int32),
                                    block_table=block_table, causal=True)
    np.testing.assert_allclose(paged, contiguous, rtol=0, atol=2e-6)


def rotate(x, cos, sin, positions, interleaved):
    """Rotary embedding of x (seqlen, heads, d) at `positions`, on the first 2 * cos.shape[1] features."""
    x = x.astype(np.float64).copy()
    half = cos.shape[1]
    c = cos[positions][:, None, :].astype(np.float64)
    s = sin[positions][:, None, :].astype(np.float64)
    if interleaved:
        x1, x2 = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        x1, x2 = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half], x[..., half:2 * half] = x1 * c - x2 * s, x1 * s + x2 * c
    return x.astype(np.float32)


@pytest.mark.parametrize("interleaved", [True, False])
def test_kvcache_rotary_embedding_of_new_keys_and_queries(interleaved):
    k_cache, v_cache = random_cache(1, 32, 1, 16, seed=25)
    q, k_new, v_new = random_qkv(1, 2, 2, 2, 1, 16, np.float32, seed=26)
    rng = np.random.default_rng(27)
    angles = rng.uniform(0, np.pi, (32, 4))  # rotary_dim 8 of head_dim 16
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    length = 9
    k_original = k_cache.copy()
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                  cache_seqlens=np.array([length], np.int32), causal=True,
                                  rotary_interleaved=interleaved)
    positions = np.arange(length, length + 2)
    k_rotated = rotate(k_new[0], cos, sin, positions, interleaved)
    np.testing.assert_allclose(k_cache[0, length:length + 2], k_rotated, rtol=0, atol=1e-6)
    keys = np.concatenate([k_original[0, :length], k_rotated])[None]
    expected = attention(rotate(q[0], cos, sin, positions, interleaved)[None], keys,
                         v_cache[:, :length + 2], causal=True)[0]
    np.testing.assert_allclose(out, expected, rtol=0, atol=2e-6)


def test_kvcache_bad_input_messages():
    k_cache, v_cache = random_cache(1, 16, 2, 16)
    q, k_new, v_new = random_qkv(1, 1, 1, 2, 2, 16, np.float32)
    with pytest.raises(ValueError, match="alibi_slopes: shape mismatch"):
        flash_attn_with_kvcache(q, k_cache, v_cache, alibi_slopes=np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="k_cache: dtype mismatch"):
        flash_attn_with_kvcache(q, k_cache.astype(np.float16), v_cache)
    with pytest.raises(ValueError, match="q: wrong rank: expected 4"):
        flash_attn_with_kvcache(q[0], k_cache, v_cache)
