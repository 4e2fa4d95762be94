"""What a remote target is, whatever engine serves it: the protocol every remote target
implements (what it tells at connection, its chat format, the verifier it builds), the one an
OpenAI-compatible engine implements behind :class:`~edgespec.runtime.remote.openai.OpenAITarget`,
and what a remote verifier reports besides its verdicts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from edgespec.protocol.server_info import ChatFormat, ServerInfo
from edgespec.runtime.remote.pieces import TokenPieces
from edgespec.runtime.remote.transport import Peer, Traffic
from edgespec.runtime.verifiers.base import Verifier


@dataclass(frozen=True, kw_only=True)
class EngineWork:
    """What the engine computed for one generation: the prompt tokens of each round (the first
    round computes the history in each slot it uses, once; a later round what it adds and
    what its slots missed) and the engine's own milliseconds per round (empty when it does
    not report them)."""

    round_tokens: tuple[int, ...]
    round_server_ms: tuple[float, ...]


class MeteredVerifier(Verifier, Protocol):
    """A remote verifier: its traffic, the draft length its server suggests, and what the
    engine computed (None where the peer does not say per round)."""

    suggested_k: int

    def traffic(self) -> Traffic: ...

    def work(self) -> EngineWork | None: ...


class RemoteTarget(Peer, Protocol):
    """A target verified over HTTP (``edgespec serve``, or a serving engine): its protocol's
    registry name (``api``), where it is, whether it verifies sampled drafts, what it tells at
    connection (:meth:`info`), its chat format, and the verifier of one generation on it.
    ``pieces`` builds the draft tokenizer's token texts, for engines that need them."""

    api: str
    health_path: str
    timeout_s: float

    @property
    def greedy_only(self) -> bool: ...

    def info(self) -> ServerInfo: ...

    def chat_format(self) -> ChatFormat | None: ...

    def verifier(self, pieces: Callable[[], TokenPieces]) -> MeteredVerifier: ...

    def measure_rtt(self, *, repeats: int = 3) -> float: ...

    def close(self) -> None: ...


class OpenAIConnection(Peer, Protocol):
    """What an engine's module uses of the ``OpenAITarget`` it sits behind: the connection,
    the model, the caller's bounds, the engine's description and a round's deadline."""

    timeout_s: float
    max_length: int
    max_length_given: bool
    max_k: int
    prompt_format: str

    @property
    def model(self) -> str: ...

    def models(self) -> Any: ...

    def info(self) -> ServerInfo: ...

    def round_deadline(self, uncached: int) -> float: ...

    def measure_rtt(self, *, repeats: int = 3) -> float: ...


class OpenAIEngine(Protocol):
    """One OpenAI-compatible engine behind an ``OpenAITarget``, found by its module's
    ``detect(target)``: its name, whether it verifies sampled drafts, what it adds to the
    target's description (slots, context, costs), and one generation's verifier."""

    name: str
    greedy_only: bool

    def info(self, described: ServerInfo) -> ServerInfo: ...

    def verifier(self, pieces: TokenPieces) -> MeteredVerifier: ...
