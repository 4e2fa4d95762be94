"""What one generation asks for, and how a remote target is used: frozen, validated records.

Everything here is checked when the record is built, before any token is generated, so bad
input fails with one line and loses nothing. Checks that need the loaded pair (is there a
draft? does the prompt fit?) happen in :mod:`edgespec.engine.assembly`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError
from edgespec.runtime.remote.registry import REMOTE_APIS

__all__ = ["REMOTE_APIS"]  # what --remote-api takes, from the remote targets' registry

#: The longest draft a round may carry: one rule for local and remote verification (the
#: cost curves are measured up to k + 1 = 9 positions, and a server's ``--max-k`` may only
#: lower it).
MAX_K = 8
#: The draft length when none is given and the pair recommends none.
DEFAULT_K = 4
#: The drafters a generation may ask for (their classes are picked in ``assembly``).
#: The positions a draft model attends over besides its first 128 when none is asked for
#: (``--draft-window``; :mod:`edgespec.graph.window`): past them its steps stop slowing down
#: as the history grows (measured: docs/benchmarks/long-context.md, "A draft over a window").
DEFAULT_DRAFT_WINDOW = 1024
DRAFTER_NAMES = ("model", "combined", "head", "ngram", "none")
#: What a generation does when the verification server stays unreachable.
FALLBACKS = ("fail", "local", "draft")
#: When rounds go to the remote target: every round, or while the budget policy says so.
REMOTE_WHEN = ("always", "budget")

K_RULE = f"k is 0 (no drafting) to {MAX_K}, or 'auto'"


def parse_k(value: int | str | None) -> int | str | None:
    """``k`` as given on the command line or in the API: None, 'auto' or 0..MAX_K."""
    if value is None or value == "auto":
        return value
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ConfigError(f"k {value!r} is not a number", fix=K_RULE) from None
    if isinstance(value, bool) or not 0 <= value <= MAX_K:
        raise ConfigError(f"k {value} is out of range", fix=K_RULE)
    return value


@dataclass(frozen=True, kw_only=True)
class GenerationOptions:
    """The options of one generation (see ``edgespec generate --help`` for each).

    ``drafter`` None picks ``model`` when a draft is loaded, else ``ngram``; ``k`` None
    takes the pair's recommended k (else ``DEFAULT_K``); ``sampling_mode`` None picks
    ``match`` (the same text as target-only sampling with the seed). ``draft_min_probability``
    ends a proposal early when the draft's own probability of its next token falls below it.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    k: int | str | None = None
    drafter: str | None = None
    sampling_mode: str | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    chat: bool = False
    draft_min_probability: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", parse_k(self.k))
        object.__setattr__(self, "stop", tuple(self.stop))
        if isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 1:
            raise ConfigError(
                f"max_new_tokens is {self.max_new_tokens}", fix="ask for at least 1 token"
            )
        if self.drafter is not None and self.drafter not in DRAFTER_NAMES:
            raise ConfigError(
                f"unknown drafter {self.drafter!r}", fix=f"use one of {', '.join(DRAFTER_NAMES)}"
            )
        for name in ("temperature", "top_p", "draft_min_probability"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"{name} {getattr(self, name)} is not a finite number")
        if not 0.0 <= self.draft_min_probability < 1.0:
            raise ConfigError(
                f"draft_min_probability {self.draft_min_probability} is outside [0, 1)",
                fix="use 0 (off) or a small probability such as 0.05",
            )
        if any(not text for text in self.stop):
            raise ConfigError("a stop string is empty", fix="pass non-empty stop strings")
        self.sampling(self.drafter or "model")  # validates temperature, top_k, top_p, seed

    def sampling(self, drafter: str) -> SamplingConfig:
        """The sampling record for ``drafter``: ``match`` unless another mode is asked for.
        A draft model races the target's keyed draws about as often as rejection sampling
        accepts (0.86 against 0.86 on code, 0.68 against 0.70 on chat for Qwen2.5-Coder-1.5B
        with its 0.5B draft), and the text is target-only sampling's, whatever k."""
        mode = self.sampling_mode or "match"
        sampling = SamplingConfig(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            mode=mode,
        )
        if not sampling.greedy and mode == "rejection" and drafter == "ngram":
            raise ConfigError(
                "the ngram drafter has no draft probabilities, so it cannot use rejection sampling",
                fix="use sampling_mode 'match' (the default)",
            )
        return sampling


@dataclass(frozen=True, kw_only=True)
class RemoteOptions:
    """How a remote target is used: ``fallback`` when it stays away ("fail": stop and keep the
    verified text; "local": go on with the local target, lossless; "draft": go on with the
    draft alone, marked lossy) and ``remote_when`` ("always", or "budget": verify locally until
    the budget policy's mode is "remote")."""

    fallback: str = "fail"
    remote_when: str = "always"

    def __post_init__(self) -> None:
        if self.fallback not in FALLBACKS:
            raise ConfigError(
                f"unknown fallback {self.fallback!r}", fix=f"use one of {', '.join(FALLBACKS)}"
            )
        if self.remote_when not in REMOTE_WHEN:
            raise ConfigError(
                f"unknown remote_when {self.remote_when!r}",
                fix=f"use one of {', '.join(REMOTE_WHEN)}",
            )

    @property
    def needs_local_target(self) -> bool:
        return self.fallback == "local" or self.remote_when == "budget"

    def check_loaded(self, *, has_target: bool, has_draft: bool) -> None:
        """The local models these options rely on are loaded."""
        if self.remote_when == "budget" and not has_target:
            raise ConfigError(
                "remote_when 'budget' verifies locally until the budget says remote: it needs "
                "a local target",
                fix="pass --target DIR (or leave it out for the default model)",
            )
        if self.fallback == "local" and not has_target:
            raise ConfigError("fallback 'local' needs a local target", fix="pass --target DIR")
        if self.fallback == "draft" and not has_draft:
            raise ConfigError("fallback 'draft' needs a draft bundle", fix="pass --draft DIR")
