"""How many bytes a GGUF file's header says it holds, read before the file is parsed whole.

A file cut short (a download that stopped) keeps its header: the tensor table gives every
tensor's offset, type and shape, so the bytes the file must hold are known from the first
megabytes. gguf-py's reader instead builds every metadata array first (seconds and hundreds of
MB for a 151,936-token vocabulary) and then fails reshaping a tensor, in numpy's words.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

#: Bytes of each scalar metadata type (GGUF's value types; 8 is a string, 9 an array).
SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32


def needed_bytes(path: Path) -> int | None:
    """The file size the header's tensor table calls for (data start, aligned, plus the end
    of the last tensor); None where the header cannot be read this way (the full reader then
    says what is wrong)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        with path.open("rb") as stream:
            if stream.read(4) != b"GGUF":
                return None
            _version, tensors, fields = struct.unpack("<IQQ", stream.read(20))
            alignment = DEFAULT_ALIGNMENT
            for _ in range(fields):
                key = _string(stream)
                kind = _u32(stream)
                value = _skip_value(stream, kind)
                if key == "general.alignment" and value:
                    alignment = value
            end = 0
            for _ in range(tensors):
                _string(stream)
                count = _u32(stream)
                dims = struct.unpack(f"<{count}Q", stream.read(8 * count))
                kind, offset = struct.unpack("<IQ", stream.read(12))
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
                elements = 1
                for dim in dims:
                    elements *= dim
                end = max(end, offset + elements // block * size)
            start = -(-stream.tell() // alignment) * alignment
    except (struct.error, ValueError, KeyError, OverflowError, MemoryError):
        return None
    return start + end


def _u32(stream: BinaryIO) -> int:
    value: int = struct.unpack("<I", stream.read(4))[0]
    return value


def _string(stream: BinaryIO) -> bytes:
    (length,) = struct.unpack("<Q", stream.read(8))
    return stream.read(length)


def _skip_value(stream: BinaryIO, kind: int) -> int:
    """Reads past one value of ``kind``; returns it when it is an integer scalar, else 0."""
    if kind == STRING:
        _string(stream)
        return 0
    if kind == ARRAY:
        item, count = struct.unpack("<IQ", stream.read(12))
        if item in SCALAR_BYTES:
            stream.seek(SCALAR_BYTES[item] * count, 1)
        else:
            for _ in range(count):
                _skip_value(stream, item)
        return 0
    data = stream.read(SCALAR_BYTES[kind])
    return int.from_bytes(data, "little") if kind in (4, 10) else 0
