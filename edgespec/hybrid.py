"""The engine's remote half: verifiers for a remote target, its cost model and its stats.

``edgespec.api`` calls these; together they are the only code that picks concrete verifiers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from edgespec.errors import ConfigError
from edgespec.runtime.policy import CostProfile
from edgespec.runtime.session import ModelSession
from edgespec.runtime.verifiers.base import Verifier
from edgespec.runtime.verifiers.engine import EngineTarget, EngineVerifier, TokenPieces
from edgespec.runtime.verifiers.fallback import FallbackVerifier, SwitchingVerifier
from edgespec.runtime.verifiers.http import Traffic
from edgespec.runtime.verifiers.local import LocalVerifier
from edgespec.runtime.verifiers.remote import RemoteTarget, RemoteVerifier
from edgespec.runtime.verifiers.wire import ServerInfo

#: A remote target: an ``edgespec serve`` server, or an OpenAI-compatible serving engine.
Remote = RemoteTarget | EngineTarget


class MeteredVerifier(Verifier, Protocol):
    """A remote verifier: its traffic, and the draft length its server suggests."""

    suggested_k: int

    def traffic(self) -> Traffic: ...


#: What a generation does when the verification server stays unreachable.
FALLBACKS = ("fail", "local", "draft")
#: When rounds go to the remote target: every round, or while the budget policy says so.
REMOTE_WHEN = ("always", "budget")


def check_fallback(
    fallback: str,
    *,
    target: ModelSession | None,
    draft: ModelSession | None,
    remote_when: str = "always",
) -> None:
    if remote_when not in REMOTE_WHEN:
        raise ConfigError(f"unknown remote_when {remote_when!r}", fix=f"use one of {REMOTE_WHEN}")
    if remote_when == "budget" and target is None:
        raise ConfigError(
            "remote_when='budget' verifies locally until the budget says remote: it needs a "
            "local target",
            fix="pass --target DIR (or leave it out for the built-in pair)",
        )
    if fallback not in FALLBACKS:
        raise ConfigError(f"unknown fallback {fallback!r}", fix=f"use one of {FALLBACKS}")
    if fallback == "local" and target is None:
        raise ConfigError("--fallback local needs a local target", fix="pass --target DIR")
    if fallback == "draft" and draft is None:
        raise ConfigError("--fallback draft needs a draft bundle", fix="pass --draft DIR")


@dataclass(frozen=True, kw_only=True)
class RemoteRun:
    """One remote generation's verifier, the remote verifier inside it (for its traffic), and
    the fallback wrapper around it (None under "fail")."""

    verifier: Verifier
    remote: MeteredVerifier
    fallback: FallbackVerifier | None
    fallback_kind: str
    switching: SwitchingVerifier | None = None

    def stats(self, new_tokens: int) -> dict[str, Any]:
        """``remote`` traffic; ``fell_back`` (the reason) and ``lossy`` when it fell back;
        under a budget, how many rounds ran remotely and why the remote was given up."""
        fell_back = self.fallback is not None and self.fallback.fell_back
        found: dict[str, Any] = {
            "remote": traffic_stats(self.remote.traffic(), new_tokens),
            "fell_back": self.fallback.reason if self.fallback and fell_back else None,
            "lossy": fell_back and self.fallback_kind == "draft",
        }
        if self.switching is not None:
            found["remote_rounds"] = self.switching.remote_rounds
            found["remote_down"] = self.switching.remote_down or None
        return found


def remote_run(
    remote: Remote,
    *,
    fallback: str,
    target: ModelSession | None,
    draft: ModelSession | None,
    pieces: TokenPieces | None = None,
    remote_when: str = "always",
) -> RemoteRun:
    """The verifier of a remote generation: ``fallback`` "local" or "draft" wraps it so that
    it continues with the local target or the draft model when the server stays away. An
    engine's verifier names tokens with ``pieces`` (the draft's tokenizer). ``remote_when``
    "budget" verifies locally and moves rounds to the remote target while the budget policy's
    mode is "remote" (an unreachable server then keeps the generation local)."""
    verifier: MeteredVerifier
    if isinstance(remote, EngineTarget):
        if pieces is None:
            raise ConfigError("an engine target needs the draft's tokenizer", fix="pass pieces")
        verifier = EngineVerifier(remote, pieces)
    else:
        verifier = RemoteVerifier(remote)
    if remote_when == "budget":
        assert target is not None
        # Local rounds until the budget policy (whose mode ``use_remote`` is set to read once
        # the generation's telemetry exists) says remote.
        switching = SwitchingVerifier(LocalVerifier(target), verifier, use_remote=lambda: False)
        return RemoteRun(
            verifier=switching,
            remote=verifier,
            fallback=None,
            fallback_kind="fail",
            switching=switching,
        )
    if fallback == "fail":
        return RemoteRun(verifier=verifier, remote=verifier, fallback=None, fallback_kind=fallback)
    session = target if fallback == "local" else draft
    assert session is not None

    def make() -> Verifier:
        return LocalVerifier(session)

    wrapper = FallbackVerifier(verifier, make)
    return RemoteRun(verifier=wrapper, remote=verifier, fallback=wrapper, fallback_kind=fallback)


def remote_profile(info: ServerInfo, *, rtt_s: float, draft_step_s: float) -> CostProfile:
    """The cost model of remote rounds: every verify pass pays the round trip on top of the
    server's T(w); longer round trips make longer drafts pay (``AutoK`` then learns from the
    measured rounds)."""
    step = rtt_s + info.target_step_s
    costs = tuple((rtt_s + info.target_step_s * cost) / step for cost in info.verify_cost)
    return CostProfile(target_step_s=step, draft_step_s=draft_step_s, verify_cost=costs)


def traffic_stats(traffic: Traffic, new_tokens: int) -> dict[str, Any]:
    """``Result.stats["remote"]``: round trips and bytes per committed token, RTT share."""
    per_token = max(new_tokens, 1)
    return {
        "round_trips": traffic.round_trips,
        "round_trips_per_token": traffic.round_trips / per_token,
        "bytes_sent": traffic.bytes_sent,
        "bytes_received": traffic.bytes_received,
        "bytes_sent_per_token": traffic.bytes_sent / per_token,
        "bytes_received_per_token": traffic.bytes_received / per_token,
        # None when the peer reports no compute time (an OpenAI-compatible engine).
        "rtt_share": (
            traffic.network_s / traffic.rounds_s
            if traffic.rounds_s and traffic.rtt_share_by_round
            else None
        ),
        "rtt_share_by_round": [round(share, 4) for share in traffic.rtt_share_by_round],
        "reopens": traffic.reopens,
        "retries": traffic.retries,
    }
