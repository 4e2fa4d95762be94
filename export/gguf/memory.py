"""The GGUF import's memory: its expected peak, and the refusal of an import that would not
fit (before anything is written)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
from pathlib import Path

import psutil

from edgespec.errors import ExportError

#: The import's peak memory: this many times the file, plus a fixed part (see
#: :func:`import_peak_bytes`).
IMPORT_PEAK_PER_FILE_BYTE = 3.0
IMPORT_BASE_BYTES = 300 << 20
SKIP_MEMORY_CHECK_ENV = "EDGESPEC_SKIP_MEMORY_CHECK"


def import_peak_bytes(file_bytes: int) -> int:
    """The import's expected peak memory for a GGUF of ``file_bytes``: the checks' ONNX Runtime
    session (its initializers and MatMulNBits' packed copies: 1.1x the bundle for 8-bit
    codes, 2x for 4-bit ones; the bundle is up to 1.3x the file) beside the reference
    forward's float64 logits; the tokenizer's arrays are dropped once it is built, the file's
    pages are released as they are read, and llama.cpp's check runs after the session is
    closed (measured peaks: 2.74x the file for Qwen2.5-Coder 0.5B Q4_K_M, 2.93x for the
    1.5B, benchmarks/import_memory.py)."""
    return int(IMPORT_PEAK_PER_FILE_BYTE * file_bytes) + IMPORT_BASE_BYTES


def check_import_memory(path: Path) -> None:
    """Refuses, before anything is written, an import that would not fit in the memory
    available now; ``EDGESPEC_SKIP_MEMORY_CHECK=1`` tries anyway."""
    if os.environ.get(SKIP_MEMORY_CHECK_ENV) == "1":
        return
    needed = import_peak_bytes(path.stat().st_size)
    available = int(psutil.virtual_memory().available)
    if needed > available:
        raise ExportError(
            f"importing {path.name} ({path.stat().st_size / 1e9:.2f} GB) needs about "
            f"{needed / 1e9:.1f} GB of memory and {available / 1e9:.1f} GB is available",
            fix="close other programs or import on a machine with more memory (the bundle runs "
            f"where it fits), or set {SKIP_MEMORY_CHECK_ENV}=1 to try anyway",
        )


def release_freed_memory() -> None:
    """Collects what an import's stage left unreferenced and hands the freed heap back to the
    system (glibc keeps freed small blocks otherwise), between stages."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)
