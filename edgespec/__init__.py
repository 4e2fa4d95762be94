"""edgespec: speculative decoding on edge devices.

``edgespec.export`` turns Hugging Face causal LMs into verified ONNX bundles (needs the
``[export]`` extra); ``edgespec.Engine`` runs them with ONNX Runtime. This façade stays
light: importing it loads neither torch nor onnxruntime (``Engine`` and ``Result`` are
imported from ``edgespec.api`` on first use).
"""

from pathlib import Path
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

# In a source checkout, runtime/ and export/ sit beside this package and are mapped into it at
# install time (pyproject's package-dir). Searching the checkout root too makes the source tree
# import as the installed package does (``python -m edgespec`` from the checkout root).
_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "runtime" / "decoder.py").is_file() and (_CHECKOUT / "pyproject.toml").is_file():
    __path__.append(str(_CHECKOUT))

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
