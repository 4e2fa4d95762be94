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
  zero points (``-m / d``), but they force a slow kernel (docs/benchmarks/smollm2-vs-llama-cpp.md,
  "Where a 4-bit step goes");
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

This module picks the conversion of each tensor; the conversions live in
:mod:`~edgespec.export.gguf.legacy_quants` and :mod:`~edgespec.export.gguf.k_quants`, the
converted records (and what is done to them) in :mod:`~edgespec.export.gguf.matmul_nbits`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgespec.export.gguf.k_quants import K_QUANTS
from edgespec.export.gguf.legacy_quants import LEGACY_QUANTS
from edgespec.export.gguf.matmul_nbits import BLOCK, BlockWeights, concatenate, requantize_8bit
from edgespec.export.gguf.reader import float_tensor, tensor_rows

#: The types converted with the file's own grid: each maps onto MatMulNBits exactly.
EXACT = {**LEGACY_QUANTS, **K_QUANTS}

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
