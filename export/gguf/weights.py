"""llama.cpp's block-quantized weights as ONNX Runtime ``MatMulNBits`` weights, keeping the
grid wherever MatMulNBits can express it.

MatMulNBits computes ``w = (q - zero_point) * scale`` per block of 32 along the input
dimension, with q packed two to a byte (element 2t in the low nibble of byte t) for 4 bits, one
per byte for 8 bits. llama.cpp's blocks map onto that with no requantization:

* Q4_0 (``d``, 16 bytes of nibbles): ``w = (q - 8) * d`` → scale d and MatMulNBits' default
  zero point (8 for 4 bits);
* Q4_1 (``d``, ``m``, nibbles): ``w = q * d + m = (q - 8) * d + (m + 8 d)`` → scale d, default
  zero point, and a per-block offset ``m + 8 d`` that the graph adds as
  ``blocksum(x) @ offsets.T`` (x summed over each block of 32). MatMulNBits also takes float
  zero points (``-m / d``), but they force a slow kernel: 0.57 ms against 0.047 ms for a
  1536 x 576 weight and one row on this CPU;
* Q8_0 (``d``, 32 signed bytes): ``w = q * d`` → q + 128 as unsigned, default zero point 128;
* Q5_0 / Q5_1 (a fifth bit per weight in a 32-bit word): ``w = (q - 16) * d`` / ``q * d + m``,
  q in 0..31 → 8 bits (q + 112, zero point 128: exact, at 8 bits' size), Q5_1 with the
  offset ``m + 16 d``;
* Q4_K (super-blocks of 256: ``d``, ``dmin``, 6-bit scale ``sc`` and minimum ``m`` per
  sub-block of 32, nibbles): ``w = q * d·sc - dmin·m`` → 4 bits, scale d·sc and offset
  8 d·sc - dmin·m per block of 32, as Q4_1;
* Q5_K (as Q4_K with a fifth bit per weight): ``w = q * d·sc - dmin·m``, q in 0..31 → 8 bits
  (q + 112, zero point 128: exact, at 8 bits' size), offset 16 d·sc - dmin·m;
* Q6_K (super-blocks of 256: ``d`` and a signed 8-bit scale ``sc`` per sub-block of 16):
  ``w = (q - 32) * d·sc``, q in 0..63 → 8 bits in blocks of 16 (q + 96, zero point 128).

The K-quants' block scales d·sc (and minimums dmin·m) are products of a float16 and a small
integer that float16 cannot always hold: they are kept as their :class:`Factors` (the file's
own fields) and multiplied when the graph loads, as the importer multiplies them.

llama.cpp packs a block's first 16 weights in the low nibbles and the last 16 in the high
ones (Q4_K/Q5_K: a 64-weight group's first 32 low, last 32 high), so nibbles are reordered
(not changed). Other types are dequantized and requantized to 8 bits per block of 32 (round to
nearest): the grid is then not llama.cpp's, and the record says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from edgespec.export.gguf.reader import float_tensor, tensor_rows

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


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """[..., 32] codes 0..15 → [..., 16] bytes, element 2t low and 2t + 1 high (MatMulNBits)."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


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


EXACT = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}


#: Weights converted at once: a larger tensor (an embedding) is converted a slice of rows at a
#: time, so the conversion's intermediate arrays (32-bit words per 5-bit code...) stay small.
CONVERT_SLICE = 1 << 24


@dataclass(frozen=True)
class _Rows:
    """Rows ``start:stop`` of a GGUF tensor, shaped as the reader's tensors are."""

    tensor: Any
    start: int
    stop: int

    @property
    def data(self) -> np.ndarray:
        return np.asarray(self.tensor.data)[self.start : self.stop]

    @property
    def tensor_type(self) -> Any:
        return self.tensor.tensor_type

    @property
    def shape(self) -> tuple[int, int]:
        return (tensor_rows(self.tensor)[1], self.stop - self.start)


def block_weights(tensor: Any) -> BlockWeights | None:
    """The weight as MatMulNBits blocks; None for F32/F16/BF16 weights (kept as float) or a
    width that is not a multiple of 32."""
    kind = tensor.tensor_type.name
    rows, columns = tensor_rows(tensor)
    if kind in EXACT and rows * columns > CONVERT_SLICE:
        step = max(1, CONVERT_SLICE // columns)
        parts = [EXACT[kind](_Rows(tensor, a, min(a + step, rows))) for a in range(0, rows, step)]
        return concatenate(parts)
    if kind in EXACT:
        return EXACT[kind](tensor)
    if kind in ("F32", "F16", "BF16") or columns % BLOCK:
        return None
    return requantize_8bit(float_tensor(tensor), kind)


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


def reordered(
    weights: BlockWeights, *, rows: np.ndarray | None = None, columns: np.ndarray | None = None
) -> BlockWeights:
    """The same blocks with the outputs in ``rows`` order and the inputs in ``columns`` order;
    ``columns`` must move whole blocks (each run of a block starting at a multiple of it).
    Moving columns drops the K-quants' factors (a super-block's sub-blocks are split up), so
    their scales are then stored as float32."""
    blocks = None
    size = weights.block
    if columns is not None:
        runs = np.asarray(columns).reshape(-1, size)
        blocks = runs[:, 0] // size
        if (runs[:, 0] % size).any() or (runs != runs[:, :1] + np.arange(size)).any():
            raise ValueError("block-quantized inputs can only be reordered by whole blocks")

    def factors(kept: Factors | None) -> Factors | None:
        if kept is None or columns is not None:
            return None
        return kept if rows is None else kept.rows(rows)

    def take(values: np.ndarray) -> np.ndarray:
        if rows is not None:
            values = values[rows]
        if blocks is not None:
            values = values[:, blocks]
        return np.ascontiguousarray(values)

    return replace(
        weights,
        packed=take(weights.packed),
        scales=take(weights.scales),
        offsets=None if weights.offsets is None else take(weights.offsets),
        minimums=None if weights.minimums is None else take(weights.minimums),
        scale_factors=factors(weights.scale_factors),
        minimum_factors=factors(weights.minimum_factors),
    )


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
