"""One generation: run the decoder, turn committed tokens into streamed text (stop strings
included), and gather the result and its stats."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.engine.remote import RemoteRun
from edgespec.errors import RemoteError
from edgespec.events import KPolicy
from edgespec.runtime.decoder import decode
from edgespec.runtime.drafters.base import Drafter
from edgespec.runtime.stats import StatsCollector
from edgespec.runtime.text import StopMatcher, TextStream
from edgespec.runtime.verifiers.base import Verifier
from edgespec.telemetry.watch import Watch

T = TypeVar("T")
#: Runs one round's model work and returns its result (a server's scheduler); see Generation.
ModelTurn = Callable[[Callable[[], T]], T]


@dataclass(frozen=True, kw_only=True)
class Delta:
    """A piece of streamed text; ``drafted`` when it came from accepted draft tokens."""

    text: str
    drafted: bool


@dataclass(frozen=True, kw_only=True)
class GenerationStats:
    """What one generation did and cost. Times are wall-clock milliseconds; ``alpha`` is the
    per-token acceptance rate (accepted / tested draft tokens: every accepted one and the
    first rejected one of each round); ``decode_ms`` sums the rounds, prefill excluded."""

    new_tokens: int
    prompt_tokens: int
    rounds: int
    drafted: int
    accepted: int
    tested: int
    alpha: float | None
    mean_accepted: float
    acceptance_by_position: list[float]
    draft_ms: float
    draft_steps: int
    verify_ms: float
    overhead_ms: float
    overhead_ms_per_round: float
    prefill_ms: float
    time_to_first_token_ms: float | None
    decode_ms: float
    tokens_per_s: float | None
    k_values: list[int]
    k_counts: dict[str, int]
    finish_reason: str
    #: Rounds by outcome, "drafted,accepted,model" → count (model: 1 when the draft model ran).
    round_outcomes: dict[str, int] = field(default_factory=dict)
    #: What really ran each model (ONNX Runtime falls back silently).
    providers: dict[str, list[str]] = field(default_factory=dict)
    #: CPU time, and energy when a source measured it (``energy_source`` says which, or why not).
    cpu_s: float | None = None
    cpu_s_per_token: float | None = None
    energy_j: float | None = None
    energy_j_net: float | None = None
    energy_j_per_token: float | None = None
    energy_source: dict[str, Any] = field(default_factory=dict)
    #: RSS now and at peak, and the admission that sized the context.
    memory: dict[str, Any] = field(default_factory=dict)
    #: The budget policy's mode and decisions (None without a budget).
    budget: dict[str, Any] | None = None
    #: Remote verification: traffic, and what happened when the server stayed away.
    remote: dict[str, Any] | None = None
    fell_back: str | None = None
    lossy: bool = False
    remote_rounds: int | None = None
    remote_down: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class Result:
    """A finished generation: the new ``text`` and ``tokens`` (prompt excluded) and ``stats``.

    ``error`` is set (and ``finish_reason`` is "error") when the verification server became
    unreachable under ``fallback="fail"``: ``text`` is then what was verified before that.
    """

    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    stats: GenerationStats
    error: str | None = None

    def to_json(self) -> str:
        data = {"text": self.text, "tokens": list(self.tokens), "stats": self.stats.to_dict()}
        return json.dumps(data if self.error is None else {**data, "error": self.error})


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Everything one generation runs with, assembled and validated before it starts."""

    prompt_ids: list[int]
    drafter: Drafter
    verifier: Verifier
    k_policy: KPolicy
    sampling: SamplingConfig
    max_new_tokens: int
    eos_ids: frozenset[int]
    stop: Sequence[str]
    watch: Watch
    remote: RemoteRun | None
    providers: dict[str, list[str]]
    #: The remote target was unreachable at load: why, and whether the fallback is lossy.
    fell_back: str | None = None
    lossy: bool = False


