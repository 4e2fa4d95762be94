"""edgespec: speculative decoding on edge devices.

``edgespec.export`` turns Hugging Face causal LMs into verified ONNX bundles (needs the
``[export]`` extra); ``edgespec.runtime`` runs them with ONNX Runtime. This façade stays
light: importing it loads neither torch nor onnxruntime.
"""

from edgespec._version import __version__
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
from edgespec.pairing import PairReport, check_pair

__all__ = [
    "Bundle",
    "BundleError",
    "ChecksumError",
    "ConfigError",
    "EdgespecError",
    "ExportError",
    "Manifest",
    "MissingFileError",
    "PairReport",
    "SchemaVersionError",
    "VerificationError",
    "__version__",
    "check_pair",
    "load_bundle",
]
