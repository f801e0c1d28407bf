"""Block-sparse masks: FlexAttention's BlockMask layout (flashattn/block_mask.hpp).

A BlockMask cuts the (Q_LEN x KV_LEN) score matrix into BLOCK_SIZE blocks and lists,
for each (batch, head, query block), the key blocks to visit: *partial* ones
(kv_num_blocks / kv_indices, the element mask applied) and *full* ones
(full_kv_num_blocks / full_kv_indices, no element mask), plus the transposed lists
(q_num_blocks / q_indices / full_q_*) for the backward pass. Blocks in neither list
are never computed. Inside partial blocks the element mask is either a built-in rule
(causal/sliding window, document ids, prefix-LM, conjunctions of these) or a compact
bit mask stored for the partial blocks only, made once from a mask function.

    bm = flashattn.create_block_mask(lambda b, h, q, kv: q >= kv, B, H, Q_LEN, KV_LEN)
    out = flashattn.scaled_dot_product_attention(q, k, v, block_mask=bm)

A torch BlockMask (torch.nn.attention.flex_attention.create_block_mask) is accepted as
it is: its lists are read as they are and its mask_mod is evaluated once on its
partial blocks to make the bit mask (duck-typed; torch is not imported here).
"""

import sys

import numpy as np

__all__ = ["BlockMask", "create_block_mask", "block_mask_from_dense"]


def _is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _to_numpy(x):
    return x.detach().cpu().numpy() if _is_torch(x) else np.asarray(x)


class BlockMask:
    """flashattn's block mask: FlexAttention's attributes (int32 arrays, NumPy or torch)
    plus the element rule of the partial blocks. Built by create_block_mask,
    block_mask_from_dense or block_mask_from_rule; shapes [B|1, H|1, blocks(, capacity)]."""

    def __init__(self, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, q_num_blocks, q_indices,
                 full_q_num_blocks, full_q_indices, BLOCK_SIZE, seq_lengths, partial_bits=None, partial_ids=None,
                 q_partial_ids=None, band=None, prefix_lengths=None, q_document_ids=None, k_document_ids=None):
        self.kv_num_blocks, self.kv_indices = kv_num_blocks, kv_indices
        self.full_kv_num_blocks, self.full_kv_indices = full_kv_num_blocks, full_kv_indices
        self.q_num_blocks, self.q_indices = q_num_blocks, q_indices
        self.full_q_num_blocks, self.full_q_indices = full_q_num_blocks, full_q_indices
        self.BLOCK_SIZE = tuple(BLOCK_SIZE)
        self.seq_lengths = tuple(seq_lengths)
        self.partial_bits, self.partial_ids, self.q_partial_ids = partial_bits, partial_ids, q_partial_ids
        self.band = band  # None or (diagonal_offset, window_left, window_right)
        self.prefix_lengths, self.q_document_ids, self.k_document_ids = prefix_lengths, q_document_ids, k_document_ids

    def sparsity(self):
        """Percentage of blocks never computed (FlexAttention's BlockMask.sparsity)."""
        counts = _to_numpy(self.kv_num_blocks).astype(np.int64)
        if self.full_kv_num_blocks is not None:
            counts = counts + _to_numpy(self.full_kv_num_blocks)
        q_blocks, kv_blocks = _blocks(self.seq_lengths, self.BLOCK_SIZE)
        return 100.0 * (1.0 - counts.sum() / (counts.shape[0] * counts.shape[1] * q_blocks * kv_blocks))

    def to(self, device):
        """The same mask with its arrays as torch tensors on `device`."""
        import torch

        def move(x):
            if x is None:
                return None
            return (x if _is_torch(x) else torch.from_numpy(np.ascontiguousarray(x))).to(device)

        return BlockMask(*(move(x) for x in (self.kv_num_blocks, self.kv_indices, self.full_kv_num_blocks,
                                             self.full_kv_indices, self.q_num_blocks, self.q_indices,
                                             self.full_q_num_blocks, self.full_q_indices)),
                         self.BLOCK_SIZE, self.seq_lengths, move(self.partial_bits), move(self.partial_ids),
                         move(self.q_partial_ids), self.band, move(self.prefix_lengths), move(self.q_document_ids),
                         move(self.k_document_ids))

    def __repr__(self):
        return (f"flashattn.BlockMask(shape={tuple(self.kv_num_blocks.shape[:2])}, seq_lengths={self.seq_lengths}, "
                f"BLOCK_SIZE={self.BLOCK_SIZE}, sparsity={self.sparsity():.1f}%)")

    def _native_tuple(self):
        diagonal, left, right = self.band if self.band is not None else (0, -1, -1)
        return (int(self.BLOCK_SIZE[0]), int(self.BLOCK_SIZE[1]), self.kv_num_blocks, self.kv_indices,
                self.full_kv_num_blocks, self.full_kv_indices, self.q_num_blocks, self.q_indices,
                self.full_q_num_blocks, self.full_q_indices, self.partial_bits, self.partial_ids, self.q_partial_ids,
                self.band is not None, int(diagonal), int(left), int(right), self.prefix_lengths, self.q_document_ids,
                self.k_document_ids)

    def _tensors(self):
        """The array fields in _native_tuple's order (for the torch custom ops)."""
        t = self._native_tuple()
        return [t[i] for i in (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 17, 18, 19)]


