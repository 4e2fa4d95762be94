"""llama.cpp's legacy block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: one float16 scale, and for
Q4_1/Q5_1 a minimum, per block of 32 weights) decoded into :class:`BlockWeights` without
requantization; :mod:`edgespec.export.gguf.weights` describes each mapping."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgespec.export.gguf.matmul_nbits import BLOCK, BlockWeights, pack_nibbles
from edgespec.export.gguf.reader import tensor_rows


def _blocks(tensor: Any, block_bytes: int) -> np.ndarray:
    rows, columns = tensor_rows(tensor)
    raw = np.ascontiguousarray(np.asarray(tensor.data)).view(np.uint8)
    return raw.reshape(rows, columns // BLOCK, block_bytes)


def _half(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The float16 at byte ``offset`` of every block, as float32 [N, blocks]."""
    return (
        np.ascontiguousarray(blocks[..., offset : offset + 2])
        .view(np.float16)[..., 0]
        .astype(np.float32)
    )


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """llama.cpp's 16 bytes → the block's 32 codes in order (low nibbles first)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q4_0(tensor: Any) -> BlockWeights:
    blocks = _blocks(tensor, 18)
    scales = _half(blocks, 0)
    return BlockWeights(
        bits=4,
        packed=pack_nibbles(_nibbles(blocks[..., 2:])),
        scales=scales,
        offsets=None,
        source_type="Q4_0",
        grid_kept=True,
    )


def _q4_1(tensor: Any) -> BlockWeights:
    blocks = _blocks(tensor, 20)
    d, m = _half(blocks, 0), _half(blocks, 2)
    return BlockWeights(
        bits=4,
        packed=pack_nibbles(_nibbles(blocks[..., 4:])),
        scales=d,
        offsets=(m + 8.0 * d).astype(np.float32),
        source_type="Q4_1",
        grid_kept=True,
        minimums=m,
        minimum_shift=8.0,
    )


def _q8_0(tensor: Any) -> BlockWeights:
    blocks = _blocks(tensor, 34)
    scales = _half(blocks, 0)
    codes = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(np.int16) + 128
    return BlockWeights(
        bits=8,
        packed=codes.astype(np.uint8),
        scales=scales,
        offsets=None,
        source_type="Q8_0",
        grid_kept=True,
    )


def _five_bit_codes(blocks: np.ndarray, high_at: int) -> np.ndarray:
    """Q5_0/Q5_1 codes 0..31 [N, K / 32, 32]: bit e of the little-endian word at ``high_at``
    is weight e's fifth bit; the 16 bytes after it are nibbles as in Q4_0."""
    words = np.ascontiguousarray(blocks[..., high_at : high_at + 4]).view("<u4")  # [N, B, 1]
    high = (words >> np.arange(32, dtype=np.uint32)) & 1  # [N, B, 32]
    return _nibbles(blocks[..., high_at + 4 :]) | (high.astype(np.uint8) << 4)


def _q5_0(tensor: Any) -> BlockWeights:
    blocks = _blocks(tensor, 22)
    return BlockWeights(
        bits=8,
        packed=(_five_bit_codes(blocks, 2) + 112).astype(np.uint8),
        scales=_half(blocks, 0),
        offsets=None,
        source_type="Q5_0",
        grid_kept=True,
    )


def _q5_1(tensor: Any) -> BlockWeights:
    blocks = _blocks(tensor, 24)
    d, m = _half(blocks, 0), _half(blocks, 2)
    return BlockWeights(
        bits=8,
        packed=(_five_bit_codes(blocks, 4) + 112).astype(np.uint8),
        scales=d,
        offsets=(m + 16.0 * d).astype(np.float32),
        source_type="Q5_1",
        grid_kept=True,
        minimums=m,
        minimum_shift=16.0,
    )


#: Each legacy type's conversion, by the type's GGUF name.
LEGACY_QUANTS = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
}
