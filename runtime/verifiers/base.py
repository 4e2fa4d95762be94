"""The verifier protocol and its answer (defined with the rest of a round's contract in
:mod:`edgespec.runtime.round`)."""

from edgespec.runtime.round import Verdict, Verifier

__all__ = ["Verdict", "Verifier"]
