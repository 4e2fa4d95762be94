"""One exception tree for edgespec.

Every error carries the problem and, where there is one, the fix, so that the CLI can print a
single line that tells the user what to do::

    EdgespecError
    ├── ConfigError              an option value is invalid (unknown --quant, bad block size)
    │   └── ContextLimitError    the prompt plus the requested tokens do not fit the context
    ├── IncompatiblePairError    the draft's tokenizer cannot serve the target's
    ├── OutputExistsError        the output directory exists and --force was not given
    ├── ModelSourceError         a model path or hub id cannot be read
    ├── UnsupportedModelError    not a decoder-only causal LM, or an architecture the exporter lacks
    ├── MissingDependencyError   an optional extra ([export], [gpu]) is not installed
    ├── BudgetError              a pair does not fit the memory budget
    ├── ExportError              a step of the export failed
    │   └── VerificationError    the exported graph disagrees with PyTorch or is not batch invariant
    ├── BundleError              a bundle on disk is unusable
    │   ├── SchemaVersionError   manifest written by an unknown schema version
    │   ├── MissingFileError     a file listed in the manifest is absent
    │   └── ChecksumError        a file's size or sha256 differs from the manifest
    ├── ProtocolError            a protocol v1 message is malformed or out of range (HTTP 422)
    │   ├── UnknownSessionError  no such verification session (HTTP 404)
    │   └── PositionConflictError    a round's position lies beyond the session (HTTP 409)
    └── RemoteError              the verification server refused a request
        ├── RemoteUnavailableError   the server stayed unreachable after the retries
        └── OpenAIMismatchError  an OpenAI-compatible engine's tokens cannot be matched to ours
"""

from __future__ import annotations


def install_fix(extra: str) -> str:
    """The fix for a missing extra, as a command that works today (edgespec installs from a
    checkout; the package-index form applies once it is published)."""
    return (
        f"install the [{extra}] extra: pip install '.[{extra}]' in the edgespec checkout "
        f"(pip install 'edgespec[{extra}]' once edgespec is on the package index)"
    )


UPGRADE_FIX = (
    "upgrade edgespec: git pull and pip install . in the edgespec checkout "
    "(pip install -U edgespec once it is on the package index)"
)


class EdgespecError(Exception):
    """Base class. ``str(error)`` is one line: the problem, then the fix."""

    def __init__(self, problem: str, *, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}; {fix}")


class ConfigError(EdgespecError):
    """An option or configuration value is invalid."""


class ContextLimitError(ConfigError):
    """The prompt plus the requested tokens do not fit the context."""


class IncompatiblePairError(EdgespecError):
    """The draft's tokenizer cannot serve the target's."""


class OutputExistsError(EdgespecError):
    """The output directory already exists."""


class ModelSourceError(EdgespecError):
    """The model path or hub id cannot be read."""


class UnsupportedModelError(EdgespecError):
    """The model is not something edgespec can export."""


class MissingDependencyError(EdgespecError):
    """An optional extra is needed for this command."""


class BudgetError(EdgespecError):
    """The pair's memory estimate exceeds the memory budget."""


class ExportError(EdgespecError):
    """A step of the export failed."""


class VerificationError(ExportError):
    """The exported graph failed a check against PyTorch or the batch-invariance check."""


class BundleError(EdgespecError):
    """A bundle directory is unusable."""


class SchemaVersionError(BundleError):
    """The manifest's schema version is not one this edgespec reads."""


class MissingFileError(BundleError):
    """A file the manifest lists is missing."""


class ChecksumError(BundleError):
    """A file's size or checksum differs from the manifest."""


class RemoteError(EdgespecError):
    """The verification server answered a request with an error."""


class RemoteUnavailableError(RemoteError):
    """The verification server stayed unreachable (or kept failing) after every retry."""


class OpenAIMismatchError(RemoteError):
    """An OpenAI-compatible engine's tokens or log-probabilities cannot be matched to ours:
    verifying on would not be exact."""


class ProtocolError(EdgespecError):
    """A protocol message is malformed or out of range."""


class UnknownSessionError(ProtocolError):
    """No such session: never opened, closed, expired or evicted (HTTP 404)."""


class PositionConflictError(ProtocolError):
    """The round's position lies beyond what the session holds (HTTP 409: re-open it)."""
