"""The writer of the rows-of-8 layout of GGUF's block types (Q4_0 ... Q8_0, Q2_K ... Q6_K,
IQ4_NL, IQ4_XS) that the GGUF kernels read fastest: the file's blocks with their bits moved,
none added or dropped, so a bundle stays the file's size. The layout is specified once, in
``csrc/gguf_rows8.h`` (group blocks of 8 outputs, byte by byte); ``csrc/gguf_rows8.c`` reads it
back and tests/kernels/test_kernel_paths.py checks that this writer and that reader round-trip
every type. The exporter writes it at import (raw_blocks.py) for every weight whose outputs
form groups of 8.
"""

from __future__ import annotations

import numpy as np

ROWS8_OFFSET = 1024  # the operators' ggml_type attribute: the legacy type's id + this
ROWS8_TYPES = frozenset(
    {
        "Q4_0",
        "Q4_1",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "IQ4_NL",
        "IQ4_XS",
    }
)

_BLOCK_BYTES = {
    "Q4_0": 18,
    "Q4_1": 20,
    "Q5_0": 22,
    "Q5_1": 24,
    "Q8_0": 34,
    "Q2_K": 84,
    "Q3_K": 110,
    "Q4_K": 144,
    "Q5_K": 176,
    "Q6_K": 210,
    "IQ4_NL": 18,
    "IQ4_XS": 136,
}
_GROUPS_PER_CHUNK = 512  # 4,096 outputs converted at a time: a bounded temporary


def rows8_fits(kind: str, rows: int) -> bool:
    """Whether a weight of ``rows`` outputs of type ``kind`` can take the layout."""
    return kind in ROWS8_TYPES and rows % 8 == 0


def to_rows8(data: np.ndarray, kind: str) -> np.ndarray:
    """The file's blocks ``data`` (uint8 [N, row bytes], N a multiple of 8) in the rows-of-8
    layout, same shape and bytes."""
    if not rows8_fits(kind, data.shape[0]):
        raise ValueError(f"{kind} with {data.shape[0]} rows does not take the rows-of-8 layout")
    out = np.empty_like(data)
    chunk = 8 * _GROUPS_PER_CHUNK
    for start in range(0, data.shape[0], chunk):
        out[start : start + chunk] = _groups(np.asarray(data[start : start + chunk]), kind)
    return out


