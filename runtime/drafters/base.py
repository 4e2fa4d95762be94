"""The drafter protocol and the record a proposal travels in (defined with the rest of a
round's contract in :mod:`edgespec.runtime.round`)."""

from edgespec.runtime.round import Draft, Drafter

__all__ = ["Draft", "Drafter"]
