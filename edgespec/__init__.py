"""edgespec: speculative decoding on edge devices.

``edgespec.export`` turns Hugging Face causal LMs into verified ONNX bundles (needs the
``[export]`` extra); ``edgespec.Engine`` runs them with ONNX Runtime. This façade stays
light: importing it loads neither torch nor onnxruntime (``Engine`` and ``Result`` are
imported from ``edgespec.api`` on first use).
"""

from typing import Any

from edgespec._version import __version__
from edgespec.config import BudgetConfig
from edgespec.engine.pairing import PairReport, check_pair
from edgespec.errors import (
    BundleError,
    ChecksumError,
    ConfigError,
    EdgespecError,
    ExportError,
    MissingFileError,
    SchemaVersionError,
    VerificationError,
)
from edgespec.manifest import Bundle, Manifest, load_bundle

__all__ = [
    "BudgetConfig",
    "Bundle",
    "BundleError",
    "ChecksumError",
    "ConfigError",
    "EdgespecError",
    "Engine",
    "ExportError",
    "GenerationOptions",
    "Manifest",
    "MissingFileError",
    "PairReport",
    "Result",
    "SchemaVersionError",
    "VerificationError",
    "__version__",
    "check_pair",
    "load_bundle",
]


def __getattr__(name: str) -> Any:
    if name in ("Engine", "Result", "GenerationOptions"):
        from edgespec import api

        return getattr(api, name)
    raise AttributeError(f"module 'edgespec' has no attribute {name!r}")
