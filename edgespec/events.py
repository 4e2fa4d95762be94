"""Event records passed from long-running work to whoever observes it.

Producers (the exporter now; the decoder loop later) never print: they call an injected
observer with a small frozen record, and the CLI decides how to show it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


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


def worth_a_line(event: ProgressEvent, *, lines: int = 4) -> bool:
    """Whether a printer shows ``event``: every event without a count, and about ``lines``
    of a counted stage (the last one always), so a 30-layer graph does not print 30 lines."""
    every = -(-event.total // lines)  # rounded up: at most ``lines`` lines
    return not event.total or event.step == event.total or event.step % every == 0


def ignore_progress(event: ProgressEvent) -> None:
    """The default observer: discards events."""


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One propose → verify → commit round.

    ``k`` is the draft length asked for, ``drafted`` how many tokens the drafter proposed,
    ``n_accepted`` how many the target kept, ``committed`` the tokens emitted this round (the
    accepted ones and the target's own, cut at eos or the token budget). ``draft_s`` and
    ``verify_s`` are the time inside the drafter and the verifier; ``draft_steps`` counts draft
    model calls.
    """

    round: int
    k: int
    drafted: int
    n_accepted: int
    committed: tuple[int, ...]
    draft_s: float
    draft_steps: int
    verify_s: float


class DecodeObserver(Protocol):
    """Watches a generation. The decoder calls these in order: start, prefilled, then per
    round round_start and step, and finish with the reason (eos, max_new_tokens; the engine
    adds stop_string)."""

    def on_start(self, prompt_tokens: int) -> None: ...

    def on_prefilled(self) -> None: ...

    def on_round_start(self) -> None: ...

    def on_step(self, record: StepRecord) -> None: ...

    def on_finish(self, reason: str) -> None: ...


class KPolicy(Protocol):
    """Chooses the draft length of each round and learns from what happened (fixed k, auto k,
    a server's cap, a budget's cap: every one of them is a ``KPolicy``)."""

    def next_k(self) -> int: ...

    def observe(self, record: StepRecord) -> None: ...
