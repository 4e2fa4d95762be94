"""Verifiers check a draft with one target pass; the decoder sees them only through ``Verifier``."""

from edgespec.runtime.verifiers.base import Verdict, Verifier

__all__ = ["Verdict", "Verifier"]
