"""The GGUF tier's shared inputs: tiny GGUF files of several weight types and architectures
and their bundles (fixtures in ``tests/export/conftest.py``)."""

from __future__ import annotations

from edgespec.graph.kernels import gguf_kernel_library

PROMPTS = ("def add(a, b):\n    return", "import os\nimport sys\n\n", "class Point:\n    def")
FORMATS = ("Q4_0", "Q4_1", "Q8_0")
# Imported onto ONNX Runtime's MatMulNBits (--kernels mlas): Q4_1's offset term and padded
# steps stay tested where the GGUF kernels are built; the rest import as the default does.
ON_MATMUL_NBITS = ("Q4_1", "qwen2-Q4_1")


def padded_steps(kind: str) -> bool | None:
    """Whether the bundle's graph pads one-token steps to two rows: MatMulNBits graphs do,
    float graphs do not, and on the GGUF kernels the import's exactness check decides (None):
    their products and their attention give a row the same bits in any pass."""
    if kind in ("F32", "Q4_1-as-fp32"):
        return False
    if gguf_kernel_library() is None or kind in ON_MATMUL_NBITS:
        return True
    return None
