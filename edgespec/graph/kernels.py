"""edgespec's GGUF kernels: an ONNX Runtime custom-operator library built from ``csrc/`` at
install (``edgespec.graph._gguf_kernels``), which multiplies by llama.cpp's quantized blocks
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants Q2_K ... Q6_K, IQ4_NL and IQ4_XS) as the file
stores them (``GgufMatMul``) and looks rows of them up (``GgufGather``).

Why it exists: ONNX Runtime's own 4-bit kernel rounds one row differently from several, so a
graph of its operators must pad one-token steps to keep speculative decoding exact, and it
has no form for the Q4_K minimum or 5- and 6-bit codes. These kernels compute each output from its
own row of activations only (one-token steps need no padding), read the file's blocks (the
bundle is the file's size) and unpack each block once for all the rows of a verify pass.

The library is optional: a bundle whose graph uses it says so in its manifest
(``quantization.op_types``), and every session of it registers the library; where the library
did not build, GGUF files import into graphs of ONNX Runtime's operators instead.
``EDGESPEC_GGUF_KERNELS`` names another build of the library, or ``off`` to import without it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from edgespec.errors import BundleError

GGUF_DOMAIN = "edgespec.gguf"
GGUF_MATMUL = "GgufMatMul"
GGUF_GATHER = "GgufGather"
#: Attention over an in-place KV cache (``csrc/cache_attention.c``): the same bits for a row
#: at any pass width, a sliding window's positions outside it never read.
CACHE_ATTENTION = "CacheAttention"
#: The same over float16 caches (past and present), as llama.cpp keeps its cache.
CACHE_ATTENTION_HALF = "CacheAttentionHalf"
ATTENTION_KERNELS = (CACHE_ATTENTION, CACHE_ATTENTION_HALF)


def attends_on_kernel(op_types: tuple[str, ...] | list[str]) -> bool:
    """Whether a graph's attention runs on edgespec's CacheAttention (either cache type)."""
    return any(op in op_types for op in ATTENTION_KERNELS)


class KernelType(NamedTuple):
    """A GGUF block type the kernels read."""

    ggml_id: int  # ggml's type id: the operators' ggml_type attribute
    bits: int  # bits per weight of its codes (the manifest's record)
    block: int  # inputs per block: a weight's width must be a multiple of it


GGUF_KERNEL_TYPES = {
    "Q4_0": KernelType(ggml_id=2, bits=4, block=32),
    "Q4_1": KernelType(ggml_id=3, bits=4, block=32),
    "Q5_0": KernelType(ggml_id=6, bits=5, block=32),
    "Q5_1": KernelType(ggml_id=7, bits=5, block=32),
    "Q8_0": KernelType(ggml_id=8, bits=8, block=32),
    "Q2_K": KernelType(ggml_id=10, bits=2, block=256),
    "Q3_K": KernelType(ggml_id=11, bits=3, block=256),
    "Q4_K": KernelType(ggml_id=12, bits=4, block=256),
    "Q5_K": KernelType(ggml_id=13, bits=5, block=256),
    "Q6_K": KernelType(ggml_id=14, bits=6, block=256),
    "IQ4_NL": KernelType(ggml_id=20, bits=4, block=32),
    "IQ4_XS": KernelType(ggml_id=23, bits=4, block=256),
}
ENVIRONMENT = "EDGESPEC_GGUF_KERNELS"


# What --kernels auto runs on the kernels: every type they read, measured faster than ONNX
# Runtime's MatMulNBits on each (no minimum term, 5- and 6-bit codes read as stored, no padded
# steps; the legacy types in the rows-of-8 layout of csrc/gguf_rows8.h; the figures:
# docs/architecture.md, the GGUF kernels). --kernels gguf is the same set today; --kernels
# mlas runs none of them.
AUTO_KERNEL_TYPES = frozenset(GGUF_KERNEL_TYPES)


def kernel_types(choice: str) -> frozenset[str]:
    """The GGUF block types an import runs on the kernels: ``choice`` is ``--kernels``."""
    if choice == "mlas":
        return frozenset()
    return AUTO_KERNEL_TYPES if choice == "auto" else frozenset(GGUF_KERNEL_TYPES)


@lru_cache(maxsize=1)
def gguf_kernel_library() -> Path | None:
    """The built library, or None when it did not build (or ``EDGESPEC_GGUF_KERNELS=off``)."""
    chosen = os.environ.get(ENVIRONMENT, "").strip()
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen) if Path(chosen).is_file() else None
    here = Path(__file__).parent
    for pattern in ("_gguf_kernels*.so", "_gguf_kernels*.pyd", "_gguf_kernels*.dylib"):
        found = sorted(here.glob(pattern))
        if found:
            return found[0]
    return None


@lru_cache(maxsize=1)
def gguf_kernel_build() -> str:
    """Which build of the library this process loads (the first 12 hex digits of its file's
    sha256), or "none": what kept measurements of the kernels' speed belong to."""
    library = gguf_kernel_library()
    if library is None:
        return "none"
    try:
        return hashlib.sha256(library.read_bytes()).hexdigest()[:12]
    except OSError:
        return "none"


@lru_cache(maxsize=1)
def gguf_kernel_path() -> str:
    """Which code path the library runs on this CPU ("avx2", "neon-dotprod", "neon",
    "portable"), or "unavailable"."""
    library = gguf_kernel_library()
    if library is None:
        return "unavailable"
    try:
        handle = ctypes.CDLL(str(library))
        handle.edgespec_gguf_kernel_path.restype = ctypes.c_char_p
        return str(handle.edgespec_gguf_kernel_path().decode())
    except (OSError, AttributeError):
        return "unavailable"


def cuda_available() -> bool:
    """Whether ONNX Runtime offers CUDA here (the kernels are CPU code: a GGUF imported for a
    GPU runs on ONNX Runtime's MatMulNBits instead)."""
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def uses_gguf_kernels(op_types: tuple[str, ...] | list[str]) -> bool:
    return GGUF_MATMUL in op_types or GGUF_GATHER in op_types or attends_on_kernel(op_types)


def register_gguf_kernels(options: Any, *, required: bool) -> bool:
    """Registers the library with ``options`` (an ``onnxruntime.SessionOptions``) when it is
    built; ``required``: the graph to load uses it, so a missing library is an error naming
    the fix instead of ONNX Runtime's unknown-operator message."""
    library = gguf_kernel_library()
    if library is None:
        if required:
            raise BundleError(
                "this bundle's graph runs edgespec's GGUF kernels, which are not built in this "
                "install",
                fix="reinstall edgespec where a C compiler is available (pip install "
                "--force-reinstall edgespec), or re-import the GGUF file here (edgespec "
                "export FILE.gguf --out DIR --kernels mlas) to get a graph of ONNX Runtime's "
                "own operators",
            )
        return False
    options.register_custom_ops_library(str(library))
    return True