def _groups(data: np.ndarray, kind: str) -> np.ndarray:
    size = _BLOCK_BYTES[kind]
    rows, width = data.shape
    blocks = data.reshape(rows // 8, 8, width // size, size).transpose(0, 2, 1, 3)
    # blocks: [groups, block index, lane, file block bytes]
    k_quants = {
        "Q2_K": _q2_k,
        "Q3_K": _q3_k,
        "Q4_K": _q4_k,
        "Q5_K": _q5_k,
        "Q6_K": _q6_k,
        "IQ4_XS": _iq4_xs,
    }
    if kind in k_quants:
        return k_quants[kind](blocks, rows, width)
    minimum = kind in ("Q4_1", "Q5_1")
    parts = [blocks[..., 0:2]]
    if minimum:
        parts.append(blocks[..., 2:4])
    head = [part.reshape(*blocks.shape[:2], 16) for part in parts]
    if kind == "Q8_0":
        codes = blocks[..., 2:34]  # [G, B, lane, 32] signed codes as bytes
        return _assemble(head, [_registers(codes)], rows, width)
    five = kind in ("Q5_0", "Q5_1")
    qs_at = {"Q4_0": 2, "Q4_1": 4, "Q5_0": 6, "Q5_1": 8, "IQ4_NL": 2}[kind]
    qs = blocks[..., qs_at : qs_at + 16]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [G, B, lane, 32]: inputs 0..31
    registers = _registers(codes)  # [G, B, 8 registers, 32]
    tail = []
    if five:
        high_at = 4 if minimum else 2
        fifth = np.unpackbits(
            blocks[..., high_at : high_at + 4], axis=-1, bitorder="little"
        )  # [G, B, lane, 32]: input i's fifth bit
        planes = _registers(fifth).astype(np.uint8)  # [G, B, register j, 32]
        weights = (1 << np.arange(8, dtype=np.uint8)).reshape(1, 1, 8, 1)
        tail.append(
            (planes * weights).sum(axis=2, dtype=np.uint8).reshape(*blocks.shape[:2], 1, 32)
        )
    nibbles = (registers[:, :, :4] & 0x0F) | ((registers[:, :, 4:] & 0x0F) << 4)
    return _assemble(head, [*tail, nibbles], rows, width)


def _registers(codes: np.ndarray) -> np.ndarray:
    """[G, B, lane, 32 inputs] → [G, B, register j, 32 bytes]: byte 4i + t is lane i's input
    4j + t."""
    groups, blocks = codes.shape[:2]
    return (
        codes.reshape(groups, blocks, 8, 8, 4)
        .transpose(0, 1, 3, 2, 4)
        .reshape(groups, blocks, 8, 32)
    )


def _assemble(head: list[np.ndarray], tail: list[np.ndarray], rows: int, width: int) -> np.ndarray:
    groups, blocks = head[0].shape[:2]
    pieces = [*head, *(t.reshape(groups, blocks, -1) for t in tail)]
    return np.concatenate(pieces, axis=-1).reshape(rows, width)


def _halves(field: np.ndarray) -> np.ndarray:
    """[G, B, lane, 2] float16 bytes → [G, B, 16]: the 8 outputs' values in order."""
    return field.reshape(*field.shape[:2], 16)


def _nibble_registers(codes: np.ndarray) -> np.ndarray:
    """[G, B, lane, 32 * c] codes below 16 (or their low 4 bits) → [G, B, c * 128] bytes: per
    32 inputs, registers j and j + 4 as one byte's nibbles."""
    groups, blocks, _, width = codes.shape
    chunks = codes.reshape(groups, blocks, 8, width // 32, 32).transpose(0, 1, 3, 2, 4)
    registers = _registers(chunks.reshape(groups, blocks * (width // 32), 8, 32))
    registers = registers.reshape(groups, blocks, width // 32, 8, 32) & 0x0F
    return (registers[:, :, :, :4] | (registers[:, :, :, 4:] << 4)).reshape(groups, blocks, -1)


def _six_bit_fields(sc: np.ndarray, mn: np.ndarray) -> list[np.ndarray]:
    """Two arrays of 64 values below 64 each ([G, B, 64]: index 8s + lane) → their 96 bytes:
    low nibbles of SC (SC[q] low, SC[q + 32] high), of MN, then byte q's bit pairs SC[q] >> 4,
    SC[q + 32] >> 4, MN[q] >> 4, MN[q + 32] >> 4."""
    high = (
        (sc[..., :32] >> 4)
        | ((sc[..., 32:] >> 4) << 2)
        | ((mn[..., :32] >> 4) << 4)
        | ((mn[..., 32:] >> 4) << 6)
    )
    return [
        (sc[..., :32] & 0x0F) | ((sc[..., 32:] & 0x0F) << 4),
        (mn[..., :32] & 0x0F) | ((mn[..., 32:] & 0x0F) << 4),
        high.astype(np.uint8),
    ]


def _by_sub_block(values: np.ndarray) -> np.ndarray:
    """[G, B, lane, S] one value per output and sub-block → [G, B, S * 8]: index 8s + lane."""
    return values.transpose(0, 1, 3, 2).reshape(*values.shape[:2], -1)


def _k_factors(blocks: np.ndarray) -> list[np.ndarray]:
    """[G, B, lane, bytes] Q4_K or Q5_K blocks → their group blocks' first 128 bytes: d[8],
    dmin[8] and the 6-bit scales and minimums in 96 bytes (csrc/gguf_rows8.h)."""
    factors = blocks[..., 4:16].astype(np.uint16)  # [G, B, lane, 12]: scales[12]
    scale = np.empty((*blocks.shape[:3], 8), np.uint8)
    minimum = np.empty_like(scale)
    scale[..., :4] = factors[..., 0:4] & 63
    minimum[..., :4] = factors[..., 4:8] & 63
    scale[..., 4:] = (factors[..., 8:12] & 0x0F) | ((factors[..., 0:4] >> 6) << 4)
    minimum[..., 4:] = (factors[..., 8:12] >> 4) | ((factors[..., 4:8] >> 6) << 4)
    sc, mn = _by_sub_block(scale), _by_sub_block(minimum)
    return [_halves(blocks[..., 0:2]), _halves(blocks[..., 2:4]), *_six_bit_fields(sc, mn)]


def _two_bit_codes(qs: np.ndarray) -> np.ndarray:
    """[G, B, lane, 64] Q2_K/Q3_K low bits → [G, B, lane, 256] codes below 4: input
    128c + 32j + l is bits 2j, 2j + 1 of byte 32c + l."""
    shifts = (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 1, 4, 1)
    codes = (qs.reshape(*qs.shape[:3], 2, 1, 32) >> shifts) & 3  # [G, B, lane, c, j, l]
    return codes.reshape(*qs.shape[:3], 256)


def _chunk_registers(codes: np.ndarray) -> np.ndarray:
    """[G, B, lane, 256] → [G, B, 8 chunks of 32 inputs, register j, 32 bytes]."""
    groups, count, lanes = codes.shape[:3]
    chunks = codes.reshape(groups, count, lanes, 8, 32).transpose(0, 1, 3, 2, 4)
    return _registers(chunks.reshape(groups, count * 8, lanes, 32)).reshape(groups, count, 8, 8, 32)


def _bit_planes(bits: np.ndarray) -> np.ndarray:
    """[..., register j, 32] bits → [..., 32] bytes: bit j of byte 4i + t is register j's."""
    weights = (1 << np.arange(8, dtype=np.uint8)).reshape(8, 1)
    return (bits * weights).sum(axis=-2, dtype=np.uint8)


def _two_bit_registers(registers: np.ndarray) -> np.ndarray:
    """[..., register j, 32] codes below 4 → [..., 64] bytes: byte 32q + 4i + t (q = 0, 1)
    holds registers q, q + 2, q + 4, q + 6 in bits 0-1, 2-3, 4-5, 6-7."""
    r = registers
    packed = r[..., 0:2, :] | (r[..., 2:4, :] << 2) | (r[..., 4:6, :] << 4) | (r[..., 6:8, :] << 6)
    return packed.reshape(*r.shape[:-2], 64)


def _q2_k(blocks: np.ndarray, rows: int, width: int) -> np.ndarray:
    """[G, B, lane, 84] Q2_K blocks → group blocks of 672 bytes (csrc/gguf_rows8.h)."""
    groups, count = blocks.shape[:2]
    registers = _chunk_registers(_two_bit_codes(blocks[..., 16:80]))
    pieces = [
        _halves(blocks[..., 80:82]),
        _halves(blocks[..., 82:84]),
        _by_sub_block(blocks[..., 0:16]),
        _two_bit_registers(registers).reshape(groups, count, -1),
    ]
    return np.concatenate(pieces, axis=-1).reshape(rows, width)


def _q3_k(blocks: np.ndarray, rows: int, width: int) -> np.ndarray:
    """[G, B, lane, 110] Q3_K blocks → group blocks of 880 bytes (csrc/gguf_rows8.h)."""
    groups, count, lanes = blocks.shape[:3]
    packed = blocks[..., 96:108]  # ggml's 12 bytes of 16 six-bit scales
    low = np.concatenate([packed[..., 0:8] & 0x0F, packed[..., 0:8] >> 4], axis=-1)
    k = np.arange(16)
    high = (packed[..., 8 + k % 4] >> (2 * (k // 4)).astype(np.uint8)) & 3
    scales = _by_sub_block(low | (high << 4))  # [G, B, 128]: sub-block of 16 s, output i
    hmask = blocks[..., 0:32]  # bit 4c + j of byte l: input 128c + 32j + l's third bit
    third = (hmask[..., None, :] >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
    third = third.reshape(groups, count, lanes, 2, 4, 32).reshape(groups, count, lanes, 256)
    codes = _two_bit_codes(blocks[..., 32:96])
    registers = _chunk_registers(codes)
    planes = _bit_planes(_chunk_registers(third))  # [G, B, chunk, 32]
    per_chunk = np.concatenate([_two_bit_registers(registers), planes], axis=-1)
    pieces = [
        _halves(blocks[..., 108:110]),
        *_six_bit_fields(scales[..., :64], scales[..., 64:]),
        per_chunk.reshape(groups, count, -1),
    ]
    return np.concatenate(pieces, axis=-1).reshape(rows, width)


def _k_nibble_codes(packed: np.ndarray) -> np.ndarray:
    """[G, B, lane, 128] Q4_K/Q5_K low bits → [G, B, lane, 256] codes below 16: each 32 bytes
    hold a 64-input chunk, its first 32 inputs in the low nibbles."""
    chunks = packed.reshape(*packed.shape[:3], 4, 32)
    return np.stack([chunks & 0x0F, chunks >> 4], axis=-2).reshape(*packed.shape[:3], 256)


def _q4_k(blocks: np.ndarray, rows: int, width: int) -> np.ndarray:
    """[G, B, lane, 144] Q4_K blocks → group blocks of 1,152 bytes (csrc/gguf_rows8.h)."""
    codes = _k_nibble_codes(blocks[..., 16:144])
    pieces = [*_k_factors(blocks), _nibble_registers(codes)]
    return np.concatenate(pieces, axis=-1).reshape(rows, width)


def _q5_k(blocks: np.ndarray, rows: int, width: int) -> np.ndarray:
    """[G, B, lane, 176] Q5_K blocks → group blocks of 1,408 bytes: Q4_K's, each sub-block's
    128 bytes of nibbles followed by its fifth bits as 32 bytes of bit planes."""
    groups, count, lanes = blocks.shape[:3]
    nibbles = _nibble_registers(_k_nibble_codes(blocks[..., 48:176]))
    qh = blocks[..., 16:48]  # bit s of byte l: input 32s + l's fifth bit
    fifth = (qh[..., None, :] >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
    planes = _bit_planes(_chunk_registers(fifth.reshape(groups, count, lanes, 256)))
    per_chunk = np.concatenate([nibbles.reshape(groups, count, 8, 128), planes], axis=-1)
    pieces = [*_k_factors(blocks), per_chunk.reshape(groups, count, -1)]
    return np.concatenate(pieces, axis=-1).reshape(rows, width)


def _q6_k(blocks: np.ndarray, rows: int, width: int) -> np.ndarray:
    """[G, B, lane, 210] Q6_K blocks → group blocks of 1,680 bytes (csrc/gguf_rows8.h)."""
    groups, count = blocks.shape[:2]
    codes = np.empty((*blocks.shape[:3], 256), np.uint8)
    for half in range(2):
        low = blocks[..., 64 * half : 64 * half + 64]
        high = blocks[..., 128 + 32 * half : 160 + 32 * half]
        out = codes[..., 128 * half : 128 * half + 128]
        out[..., 0:32] = (low[..., :32] & 0x0F) | ((high & 3) << 4)
        out[..., 32:64] = (low[..., 32:] & 0x0F) | (((high >> 2) & 3) << 4)
        out[..., 64:96] = (low[..., :32] >> 4) | (((high >> 4) & 3) << 4)
        out[..., 96:128] = (low[..., 32:] >> 4) | (((high >> 6) & 3) << 4)
    scales = blocks[..., 192:208].transpose(0, 1, 3, 2).reshape(groups, count, 128)
    nibbles = _nibble_registers(codes).reshape(groups, count, 8, 128)
    chunks = codes.reshape(groups, count, 8, 8, 32).transpose(0, 1, 3, 2, 4)
    registers = _registers(chunks.reshape(groups, count * 8, 8, 32)).reshape(
        groups, count, 8, 2, 4, 32
    )  # [G, B, chunk, half, register j mod 4, 32]
    pairs = (registers >> 4) << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 1, 4, 1)
    high_pairs = pairs.sum(axis=4, dtype=np.uint8)  # [G, B, chunk, half, 32]
    per_chunk = np.concatenate([nibbles, high_pairs.reshape(groups, count, 8, 64)], axis=-1)
    pieces = [_halves(blocks[..., 208:210]), scales, per_chunk.reshape(groups, count, -1)]
    return np.concatenate(pieces, axis=-1).reshape(rows, width)


def _iq4_xs(blocks: np.ndarray, rows: int, width: int) -> np.ndarray:
    """[G, B, lane, 136] IQ4_XS blocks → group blocks of 1,088 bytes: d[8], the 6-bit scales in
    48 bytes, then per sub-block of 32 its nibble registers (csrc/gguf_rows8.h)."""
    s = np.arange(8)
    low = (blocks[..., 4 + s // 2] >> (4 * (s % 2)).astype(np.uint8)) & 0x0F  # [G, B, lane, 8]
    scales_h = blocks[..., 2].astype(np.uint16) | (blocks[..., 3].astype(np.uint16) << 8)
    high = (scales_h[..., None] >> (2 * s).astype(np.uint16)) & 3
    sc = _by_sub_block((low | (high << 4)).astype(np.uint8))  # [G, B, 64]: index 8s + lane
    pairs = (
        (sc[..., 0:16] >> 4)
        | ((sc[..., 16:32] >> 4) << 2)
        | ((sc[..., 32:48] >> 4) << 4)
        | ((sc[..., 48:64] >> 4) << 6)
    )
    qs = blocks[..., 8:136].reshape(*blocks.shape[:3], 8, 16)  # sub-block s: inputs 32s + j
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(*blocks.shape[:3], 256)
    pieces = [
        _halves(blocks[..., 0:2]),
        (sc[..., :32] & 0x0F) | ((sc[..., 32:] & 0x0F) << 4),
        pairs.astype(np.uint8),
        _nibble_registers(codes),
    ]
    return np.concatenate(pieces, axis=-1).reshape(rows, width)
