"""The engine's remote half: a remote target's health between generations, the cost model of
remote rounds and the traffic stats of a remote generation. What a remote target is lives in
``runtime.remote.target``; concrete targets are picked in ``assembly``."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from edgespec.errors import RemoteError
from edgespec.protocol.server_info import ServerInfo
from edgespec.runtime.k_policy import CostProfile
from edgespec.runtime.remote.target import EngineWork, MeteredVerifier, RemoteTarget
from edgespec.runtime.remote.transport import Traffic
from edgespec.runtime.verifiers.base import Verifier
from edgespec.runtime.verifiers.fallback import FallbackVerifier, SwitchingVerifier

#: Seconds between the background probes of a remote target known to be down.
REPROBE_S = 5.0
#: The deadline of one probe (a health request, not retried).
PROBE_TIMEOUT_S = 2.0


class RemoteHealth:
    """What an engine remembers of its remote target between generations, under a fallback.

    Once a generation has waited out the target's deadline and fallen back (``mark_down``),
    the next generations go local at once instead of waiting it out again: ``down`` says why,
    while a background thread sends the target's health request every ``every_s`` seconds.
    The first answer brings the remote target back for the next generation.
    """

    def __init__(
        self,
        remote: RemoteTarget,
        *,
        every_s: float = REPROBE_S,
        timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self._remote = remote
        self.every_s = every_s
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._since = 0.0
        self._closed = threading.Event()
        self._prober: threading.Thread | None = None

    @property
    def down(self) -> str | None:
        """Why the remote target is given up for now (None: it is not)."""
        with self._lock:
            if self._reason is None:
                return None
            age = time.monotonic() - self._since
            return (
                f"{self._reason} (down for {age:.0f} s; probed every {self.every_s:g} s, "
                "used again once it answers)"
            )

    def mark_down(self, reason: str) -> None:
        with self._lock:
            if self._reason is None:
                self._since = time.monotonic()
            self._reason = reason
            if self._prober is None and not self._closed.is_set():
                self._prober = threading.Thread(
                    target=self._probe_until_up, name="edgespec-remote-probe", daemon=True
                )
                self._prober.start()

    def _probe_until_up(self) -> None:
        remote = self._remote
        while not self._closed.wait(self.every_s):
            try:
                remote.request("GET", remote.health_path, retry=False, timeout_s=self.timeout_s)
            except RemoteError:
                continue
            with self._lock:
                self._reason, self._prober = None, None
            return

    def close(self) -> None:
        self._closed.set()


@dataclass(frozen=True, kw_only=True)
class RemoteRun:
    """One remote generation's verifier, the remote verifier inside it (for its traffic), the
    fallback wrapper around it (None under "fail") and, under a budget, the switch between
    local and remote rounds."""

    verifier: Verifier
    remote: MeteredVerifier
    fallback: FallbackVerifier | None = None
    #: Falling back continues with the draft alone: output no longer verified.
    lossy: bool = False
    switching: SwitchingVerifier | None = None

    def stats(self, new_tokens: int) -> dict[str, Any]:
        """``remote`` traffic; ``fell_back`` (the reason) and ``lossy`` when it fell back;
        under a budget, how many rounds ran remotely and why the remote was given up."""
        fell_back = self.fallback is not None and self.fallback.fell_back
        remote = traffic_stats(self.remote.traffic(), new_tokens)
        work = self.remote.work()
        if work is not None:
            remote["engine"] = engine_work_stats(work, new_tokens)
        found: dict[str, Any] = {
            "remote": remote,
            "fell_back": self.fallback.reason if self.fallback and fell_back else None,
            "lossy": fell_back and self.lossy,
        }
        if self.switching is not None:
            found["remote_rounds"] = self.switching.remote_rounds
            found["remote_down"] = self.switching.remote_down or None
        return found


def remote_profile(info: ServerInfo, *, rtt_s: float, draft_step_s: float) -> CostProfile:
    """The cost model of remote rounds: every verify pass pays the round trip on top of the
    server's T(w); longer round trips make longer drafts pay (``AutoK`` then learns from the
    measured rounds)."""
    step = rtt_s + info.target_step_s
    costs = tuple((rtt_s + info.target_step_s * cost) / step for cost in info.verify_cost)
    return CostProfile(target_step_s=step, draft_step_s=draft_step_s, verify_cost=costs)


def engine_work_stats(work: EngineWork, new_tokens: int) -> dict[str, Any]:
    """``Result.stats.remote["engine"]``: the prompt tokens a serving engine computed per round
    (0 where it does not say; the first round computes the history in each slot it uses), per
    later round on average, and per new token; its milliseconds per round."""
    computed = sum(work.round_tokens)
    later = work.round_tokens[1:]
    return {
        "round_tokens": list(work.round_tokens),
        "tokens_per_later_round": sum(later) / len(later) if later else 0.0,
        "tokens_per_new_token": computed / max(new_tokens, 1),
        "round_ms": [round(ms, 3) for ms in work.round_server_ms],
        "ms_per_new_token": sum(work.round_server_ms) / max(new_tokens, 1),
    }


def traffic_stats(traffic: Traffic, new_tokens: int) -> dict[str, Any]:
    """``Result.stats.remote``: round trips and bytes per committed token, RTT share."""
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