_TENSOR_SLOTS = (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 17, 18, 19)


def _native_tuple_from(tensors, params):
    """Rebuild _native_tuple from _tensors() and params [bq, bk, has_band, diagonal, left, right]."""
    t = [None] * 20
    for slot, x in zip(_TENSOR_SLOTS, tensors):
        t[slot] = x
    t[0], t[1] = params[0], params[1]
    t[13], t[14], t[15], t[16] = bool(params[2]), params[3], params[4], params[5]
    return tuple(t)


def _blocks(seq_lengths, block_size):
    return -(-seq_lengths[0] // block_size[0]), -(-seq_lengths[1] // block_size[1])


def _block_size(BLOCK_SIZE):
    if isinstance(BLOCK_SIZE, (tuple, list)):
        bq, bk = BLOCK_SIZE
    else:
        bq = bk = BLOCK_SIZE
    for name, value in (("BLOCK_SIZE", bq), ("BLOCK_SIZE", bk)):
        value = int(value)
        if not (16 <= value <= 1024 and value & (value - 1) == 0):
            raise NotImplementedError(f"flashattn: {name}: must be a power of two in [16, 1024], got {value}")
    return int(bq), int(bk)


def _lists(kinds, with_ids):
    """kv and q lists from kinds (B, H, QB, KB) int8 (0 empty, 1 partial, 2 full)."""
    B, H, QB, KB = kinds.shape

    def one(k, want, rows, cols):  # k (B, H, rows, cols)
        hit = k == want
        num = hit.sum(-1).astype(np.int32)
        order = np.argsort(~hit, axis=-1, kind="stable").astype(np.int32)  # listed blocks first, ascending
        indices = np.where(np.arange(cols) < num[..., None], order, 0).astype(np.int32)
        return num, np.ascontiguousarray(indices)

    kv_num, kv_idx = one(kinds, 1, QB, KB)
    full_kv_num, full_kv_idx = one(kinds, 2, QB, KB)
    kinds_t = np.swapaxes(kinds, 2, 3)
    q_num, q_idx = one(kinds_t, 1, KB, QB)
    full_q_num, full_q_idx = one(kinds_t, 2, KB, QB)
    ids = q_ids = None
    if with_ids:
        # Partial block p = the p-th partial (b, h, m, n) in row-major order.
        id_grid = np.full(kinds.shape, -1, np.int64)
        partial = kinds == 1
        id_grid[partial] = np.arange(int(partial.sum()))
        ids = np.take_along_axis(id_grid, kv_idx.astype(np.int64), axis=-1)
        ids = np.where(np.arange(KB) < kv_num[..., None], ids, -1).astype(np.int32)
        q_ids = np.take_along_axis(np.swapaxes(id_grid, 2, 3), q_idx.astype(np.int64), axis=-1)
        q_ids = np.where(np.arange(QB) < q_num[..., None], q_ids, -1).astype(np.int32)
    return (kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx, ids, q_ids)


def _pack_bits(blocks):
    """(P, bq, bk) bool -> int32 (P, bq, ceil(bk / 32)), bit c of a row in word c // 32."""
    P, bq, bk = blocks.shape
    words = -(-bk // 32)
    padded = np.zeros((P, bq, words * 32), np.bool_)
    padded[:, :, :bk] = blocks
    packed = np.packbits(padded, axis=-1, bitorder="little")  # (P, bq, words * 4) bytes, little-endian words
    return np.ascontiguousarray(packed).view("<u4").astype(np.uint32).view(np.int32).reshape(P, bq, words)


def _from_dense_numpy(allowed, BLOCK_SIZE, seq_lengths, keep_bits=True):
    """A BlockMask (NumPy arrays) from a dense boolean (B, H, Q_LEN, KV_LEN) array."""
    bq, bk = BLOCK_SIZE
    B, H, Q, K = allowed.shape
    QB, KB = -(-Q // bq), -(-K // bk)
    padded = np.zeros((B, H, QB * bq, KB * bk), np.bool_)
    padded[:, :, :Q, :K] = allowed
    inside = np.zeros((QB * bq, KB * bk), np.bool_)
    inside[:Q, :K] = True
    tiles = padded.reshape(B, H, QB, bq, KB, bk)
    count = tiles.sum(axis=(3, 5))
    total = inside.reshape(QB, bq, KB, bk).sum(axis=(1, 3))
    kinds = np.where(count == 0, 0, np.where(count == total, 2, 1)).astype(np.int8)
    lists = _lists(kinds, keep_bits)
    bits = None
    if keep_bits:
        where = np.nonzero(kinds == 1)
        partial_tiles = tiles.transpose(0, 1, 2, 4, 3, 5)[where]  # (P, bq, bk), row-major over (b, h, m, n)
        bits = _pack_bits(partial_tiles) if len(partial_tiles) else np.zeros((1, bq, -(-bk // 32)), np.int32)
    return BlockMask(*lists[:8], (bq, bk), seq_lengths, bits, lists[8], lists[9])


def block_mask_from_dense(attn_mask, BLOCK_SIZE=128):
    """The block-sparse form of a boolean attn_mask [B|1, H|1, Q_LEN, KV_LEN] (NumPy or
    torch): full blocks, partial blocks with their bits, empty blocks left out.
    Equivalent to passing the dense mask (bitwise the same results on the CPU). A torch
    mask off the CPU is converted on its device (no host copy; bits for every block,
    _torch_block_mask.py) when the key block is a multiple of 32."""
    bq, bk = _block_size(BLOCK_SIZE)
    if _is_torch(attn_mask) and attn_mask.device.type != "cpu" and bk % 32 == 0:
        from flashattn._torch_block_mask import block_mask_from_dense_tensor

        mask = attn_mask
        while mask.ndim < 4:
            mask = mask[None]
        return block_mask_from_dense_tensor(mask, mask.shape[2:], (bq, bk))
    mask = _to_numpy(attn_mask).astype(np.bool_)
    while mask.ndim < 4:
        mask = mask[None]
    bm = _from_dense_numpy(mask, (bq, bk), mask.shape[2:])
    return bm.to(attn_mask.device) if _is_torch(attn_mask) else bm


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, BLOCK_SIZE=128, device=None):
    """FlexAttention's create_block_mask: mask_mod(b, h, q_idx, kv_idx) -> bool, vectorised
    (called once per chunk of query rows with broadcastable index arrays: NumPy arrays,
    or torch tensors on `device` when a device is given). B or H None = broadcast (1).
    Returns a BlockMask whose partial blocks carry the bit mask of mask_mod."""
    bq, bk = _block_size(BLOCK_SIZE)
    B = 1 if B is None else int(B)
    H = 1 if H is None else int(H)
    Q_LEN, KV_LEN = int(Q_LEN), int(KV_LEN)
    rows_per_chunk = max(bq, (1 << 24) // max(1, B * H * KV_LEN) // bq * bq)  # ~16 Mi elements per call
    chunks = []
    for start in range(0, Q_LEN, rows_per_chunk):
        stop = min(Q_LEN, start + rows_per_chunk)
        if device is not None:
            import torch

            arange = lambda a, b: torch.arange(a, b, device=device)  # noqa: E731
            out = mask_mod(arange(0, B)[:, None, None, None], arange(0, H)[None, :, None, None],
                           arange(start, stop)[None, None, :, None], arange(0, KV_LEN)[None, None, None, :])
            out = torch.broadcast_to(out, (B, H, stop - start, KV_LEN)).cpu().numpy()
        else:
            out = mask_mod(np.arange(B)[:, None, None, None], np.arange(H)[None, :, None, None],
                           np.arange(start, stop)[None, None, :, None], np.arange(KV_LEN)[None, None, None, :])
            out = np.broadcast_to(np.asarray(out), (B, H, stop - start, KV_LEN))
        chunks.append(np.asarray(out, np.bool_))
    allowed = np.concatenate(chunks, axis=2) if chunks else np.zeros((B, H, 0, KV_LEN), np.bool_)
    bm = _from_dense_numpy(allowed, (bq, bk), (Q_LEN, KV_LEN))
    return bm.to(device) if device is not None else bm


def block_mask_from_rule(B, H, Q_LEN, KV_LEN, BLOCK_SIZE=128, causal=False, window=(-1, -1), diagonal_offset=0,
                         prefix_lengths=None, q_document_ids=None, k_document_ids=None):
    """A BlockMask whose partial blocks use the built-in element rule (no bits): the
    band (causal = window (-1, 0); row i's diagonal is column i + diagonal_offset, 0 =
    top-left as in PyTorch), prefix-LM lengths [B] and document ids [B|1, LEN], together
    a conjunction. The block lists are computed here from the same rule."""
    bq, bk = _block_size(BLOCK_SIZE)
    left, right = (-1, 0) if causal else tuple(int(w) for w in window)
    has_band = causal or left >= 0 or right >= 0
    B = 1 if B is None else int(B)
    H = 1 if H is None else int(H)
    q = np.arange(Q_LEN)[:, None]
    kv = np.arange(KV_LEN)[None, :]
    band = np.ones((Q_LEN, KV_LEN), np.bool_)
    if left >= 0:
        band &= kv >= q + diagonal_offset - left
    if right >= 0:
        band &= kv <= q + diagonal_offset + right
    allowed = np.broadcast_to(band, (B, 1, Q_LEN, KV_LEN))
    prefix = docs_q = docs_k = None
    if prefix_lengths is not None:
        prefix = np.asarray(_to_numpy(prefix_lengths), np.int32).reshape(-1)
        allowed = allowed | (kv[None, None] < prefix.reshape(-1, 1, 1, 1))
    if q_document_ids is not None:
        docs_q = np.asarray(_to_numpy(q_document_ids), np.int32).reshape(-1, Q_LEN)
        docs_k = np.asarray(_to_numpy(k_document_ids), np.int32).reshape(-1, KV_LEN)
        allowed = allowed & (docs_q[:, None, :, None] == docs_k[:, None, None, :])
    allowed = np.broadcast_to(allowed, (allowed.shape[0], 1, Q_LEN, KV_LEN))
    bm = _from_dense_numpy(np.ascontiguousarray(allowed), (bq, bk), (Q_LEN, KV_LEN), keep_bits=False)
    bm.band = (int(diagonal_offset), left, right) if has_band else None
    bm.prefix_lengths, bm.q_document_ids, bm.k_document_ids = prefix, docs_q, docs_k
    return bm


class _Uncacheable(Exception):
    """A list tensor without a version counter (torch inference tensors)."""


def _tensor_version(x):
    """A tensor's in-place modification counter (torch) and identity."""
    try:
        return getattr(x, "_version", None), id(x)
    except RuntimeError as error:  # "Inference tensors do not track version counter"
        raise _Uncacheable() from error


def as_block_mask(block_mask, B, H, Q_LEN, KV_LEN):
    """A flashattn BlockMask from ours or a torch BlockMask (duck-typed: its lists are used
    as they are; its mask_mod is evaluated once on its partial blocks for the bits).

    A torch BlockMask is converted at its first use and the result kept on it, as
    FlexAttention users keep the BlockMask itself: the conversion evaluates mask_mod on
    the host and copies, so repeating it per call would cost more than the attention and
    could not be captured in a CUDA graph. The cache is keyed on the sequence lengths,
    the mask_mod and the block lists' versions (an in-place change of the lists converts
    anew); a mask_mod whose captured tensors change in place needs a new BlockMask, as
    the lists FlexAttention built from it would be stale too. A CUDA graph captured with
    the BlockMask reads the conversion of its capture time: after an in-place change of
    the lists, capture again (the earlier conversion is kept alive for such a graph, so
    it never reads freed memory). A BlockMask made under torch.inference_mode (tensors
    without a version counter) is converted per call."""
    if isinstance(block_mask, BlockMask):
        return block_mask
    if not hasattr(block_mask, "kv_num_blocks") or not hasattr(block_mask, "kv_indices"):
        raise TypeError(f"flashattn: block_mask: expected a flashattn.BlockMask or a torch BlockMask, got "
                        f"{type(block_mask).__name__}")
    try:
        key = (Q_LEN, KV_LEN, id(getattr(block_mask, "mask_mod", None))) + tuple(
            _tensor_version(getattr(block_mask, name, None)) for name in
            ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
             "full_q_num_blocks", "full_q_indices"))
    except _Uncacheable:
        return _convert_torch_block_mask(block_mask, Q_LEN, KV_LEN)
    cached = getattr(block_mask, "_flashattn_converted", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    converted = _convert_torch_block_mask(block_mask, Q_LEN, KV_LEN)
    if not _is_compiling():
        try:
            if cached is not None:  # a graph captured earlier may still read it
                block_mask._flashattn_retired = getattr(block_mask, "_flashattn_retired", []) + [cached[1]]
            block_mask._flashattn_converted = (key, converted)
        except AttributeError:  # a read-only object: converted per call
            pass
    return converted


def _is_compiling():
    try:
        import torch

        return bool(torch.compiler.is_compiling())
    except (ImportError, AttributeError):
        return False


def _convert_torch_block_mask(block_mask, Q_LEN, KV_LEN):
    bq, bk = _block_size(block_mask.BLOCK_SIZE)
    kv_num, kv_idx = block_mask.kv_num_blocks, block_mask.kv_indices
    device = kv_num.device if _is_torch(kv_num) else None
    np_num, np_idx = _to_numpy(kv_num).astype(np.int64), _to_numpy(kv_idx).astype(np.int64)
    Bm, Hm, QB, cap = np_idx.shape
    KB = -(-KV_LEN // bk)
    mask_mod = getattr(block_mask, "mask_mod", None)
    is_noop = mask_mod is None or getattr(mask_mod, "__name__", "") == "noop_mask"
    bits = ids = q_ids = None
    if not is_noop and np_num.sum() > 0:
        # The partial blocks in list order; ids = their position.
        slots = np.arange(cap)[None, None, None, :] < np.clip(np_num, 0, cap)[..., None]
        b_i, h_i, m_i, s_i = np.nonzero(slots)
        n_i = np_idx[b_i, h_i, m_i, s_i]
        ids = np.full(np_idx.shape, -1, np.int32)
        ids[b_i, h_i, m_i, s_i] = np.arange(len(b_i), dtype=np.int32)
        # Evaluate mask_mod on each partial block: (P, bq, bk).
        rows = m_i[:, None, None] * bq + np.arange(bq)[None, :, None]
        cols = n_i[:, None, None] * bk + np.arange(bk)[None, None, :]
        if device is not None:
            import torch

            t = lambda a: torch.as_tensor(a, device=device)  # noqa: E731
            allowed = mask_mod(t(b_i[:, None, None]), t(h_i[:, None, None]), t(np.minimum(rows, Q_LEN - 1)),
                               t(np.minimum(cols, KV_LEN - 1)))
            allowed = torch.broadcast_to(allowed, (len(b_i), bq, bk)).cpu().numpy()
        else:
            allowed = np.broadcast_to(mask_mod(b_i[:, None, None], h_i[:, None, None], np.minimum(rows, Q_LEN - 1),
                                               np.minimum(cols, KV_LEN - 1)), (len(b_i), bq, bk))
        allowed = np.asarray(allowed, np.bool_) & (rows < Q_LEN) & (cols < KV_LEN)
        bits = _pack_bits(allowed)
        q_idx = getattr(block_mask, "q_indices", None)
        if q_idx is not None:
            np_q_num = _to_numpy(block_mask.q_num_blocks).astype(np.int64)
            np_q_idx = _to_numpy(q_idx).astype(np.int64)
            grid = np.full((Bm, Hm, QB, KB), -1, np.int32)
            grid[b_i, h_i, m_i, np.clip(n_i, 0, KB - 1)] = np.arange(len(b_i), dtype=np.int32)
            q_ids = np.take_along_axis(np.swapaxes(grid, 2, 3), np.clip(np_q_idx, 0, QB - 1), axis=-1)
            q_ids = np.where(np.arange(np_q_idx.shape[-1]) < np_q_num[..., None], q_ids, -1).astype(np.int32)

    def convert(x):
        if x is None:
            return None
        if device is not None:
            import torch

            return torch.from_numpy(np.ascontiguousarray(x)).to(device)
        return np.ascontiguousarray(x)

    def as_int32(x):
        if x is None:
            return None
        if _is_torch(x):
            return x.to(dtype=__import__("torch").int32)
        return np.asarray(x, np.int32)

    fields = [as_int32(getattr(block_mask, name, None)) for name in
              ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
               "full_q_num_blocks", "full_q_indices")]
    return BlockMask(*fields, (bq, bk), (Q_LEN, KV_LEN), convert(bits), convert(ids), convert(q_ids))