class TextEmitter:
    """Turns committed tokens into text pieces, token by token, so that a stop string ends the
    text at the token that completed it: no token after it is kept."""

    def __init__(self, tokenizer: Any, stop: Sequence[str]) -> None:
        self.text = TextStream(tokenizer)
        self.stop_matcher = StopMatcher(stop) if stop else None
        self.tokens: list[int] = []
        self.shown: list[str] = []
        self.stopped = False

    def push(self, committed: Sequence[int], n_accepted: int) -> Iterator[Delta]:
        """The accepted draft tokens' text (``drafted``), then the target's own token's."""
        for drafted, part in ((True, committed[:n_accepted]), (False, committed[n_accepted:])):
            pieces: list[str] = []
            for token in part:
                self.tokens.append(token)
                piece = self.text.push([token])
                if self.stop_matcher is not None and piece:
                    outcome = self.stop_matcher.feed(piece)
                    piece, self.stopped = outcome.emit, outcome.stopped
                pieces.append(piece)
                if self.stopped:
                    break
            yield from self._show("".join(pieces), drafted=drafted)
            if self.stopped:
                return

    def finish(self) -> Iterator[Delta]:
        """The text held back for incomplete characters or a possible stop string."""
        if self.stopped:
            return
        tail = self.text.finish()
        if self.stop_matcher is not None:
            outcome = self.stop_matcher.feed(tail)
            self.stopped = outcome.stopped
            tail = outcome.emit if outcome.stopped else outcome.emit + self.stop_matcher.flush()
        yield from self._show(tail, drafted=False)

    def _show(self, text: str, *, drafted: bool) -> Iterator[Delta]:
        if text:
            self.shown.append(text)
            yield Delta(text=text, drafted=drafted)


class Generation:
    """Iterates over :class:`Delta` pieces as tokens are committed; ``result`` once done.

    ``model_turn`` runs each round's model work (prefill, drafting, verification): a server
    passes its scheduler, so that only the model passes wait for and hold its turn, while
    detokenization and stop strings run outside it. None: the round runs as it is.
    """

    def __init__(self, plan: Plan, tokenizer: Any, *, model_turn: ModelTurn | None = None) -> None:
        self.plan = plan
        self.result: Result | None = None
        self._model_turn = model_turn
        self._pieces = self._run(tokenizer)

    def __iter__(self) -> Iterator[Delta]:
        return self._pieces

    def _run(self, tokenizer: Any) -> Iterator[Delta]:
        plan = self.plan
        stats = StatsCollector()
        emitter = TextEmitter(tokenizer, plan.stop)
        plan.watch.start()
        rounds = decode(
            plan.prompt_ids,
            drafter=plan.drafter,
            verifier=plan.verifier,
            k_policy=plan.watch.k_policy,
            sampling=plan.sampling,
            rng=np.random.default_rng(plan.sampling.seed),
            max_new_tokens=plan.max_new_tokens,
            eos_ids=plan.eos_ids,
            observers=(stats,),
        )
        error: str | None = None
        turns = rounds if self._model_turn is None else _in_turns(rounds, self._model_turn)
        try:
            for committed in turns:
                yield from emitter.push(committed, stats.records[-1].n_accepted)
                if emitter.stopped:
                    turns.close()
                    break
        except RemoteError as failure:
            # fallback "fail", or an engine that cannot verify on: what was verified so far,
            # and the error.
            error = str(failure)
            stats.on_finish("error")
        yield from emitter.finish()
        if emitter.stopped:
            stats.on_finish("stop_string")
        plan.verifier.close()
        plan.drafter.close()
        self.result = self._result(emitter, stats, error)

    def _result(self, emitter: TextEmitter, stats: StatsCollector, error: str | None) -> Result:
        plan = self.plan
        decoded = stats.as_dict()
        extra: dict[str, Any] = plan.watch.stats(decoded["new_tokens"])
        if plan.fell_back is not None:
            extra.update(fell_back=plan.fell_back, lossy=plan.lossy)
        if plan.remote is not None:
            extra.update(plan.remote.stats(len(emitter.tokens)))
        return Result(
            text="".join(emitter.shown),
            tokens=tuple(emitter.tokens),
            finish_reason=stats.finish_reason,
            stats=GenerationStats(**decoded, providers=plan.providers, **extra),
            error=error,
        )


def _in_turns(
    rounds: Generator[tuple[int, ...], None, None], model_turn: ModelTurn
) -> Generator[tuple[int, ...], None, None]:
    """``rounds``, each advanced inside one ``model_turn``; closing this closes them."""
    try:
        while True:
            committed = model_turn(lambda: next(rounds, None))
            if committed is None:
                return
            yield committed
    finally:
        rounds.close()
