"""The one place that picks concrete drafters, verifiers, remote targets and k policies, each
from one registry. Everything above it (the engine, the CLI, the server) names them by string;
everything below it (the decoder) knows only their protocols."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edgespec.engine.options import MAX_K, GenerationOptions, RemoteOptions
from edgespec.engine.remote import RemoteRun
from edgespec.errors import ConfigError
from edgespec.events import KPolicy
from edgespec.runtime.drafters.base import Drafter
from edgespec.runtime.drafters.combined import CombinedDrafter
from edgespec.runtime.drafters.head import HeadDrafter
from edgespec.runtime.drafters.model import ModelDrafter
from edgespec.runtime.drafters.ngram import PromptLookupDrafter
from edgespec.runtime.drafters.none import NoDrafter
from edgespec.runtime.k_policy import (
    GREEDY_ALPHA_SMOOTHING,
    SAMPLED_ALPHA_SMOOTHING,
    AutoK,
    CappedK,
    CostProfile,
    FixedK,
)
from edgespec.runtime.model import OnnxModel
from edgespec.runtime.remote import registry
from edgespec.runtime.remote.pieces import TokenPieces
from edgespec.runtime.remote.target import MeteredVerifier, RemoteTarget
from edgespec.runtime.remote.transport import DEFAULT_TIMEOUT_S
from edgespec.runtime.verifiers.base import Verifier
from edgespec.runtime.verifiers.fallback import FallbackVerifier, SwitchingVerifier
from edgespec.runtime.verifiers.local import LocalVerifier


@dataclass(frozen=True, kw_only=True)
class DraftSource:
    """What a drafter may be built from: the draft model (if loaded) and the vocabulary."""

    draft: OnnxModel | None
    #: A head on the target (its bundle's model), which the head and combined drafters use.
    head: OnnxModel | None
    vocab_size: int
    stop_probability: float
    #: The pair's measured costs (measured on first use), which price the combined
    #: drafter's model rounds.
    costs: Callable[[], CostProfile]


def _model_drafter(source: DraftSource) -> Drafter:
    if source.draft is None:
        raise ConfigError(
            "the model drafter needs a draft bundle",
            fix="pass a draft bundle (--draft DIR), or use the ngram drafter",
        )
    return ModelDrafter(
        source.draft, vocab_size=source.vocab_size, stop_probability=source.stop_probability
    )


def _head_drafter(source: DraftSource) -> HeadDrafter:
    if source.head is None:
        raise ConfigError(
            "the head drafter needs a head on the target",
            fix="pass a head bundle (--head DIR, made by 'edgespec distill --head'), use a "
            "catalog model that ships one ('edgespec models'), or another drafter",
        )
    return HeadDrafter(
        source.head, vocab_size=source.vocab_size, stop_probability=source.stop_probability
    )


#: The most tokens a head's round drafts in the combined drafter: its step costs about a
#: tenth of a draft model's, so longer rounds pay (each round's length is still priced).
HEAD_MODEL_K = 6


def _combined_drafter(source: DraftSource) -> Drafter:
    """Prompt lookup, and the head where the target has one loaded, else the draft model."""
    if source.head is not None:
        return CombinedDrafter(_head_drafter(source), costs=source.costs, model_k=HEAD_MODEL_K)
    model = _model_drafter(source)
    assert isinstance(model, ModelDrafter)
    return CombinedDrafter(model, costs=source.costs)


def reads_features(drafter_name: str, source: DraftSource) -> bool:
    """Whether the drafter drafts from the target's features (the verifier must hand them)."""
    return drafter_name == "head" or (drafter_name == "combined" and source.head is not None)


#: The ngram drafter proposes at most this many tokens unless its last proposal was accepted
#: whole (``PromptLookupDrafter.cold_k``; measured by ``benchmarks/lookup_policy.py``).
LOOKUP_COLD_K = 2

#: Drafter name → factory. Names are ``options.DRAFTER_NAMES``.
DRAFTERS: dict[str, Callable[[DraftSource], Drafter]] = {
    "model": _model_drafter,
    "combined": _combined_drafter,
    "head": _head_drafter,
    "ngram": lambda source: PromptLookupDrafter(cold_k=LOOKUP_COLD_K),
    "none": lambda source: NoDrafter(),
}


