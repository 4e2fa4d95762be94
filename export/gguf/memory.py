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
from edgespec.export.child_process import run_in_child
from edgespec.graph.paths import GraphSizes
from edgespec.manifest import GraphSpec

#: The part of an import's peak that does not grow with the weights: the tokenizer's arrays
#: while it is built (the largest for Gemma 3's 262,144 tokens: docs/benchmarks/export.md,
#: "Importing a GGUF: memory and bundle size"), the reference forward's float64 logits, the
#: llama.cpp check's own buffers.
IMPORT_BASE_BYTES = 1000 << 20
#: Times the file, by what the graph's products run on. On edgespec's GGUF kernels the graph
#: reads the file's blocks as stored, so the checks' session holds about the file once
#: more while the file's own pages are released. On ONNX Runtime's MatMulNBits (``--kernels
#: mlas``, or where the kernels did not build) the session packs a second copy of every
#: 4-bit weight and stores 5- and 6-bit blocks as 8-bit. Dequantized (``--quant fp32``) the
#: bundle holds every weight in 32 bits, several times the file (same section), and the
#: session holds it again.
IMPORT_PEAK_PER_FILE_BYTE = {"kernels": 1.1, "matmul-nbits": 3.0, "float32": 12.0}
SKIP_MEMORY_CHECK_ENV = "EDGESPEC_SKIP_MEMORY_CHECK"


def import_peak_bytes(file_bytes: int, *, path: str = "kernels") -> int:
    """The import's expected peak memory, its llama.cpp check's child process counted, for a
    GGUF of ``file_bytes`` whose graph runs on ``path`` (``kernels``, ``matmul-nbits`` or
    ``float32``). The factors and the base cover the peaks measured over the file for every
    catalog model and a 7B-shaped file (benchmarks/import_memory.py: docs/benchmarks/export.md,
    "Importing a GGUF: memory and bundle size")."""
    factor = IMPORT_PEAK_PER_FILE_BYTE[path]
    return int(factor * file_bytes) + IMPORT_BASE_BYTES


def check_import_memory(path: Path, *, graph_path: str = "kernels") -> None:
    """Refuses, before anything is written, an import that would not fit in the memory
    available now; ``EDGESPEC_SKIP_MEMORY_CHECK=1`` tries anyway."""
    if os.environ.get(SKIP_MEMORY_CHECK_ENV) == "1":
        return
    needed = import_peak_bytes(path.stat().st_size, path=graph_path)
    available = int(psutil.virtual_memory().available)
    if needed > available:
        raise ExportError(
            f"importing {path.name} ({path.stat().st_size / 1e9:.2f} GB) needs about "
            f"{needed / 1e9:.1f} GB of memory and {available / 1e9:.1f} GB is available",
            fix="close other programs or import on a machine with more memory (the bundle runs "
            f"where it fits), or set {SKIP_MEMORY_CHECK_ENV}=1 to try anyway",
        )


def process_tree_memory(process: psutil.Process) -> tuple[int, int]:
    """RSS and its file-backed part (0 where the platform does not say), summed over
    ``process`` and its children: what an import holds, its llama.cpp check's child process
    counted. Raises ``psutil.NoSuchProcess`` once ``process`` itself has ended."""
    rss = shared = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            info = member.memory_info()
        except psutil.NoSuchProcess:
            if member is process:
                raise
            continue  # a child that ended between the listing and the reading
        rss, shared = rss + info.rss, shared + getattr(info, "shared", 0)
    return rss, shared


def release_freed_memory() -> None:
    """Collects what an import's stage left unreferenced and hands the freed heap back to the
    system (glibc keeps freed small blocks otherwise), between stages."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


#: Tokens of the pass that reads every weight once before the resident size is taken.
RESIDENT_PASS_TOKENS = 8


def measure_resident_bytes(graph_path: Path, graph: GraphSpec, sizes: GraphSizes) -> int:
    """What a session of the graph keeps resident once a pass has read every weight: its
    weights as ONNX Runtime holds them (MatMulNBits packs a copy of its weights, and keeps or
    drops the stored ones by how they are shared), but not an embedding table's rows that
    no token looked up. Measured in a fresh child process (0 where it could not run), so
    that the import's own mapped file and arrays are not counted."""
    child = run_in_child(_resident_child, str(graph_path), graph, sizes)
    return int(child.value) if child.exitcode == 0 else 0


def _resident_child(graph_path: str, graph: GraphSpec, sizes: GraphSizes) -> int:
    import onnxruntime  # noqa: F401 (loaded before the first reading: not the session's)

    from edgespec.graph.driver import GraphDriver, check_session

    process = psutil.Process()
    before = process.memory_info().rss
    # Bound, as the runtime runs it: the plain path would allocate whole present buffers.
    driver = GraphDriver(check_session(Path(graph_path)), graph, sizes, bound=True)
    driver.forward([0] * RESIDENT_PASS_TOKENS, driver.new_cache(), last_only=True)
    return int(process.memory_info().rss - before)
