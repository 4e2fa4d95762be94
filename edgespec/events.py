"""Event records passed from long-running work to whoever observes it.

Producers (the exporter now; the decoder loop later) never print: they call an injected
observer with a small frozen record, and the CLI decides how to show it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ProgressEvent:
    """One step of a long operation.

    ``stage`` names the operation (``"export"``, ``"quantize"``, ``"verify"``...), ``step`` and
    ``total`` count its units of work (``total`` is 0 when unknown) and ``done`` is True on the
    last event of the stage, with ``elapsed_s`` set. ``warning`` marks something the user
    must read even when progress output is off.
    """

    stage: str
    message: str
    step: int = 0
    total: int = 0
    done: bool = False
    elapsed_s: float | None = None
    warning: bool = False


ProgressObserver = Callable[[ProgressEvent], None]


def ignore_progress(event: ProgressEvent) -> None:
    """The default observer: discards events."""
