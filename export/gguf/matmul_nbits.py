"""Weights in ONNX Runtime's ``MatMulNBits`` form, whatever GGUF type they came from: the
products of a graph without edgespec's GGUF kernels (an install where they did not build,
``--kernels mlas``, and CUDA, where ``auto`` picks them). The
records the graph builder and the manifest read, and what is done to them once converted
(dequantized for the parity check, stacked along the outputs, or requantized to
8 bits when the file's grid cannot be kept). :mod:`edgespec.export.gguf.weights` says how each
llama.cpp block type maps onto this form."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 32


@dataclass(frozen=True, kw_only=True)
class Factors:
    """Per-block values [N, K / block] = ``per_super[..., None] * per_block`` in float32,
    reshaped: a K-quant's float16 field of each super-block of 256 (``per_super`` float16
    [N, K / 256, 1]) times its sub-blocks' integers (``per_block`` uint8 or int8
    [N, K / 256, sub-blocks])."""

    per_super: np.ndarray
    per_block: np.ndarray

    def values(self) -> np.ndarray:
        product = self.per_super.astype(np.float32) * self.per_block.astype(np.float32)
        return product.reshape(product.shape[0], -1)

    def rows(self, rows: np.ndarray) -> Factors:
        return Factors(per_super=self.per_super[rows], per_block=self.per_block[rows])


@dataclass(frozen=True, kw_only=True)
class BlockShape:
    """What the graph and the manifest need of a block-quantized weight once it is stored."""

    bits: int
    rows: int
    columns: int
    block: int
    source_type: str
    grid_kept: bool


@dataclass(frozen=True, kw_only=True)
class BlockWeights:
    """One weight [rows = N outputs, columns = K inputs] in MatMulNBits form.

    ``packed`` uint8 [N, K / block, block / 2 or block] with MatMulNBits' default zero point
    (8 or 128); ``scales`` float32 [N, K / block]; ``offsets`` float32 [N, K / block] or None:
    added to every weight of its block (Q4_1's minimum); ``grid_kept`` False when the file's
    type had to be requantized. ``minimums`` (float32 [N, K / block]) is set when
    ``offsets == minimums + minimum_shift * scales`` in float32, so the bundle can store the
    file's fields and compute the offsets when the graph loads; ``scale_factors`` and
    ``minimum_factors`` are the file's fields that ``scales`` and ``minimums`` are products
    of (K-quants)."""

    bits: int
    packed: np.ndarray
    scales: np.ndarray
    offsets: np.ndarray | None
    source_type: str
    grid_kept: bool
    minimums: np.ndarray | None = None
    minimum_shift: float = 0.0
    block: int = BLOCK
    scale_factors: Factors | None = None
    minimum_factors: Factors | None = None

    @property
    def rows(self) -> int:
        return int(self.packed.shape[0])

    @property
    def columns(self) -> int:
        return int(self.packed.shape[1]) * self.block

    @property
    def shape(self) -> BlockShape:
        return BlockShape(
            bits=self.bits,
            rows=self.rows,
            columns=self.columns,
            block=self.block,
            source_type=self.source_type,
            grid_kept=self.grid_kept,
        )


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """[..., 32] codes 0..15 → [..., 16] bytes, element 2t low and 2t + 1 high (MatMulNBits)."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def requantize_8bit(weight: np.ndarray, source_type: str) -> BlockWeights:
    """Round-to-nearest symmetric 8 bits per block of 32 (weight [N, K], K divisible by 32)."""
    rows, columns = weight.shape
    blocks = weight.reshape(rows, columns // BLOCK, BLOCK)
    scales = (np.abs(blocks).max(axis=-1) / 127.0).astype(np.float32)
    safe = np.where(scales == 0, 1.0, scales)
    codes = np.clip(np.rint(blocks / safe[..., None]), -127, 127).astype(np.int16) + 128
    return BlockWeights(
        bits=8,
        packed=codes.astype(np.uint8),
        scales=scales,
        offsets=None,
        source_type=source_type,
        grid_kept=False,
    )


def dequantized(weights: BlockWeights) -> np.ndarray:
    """What the graph computes with, [N, K] float32: the check that no grid was lost."""
    if weights.bits == 4:
        codes = np.empty((*weights.packed.shape[:-1], weights.block), dtype=np.float32)
        codes[..., 0::2] = weights.packed & 0x0F
        codes[..., 1::2] = weights.packed >> 4
    else:
        codes = weights.packed.astype(np.float32)
    zero_point = 2.0 ** (weights.bits - 1)
    values = (codes - zero_point) * weights.scales[..., None]
    if weights.offsets is not None:
        values += weights.offsets[..., None]
    return values.reshape(weights.rows, weights.columns)


def _stacked_factors(parts: list[Factors | None]) -> Factors | None:
    if any(p is None for p in parts) or len({p.per_block.shape[1:] for p in parts}) != 1:  # type: ignore[union-attr]
        return None
    return Factors(
        per_super=np.concatenate([p.per_super for p in parts]),  # type: ignore[union-attr]
        per_block=np.concatenate([p.per_block for p in parts]),  # type: ignore[union-attr]
    )


def concatenate(parts: list[BlockWeights]) -> BlockWeights | None:
    """Weights sharing an input stacked along the outputs (Q|K|V, gate|up) for one MatMulNBits
    call instead of several; None when their widths or bit widths differ. A part without
    offsets gets zero offsets, which adds nothing."""
    if len({(p.bits, p.columns, p.block) for p in parts}) != 1:
        return None
    with_offsets = any(p.offsets is not None for p in parts)
    # The minimums form holds when every part has it with one shift (zero offsets do not).
    shifts = {p.minimum_shift if p.minimums is not None else None for p in parts}
    minimums_kept = len(shifts) == 1 and None not in shifts
    return BlockWeights(
        bits=parts[0].bits,
        packed=np.concatenate([p.packed for p in parts]),
        scales=np.concatenate([p.scales for p in parts]),
        offsets=np.concatenate(
            [p.offsets if p.offsets is not None else np.zeros_like(p.scales) for p in parts]
        )
        if with_offsets
        else None,
        source_type="+".join(sorted({p.source_type for p in parts})),
        grid_kept=all(p.grid_kept for p in parts),
        minimums=np.concatenate([p.minimums for p in parts if p.minimums is not None])
        if minimums_kept
        else None,
        minimum_shift=parts[0].minimum_shift if minimums_kept else 0.0,
        block=parts[0].block,
        scale_factors=_stacked_factors([p.scale_factors for p in parts]),
        minimum_factors=_stacked_factors([p.minimum_factors for p in parts])
        if minimums_kept
        else None,
    )
