"""The rows-of-8 layout of GGUF's block types (Q4_0 ... Q8_0, Q4_K, Q5_K, Q6_K) that
the GGUF kernels read fastest: the file's blocks with their bits moved, none added or dropped, so a
bundle stays the file's size. ``csrc/gguf_rows8.c`` describes the layout and reads it; this
module writes it at import.

Outputs 8g .. 8g + 7 form group g; each block index b of the group holds, in order, the 8
outputs' float16 d, their float16 m (Q4_1, Q5_1), 32 bytes of fifth-bit planes (Q5_0, Q5_1)
and the codes as registers of 32 bytes whose byte 4i + t is output i's input 4j + t of the
block (register j; the 4- and 5-bit types keep registers j and j + 4 in one byte's nibbles).
The K-quants hold 8 super-blocks per group block: their factors per sub-block as [sub-block,
output] arrays, the codes of every 32 inputs as those registers.
"""

from __future__ import annotations

import numpy as np

ROWS8_OFFSET = 1024  # the operators' ggml_type attribute: the legacy type's id + this
ROWS8_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})

_BLOCK_BYTES = {
    "Q4_0": 18,
    "Q4_1": 20,
    "Q5_0": 22,
    "Q5_1": 24,
    "Q8_0": 34,
    "Q4_K": 144,
    "Q5_K": 176,
    "Q6_K": 210,
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
    if kind == "Q4_K":
        return _q4_k(blocks, rows, width)
    if kind == "Q5_K":
        return _q5_k(blocks, rows, width)
    if kind == "Q6_K":
        return _q6_k(blocks, rows, width)
    minimum = kind in ("Q4_1", "Q5_1")
    parts = [blocks[..., 0:2]]
    if minimum:
        parts.append(blocks[..., 2:4])
    head = [part.reshape(*blocks.shape[:2], 16) for part in parts]
    if kind == "Q8_0":
        codes = blocks[..., 2:34]  # [G, B, lane, 32] signed codes as bytes
        return _assemble(head, [_registers(codes)], rows, width)
    five = kind in ("Q5_0", "Q5_1")
    qs_at = {"Q4_0": 2, "Q4_1": 4, "Q5_0": 6, "Q5_1": 8}[kind]
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


def _k_factors(blocks: np.ndarray) -> list[np.ndarray]:
    """[G, B, lane, bytes] Q4_K or Q5_K blocks → their group blocks' first 128 bytes: d[8],
    dmin[8] and the 6-bit scales and minimums in 96 bytes (see csrc/gguf_rows8.c)."""
    factors = blocks[..., 4:16].astype(np.uint16)  # [G, B, lane, 12]: scales[12]
    scale = np.empty((*blocks.shape[:3], 8), np.uint8)
    minimum = np.empty_like(scale)
    scale[..., :4] = factors[..., 0:4] & 63
    minimum[..., :4] = factors[..., 4:8] & 63
    scale[..., 4:] = (factors[..., 8:12] & 0x0F) | ((factors[..., 0:4] >> 6) << 4)
    minimum[..., 4:] = (factors[..., 8:12] >> 4) | ((factors[..., 4:8] >> 6) << 4)
    sc = scale.transpose(0, 1, 3, 2).reshape(*blocks.shape[:2], 64)  # index 8s + lane
    mn = minimum.transpose(0, 1, 3, 2).reshape(*blocks.shape[:2], 64)
    high = (
        (sc[..., :32] >> 4)
        | ((sc[..., 32:] >> 4) << 2)
        | ((mn[..., :32] >> 4) << 4)
        | ((mn[..., 32:] >> 4) << 6)
    )
    return [
        _halves(blocks[..., 0:2]),
        _halves(blocks[..., 2:4]),
        (sc[..., :32] & 0x0F) | ((sc[..., 32:] & 0x0F) << 4),
        (mn[..., :32] & 0x0F) | ((mn[..., 32:] & 0x0F) << 4),
        high.astype(np.uint8),
    ]


def _k_nibble_codes(packed: np.ndarray) -> np.ndarray:
    """[G, B, lane, 128] Q4_K/Q5_K low bits → [G, B, lane, 256] codes below 16: each 32 bytes
    hold a 64-input chunk, its first 32 inputs in the low nibbles."""
    chunks = packed.reshape(*packed.shape[:3], 4, 32)
    return np.stack([chunks & 0x0F, chunks >> 4], axis=-2).reshape(*packed.shape[:3], 256)


def _q4_k(blocks: np.ndarray, rows: int, width: int) -> np.ndarray:
    """[G, B, lane, 144] Q4_K blocks → group blocks of 1,152 bytes (see csrc/gguf_rows8.c)."""
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
    # fifth: [G, B, lane, sub-block s, 32]
    chunks = fifth.transpose(0, 1, 3, 2, 4).reshape(groups, count * 8, lanes, 32)
    planes = _registers(chunks)  # [G, B * 8, register j, 32]
    weights = (1 << np.arange(8, dtype=np.uint8)).reshape(1, 1, 8, 1)
    high = (planes * weights).sum(axis=2, dtype=np.uint8).reshape(groups, count, 8, 32)
    per_chunk = np.concatenate([nibbles.reshape(groups, count, 8, 128), high], axis=-1)
    pieces = [*_k_factors(blocks), per_chunk.reshape(groups, count, -1)]
    return np.concatenate(pieces, axis=-1).reshape(rows, width)


def _q6_k(blocks: np.ndarray, rows: int, width: int) -> np.ndarray:
    """[G, B, lane, 210] Q6_K blocks → group blocks of 1,680 bytes (see csrc/gguf_rows8.c)."""
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
