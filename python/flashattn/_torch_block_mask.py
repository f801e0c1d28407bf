"""A dense boolean attn_mask to its block-sparse form in torch ops, on the mask's device.

The host conversion (block_mask.py, _from_dense_numpy) reads the mask on the host and
stores bits for the partial blocks only, whose number it must know. This one never
reads a value on the host (no .item(), no nonzero, no host copy), so it runs inside
CUDA-graph capture and torch.compile: every shape depends on the mask's shape alone.
The price is memory sized for the worst case, every block partial: the bit table
holds all Bm·Hm·QB·KB blocks (1 bit per mask element, 1/8 of a bool mask) and the
partial block id of block (b, h, m, n) is its row-major position in that grid, so an
id needs no count of the partial blocks before it.

Output: a flashattn.BlockMask (block_mask.hpp's layout, torch int32 tensors on the
mask's device) with, for each (b|1, h|1, query block m), the partial and full key
blocks in ascending order, the transposed lists for the backward pass, and the bits
and ids of every block. Empty blocks are listed nowhere and never visited; full
blocks skip the element mask; partial blocks read their bits. A size-1 batch or head
dimension of the mask stays size 1 (broadcast by the kernels through zero strides).
"""

import torch

from flashattn.block_mask import BlockMask

_EMPTY, _PARTIAL, _FULL = 0, 1, 2


def _block_lists(kinds, want):
    """(num int32 [..., rows], indices int32 [..., rows, cols], order int64) of the blocks
    of kind `want` along the last dimension, ascending, zero-filled past num (as the host
    conversion writes them)."""
    hit = kinds == want
    num = hit.sum(-1, dtype=torch.int32)
    # A stable descending sort of the 0/1 keys puts the listed blocks first, in ascending order.
    order = torch.sort(hit.to(torch.int8), dim=-1, descending=True, stable=True).indices
    slots = torch.arange(kinds.shape[-1], device=kinds.device)
    listed = slots < num[..., None]
    indices = torch.where(listed, order, 0).to(torch.int32)
    return num, indices, order, listed


def _pack_bits(tiles, words_per_row):
    """(P, bq, bk) bool -> int32 (P, bq, words_per_row): bit c of a row is bit c % 32 of
    word c // 32 (block_mask.hpp), made without reinterpreting memory (no dtype views,
    which torch.compile handles unevenly): bytes first, then four bytes per word."""
    P, bq, bk = tiles.shape
    # Weights made on the device: a host tensor copied in would be a pageable copy,
    # which CUDA-graph capture refuses.
    byte_weights = (2 ** torch.arange(8, device=tiles.device)).to(torch.uint8)  # 1, 2, ..., 128
    # (P, bq, bk / 8): disjoint bits, so the sum is their OR and fits a byte.
    row_bytes = (tiles.reshape(P, bq, bk // 8, 8).to(torch.uint8) * byte_weights).sum(-1, dtype=torch.uint8)
    word_weights = 256 ** torch.arange(4, device=tiles.device)  # int64 1, 2^8, 2^16, 2^24
    words = (row_bytes.reshape(P, bq, words_per_row, 4).to(torch.int64) * word_weights).sum(-1)  # [0, 2^32)
    # Two's complement int32 of the unsigned word: the kernels read the bits as uint32.
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def block_mask_from_dense_tensor(mask, seq_lengths, BLOCK_SIZE=(128, 128)):
    """The BlockMask of a boolean (or uint8: nonzero = allowed) torch mask broadcastable
    to [B, H, seq_lengths[0], seq_lengths[1]] with rank 4 ([B|1, H|1, L|1, S|1]); see the
    module docstring. BLOCK_SIZE: powers of two, the key block a multiple of 32."""
    bq, bk = BLOCK_SIZE
    if bk % 32 != 0:
        raise NotImplementedError(f"flashattn: BLOCK_SIZE: the device conversion packs 32-bit words, got a key "
                                  f"block of {bk}")
    L, S = int(seq_lengths[0]), int(seq_lengths[1])
    if mask.ndim != 4:
        raise ValueError(f"flashattn: attn_mask: expected rank 4 [B|1, H|1, L, S] here, got {tuple(mask.shape)}")
    batch, heads = mask.shape[0], mask.shape[1]
    device = mask.device
    q_blocks, kv_blocks = -(-L // bq), -(-S // bk)
    allowed = mask if mask.dtype == torch.bool else mask != 0
    # (batch, heads, q_blocks * bq, kv_blocks * bk): rows/columns of size 1 broadcast here,
    # the padding past L and S is False.
    padded = torch.zeros((batch, heads, q_blocks * bq, kv_blocks * bk), dtype=torch.bool, device=device)
    padded[:, :, :L, :S] = allowed
    tiles = padded.view(batch, heads, q_blocks, bq, kv_blocks, bk)
    allowed_count = tiles.sum(dim=(3, 5), dtype=torch.int32)  # (batch, heads, q_blocks, kv_blocks)
    rows_inside = (L - torch.arange(q_blocks, device=device) * bq).clamp(max=bq)
    cols_inside = (S - torch.arange(kv_blocks, device=device) * bk).clamp(max=bk)
    inside_count = (rows_inside[:, None] * cols_inside[None, :]).to(torch.int32)  # (q_blocks, kv_blocks)
    kinds = torch.where(allowed_count == 0, _EMPTY, torch.where(allowed_count == inside_count, _FULL, _PARTIAL))

    kv_num, kv_indices, kv_order, kv_listed = _block_lists(kinds, _PARTIAL)
    full_kv_num, full_kv_indices, _, _ = _block_lists(kinds, _FULL)
    kinds_t = kinds.transpose(2, 3)  # (batch, heads, kv_blocks, q_blocks)
    q_num, q_indices, q_order, q_listed = _block_lists(kinds_t, _PARTIAL)
    full_q_num, full_q_indices, _, _ = _block_lists(kinds_t, _FULL)

    # Partial block id of (b, h, m, n) = its row-major position; -1 in unused slots.
    grid = torch.arange(batch * heads * q_blocks * kv_blocks, dtype=torch.int32, device=device)
    grid = grid.view(batch, heads, q_blocks, kv_blocks)
    partial_ids = torch.where(kv_listed, torch.gather(grid, -1, kv_order), -1).to(torch.int32)
    q_partial_ids = torch.where(q_listed, torch.gather(grid.transpose(2, 3), -1, q_order), -1).to(torch.int32)
    # (batch * heads * q_blocks * kv_blocks, bq, bk) in the ids' order.
    block_tiles = tiles.permute(0, 1, 2, 4, 3, 5).reshape(-1, bq, bk)
    partial_bits = _pack_bits(block_tiles, bk // 32)
    return BlockMask(kv_num, kv_indices, full_kv_num, full_kv_indices, q_num, q_indices, full_q_num, full_q_indices,
                     (bq, bk), (L, S), partial_bits, partial_ids, q_partial_ids)