def remote_target(
    remote: str | RemoteTarget | None,
    *,
    api: str = "auto",
    model: str | None = None,
    api_key: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> RemoteTarget | None:
    """A remote target from a URL (``api`` says what it speaks, "auto" asks the URL:
    ``runtime.remote.registry``), or the one given. ``timeout_s``: the deadline of each
    request, retries included."""
    if remote is None or not isinstance(remote, str):
        return remote
    return registry.remote_target(
        remote, api=api, model=model, api_key=api_key, timeout_s=timeout_s
    )


def drafter(name: str, source: DraftSource) -> Drafter:
    return DRAFTERS[name](source)


def k_policy(
    options: GenerationOptions,
    *,
    drafter_name: str,
    k: int | str,
    profile: Callable[[], CostProfile],
    cap: Callable[[], int] | None,
    alpha: float | None = None,
) -> KPolicy:
    """Fixed k (0 for the ``none`` drafter), or auto k (``k``, as :mod:`engine.drafting`
    decided it) from the measured cost ``profile`` starting from acceptance ``alpha`` (a
    measured one; else AutoK's prior), capped by a remote server's suggested k (``cap``) when
    there is one."""
    if drafter_name == "none":
        return FixedK(0)
    if k != "auto":
        return FixedK(int(k))
    if drafter_name == "combined":
        # The combined drafter prices each round itself (lookup or model, and how many
        # tokens) from the same costs and each side's own acceptance. AutoK would price every
        # round at the mix of both sides' acceptance and at a draft step per token, and cut
        # free lookup rounds short (docs/benchmarks/qwen-vs-llama-cpp.md, "On a 2-core AVX-512
        # Xeon").
        return FixedK(MAX_K) if cap is None else CappedK(FixedK(MAX_K), cap=cap)
    # Sampled rounds' acceptance is a draw per token: α follows them slowly.
    smoothing = SAMPLED_ALPHA_SMOOTHING if options.temperature > 0 else GREEDY_ALPHA_SMOOTHING
    auto = (
        AutoK(profile(), alpha_smoothing=smoothing)
        if alpha is None
        else AutoK(profile(), alpha=alpha, alpha_smoothing=smoothing)
    )
    return auto if cap is None else CappedK(auto, cap=cap)


def local_verifier(target: OnnxModel | None, *, features: bool = False) -> Verifier:
    """The target on this device; with ``features`` its verdicts carry the target's
    features (a head drafts from them)."""
    if target is None:
        raise ConfigError("local verification needs a target", fix="pass --target DIR")
    return LocalVerifier(target, features=features)


def remote_verifier(remote: RemoteTarget, pieces: Callable[[], TokenPieces]) -> MeteredVerifier:
    """One generation's verifier on ``remote``, as its engine verifies (``pieces``: the draft
    tokenizer's token texts, built only where an engine needs them)."""
    return remote.verifier(pieces)


def remote_run(
    verifier: MeteredVerifier,
    options: RemoteOptions,
    *,
    target: OnnxModel | None,
    draft: OnnxModel | None,
    use_remote: Callable[[], bool],
    on_down: Callable[[str], None] | None = None,
) -> RemoteRun:
    """The verifier of a remote generation around ``verifier``: ``fallback`` "local" or
    "draft" wraps it so that it continues with the local target or the draft model when the
    server stays away; ``remote_when`` "budget" verifies locally and moves rounds to the remote
    target while ``use_remote()`` says so (the budget policy's mode is "remote"; an
    unreachable server then keeps the generation local). ``on_down`` hears why the server
    was given up."""
    if options.remote_when == "budget":
        assert target is not None
        switching = SwitchingVerifier(
            LocalVerifier(target), verifier, use_remote=use_remote, on_down=on_down
        )
        return RemoteRun(verifier=switching, remote=verifier, switching=switching)
    if options.fallback == "fail":
        return RemoteRun(verifier=verifier, remote=verifier)
    model = target if options.fallback == "local" else draft
    assert model is not None
    wrapper = FallbackVerifier(verifier, lambda: LocalVerifier(model), on_fall_back=on_down)
    return RemoteRun(
        verifier=wrapper, remote=verifier, fallback=wrapper, lossy=options.fallback == "draft"
    )
