"""Drafters propose k tokens per round; the decoder sees them only through ``Drafter``."""

from edgespec.runtime.drafters.base import Draft, Drafter

__all__ = ["Draft", "Drafter"]
