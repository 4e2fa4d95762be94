"""llama.cpp's K-quants (Q4_K, Q5_K, Q6_K: super-blocks of 256 weights whose sub-blocks carry
small integer scales and minimums times the super-block's float16 fields) decoded into
:class:`BlockWeights` without requantization, their block scales kept as the file's
:class:`Factors`; :mod:`edgespec.export.gguf.weights` describes each mapping."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgespec.export.gguf.matmul_nbits import BLOCK, BlockWeights, Factors, pack_nibbles
from edgespec.export.gguf.reader import tensor_rows

SUPER_BLOCK = 256  # weights per K-quant super-block (8 sub-blocks of 32)


def _super_blocks(tensor: Any, block_bytes: int) -> np.ndarray:
    rows, columns = tensor_rows(tensor)
    raw = np.ascontiguousarray(np.asarray(tensor.data)).view(np.uint8)
    return raw.reshape(rows * columns // SUPER_BLOCK, block_bytes)


def _k_blocks(tensor: Any, block_bytes: int) -> tuple[Factors, Factors, np.ndarray]:
    """A K-quant tensor's super-blocks split into the factors of the sub-block scale d·sc and
    of the negated minimum -dmin·m, and the rest of each super-block [N · K / 256, bytes]."""
    from gguf.quants import Q4_K

    rows = tensor_rows(tensor)[0]
    blocks = _super_blocks(tensor, block_bytes)
    d = np.ascontiguousarray(blocks[:, 0:2]).view(np.float16)  # [blocks, 1]
    dmin = np.ascontiguousarray(blocks[:, 2:4]).view(np.float16)
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])  # the 6-bit fields, [blocks, 8] each

    def factors(half: np.ndarray, integers: np.ndarray) -> Factors:
        return Factors(per_super=half.reshape(rows, -1, 1), per_block=integers.reshape(rows, -1, 8))

    # -(dmin·m) = (-dmin)·m exactly, and offsets = 8 d·sc + (-dmin·m) = 8 d·sc - dmin·m.
    return factors(d, sc.astype(np.uint8)), factors(-dmin, m.astype(np.uint8)), blocks[:, 16:]


def _k_nibbles(qs: np.ndarray, rows: int) -> np.ndarray:
    """Q4_K/Q5_K low bits: 32 bytes per 64 weights, the first 32 in the low nibbles, the next
    32 in the high ones → codes [N, K / 32, 32] in order."""
    groups = qs.reshape(qs.shape[0], -1, 1, 32)  # [blocks, 4, 1, 32]
    codes = np.concatenate([groups & 0x0F, groups >> 4], axis=2)  # [blocks, 4, 2, 32]
    return codes.reshape(rows, -1, BLOCK)


def _k_weights(
    packed: np.ndarray, bits: int, shift: float, factors: tuple[Factors, Factors], kind: str
) -> BlockWeights:
    """``shift``: how far MatMulNBits' zero point lies below the file's (8 or 16 codes)."""
    scale_factors, minimum_factors = factors
    scales, minimums = scale_factors.values(), minimum_factors.values()
    return BlockWeights(
        bits=bits,
        packed=packed,
        scales=scales,
        offsets=(minimums + shift * scales).astype(np.float32),
        source_type=kind,
        grid_kept=True,
        minimums=minimums,
        minimum_shift=shift,
        scale_factors=scale_factors,
        minimum_factors=minimum_factors,
    )


def _q4_k(tensor: Any) -> BlockWeights:
    rows = tensor_rows(tensor)[0]
    scales, minimums, rest = _k_blocks(tensor, 144)
    return _k_weights(pack_nibbles(_k_nibbles(rest, rows)), 4, 8.0, (scales, minimums), "Q4_K")


def _q5_k(tensor: Any) -> BlockWeights:
    rows = tensor_rows(tensor)[0]
    scales, minimums, rest = _k_blocks(tensor, 176)
    high_bits, low = rest[:, :32], rest[:, 32:]  # bit j of byte e: weight e of sub-block j
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    high = ((high_bits[:, None, :] >> shifts) & 1).reshape(rows, -1, BLOCK)
    codes = _k_nibbles(low, rows) | (high << 4)  # 0..31
    return _k_weights((codes + 112).astype(np.uint8), 8, 16.0, (scales, minimums), "Q5_K")


Q6_K_BLOCK = 16


def _q6_k(tensor: Any) -> BlockWeights:
    """Q6_K: low nibbles (128 bytes), high 2-bit pairs (64), int8 scales (16), float16 d."""
    rows = tensor_rows(tensor)[0]
    blocks = _super_blocks(tensor, 210)
    nibbles = blocks[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(
        1, 1, 2, 1
    )
    low = (nibbles & 0x0F).reshape(-1, 2, 4, 32)  # [blocks, half, quarter, 32]
    high = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(
        1, 1, 4, 1
    )
    codes = low | ((high & 0x03) << 4)  # 0..63, the super-block's 256 weights in order
    scale_factors = Factors(
        per_super=np.ascontiguousarray(blocks[:, 208:210]).view(np.float16).reshape(rows, -1, 1),
        per_block=np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).reshape(rows, -1, 16),
    )
    return BlockWeights(
        bits=8,
        packed=(codes.reshape(rows, -1, Q6_K_BLOCK) + 96).astype(np.uint8),
        scales=scale_factors.values(),
        offsets=None,
        source_type="Q6_K",
        grid_kept=True,
        block=Q6_K_BLOCK,
        scale_factors=scale_factors,
    )


#: Each K-quant's conversion, by the type's GGUF name.
K_QUANTS = {
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}
