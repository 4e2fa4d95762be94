"""The built-in draft/target pair shipped in the package data (``edgespec/data/default_pair``).

Built by ``tools/build_default_pair.py``: a ~19M-parameter Llama target and a ~2.6M draft
distilled from it, both trained on Python standard-library source and exported by
``edgespec export``. Every command that takes ``--target`` falls back to this pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import BundleError

BUILTIN_PAIR_DIR = Path(__file__).resolve().parent.parent / "data" / "default_pair"


@dataclass(frozen=True, kw_only=True)
class BuiltinPair:
    """Bundle directories of the built-in pair."""

    target: Path
    draft: Path


def builtin_pair(root: Path = BUILTIN_PAIR_DIR) -> BuiltinPair:
    """The built-in pair's bundle directories; raises when this install lacks them."""
    pair = BuiltinPair(target=root / "target", draft=root / "draft")
    for path in (pair.target, pair.draft):
        if not (path / "manifest.json").is_file():
            raise BundleError(
                f"the built-in pair is missing from this install ({path} has no manifest.json)",
                fix="reinstall edgespec from a wheel or a full checkout, or pass --target DIR",
            )
    return pair
