"""Planning one generation: what the engine holds (a :class:`PlanSource`, described once at
load), then per generation the prompt's checks and the drafter, verifier, k policy and
telemetry watch it runs with (a :class:`~edgespec.engine.generation.Plan`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from edgespec.engine import assembly
from edgespec.engine.device_choice import costs_path, load_choice, load_costs, save_costs
from edgespec.engine.drafting import Drafting, decide_drafting
from edgespec.engine.generation import Plan
from edgespec.engine.loading import LoadedPair
from edgespec.engine.options import GenerationOptions, RemoteOptions
from edgespec.engine.remote import RemoteHealth, RemoteTarget, remote_profile
from edgespec.errors import (
    ConfigError,
    ContextLimitError,
    IncompatiblePairError,
    RemoteUnavailableError,
)
from edgespec.runtime.costs import measure_costs
from edgespec.runtime.k_policy import CostProfile
from edgespec.runtime.model import OnnxModel
from edgespec.runtime.remote.pieces import TokenPieces
from edgespec.telemetry.watch import Telemetry

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PlanSource:
    """What planning a generation needs from the engine around it: the loaded pair, the remote
    target and its options, the limits every prompt is checked against, the drafting the pair
    recommends, the telemetry, and providers of what is built or measured once per engine."""

    pair: LoadedPair
    #: None without one, or when it was unreachable at load (``remote_down`` says why).
    remote: RemoteTarget | None
    remote_options: RemoteOptions
    remote_down: str | None
    vocab_size: int
    max_length: int
    #: The drafter and k a generation runs with when its options name none.
    drafting: Drafting
    #: How a built pair was trained and selected (``tools/build_toy_pair.py``; else empty).
    build_record: dict[str, Any]
    telemetry: Telemetry
    #: A text prompt's token ids (the bool: through the chat template).
    encode: Callable[[str, bool], list[int]]
    #: The cost profile (measured once) and an OpenAI verifier's token texts (built once).
    cost_profile: Callable[[], CostProfile]
    token_pieces: Callable[[], TokenPieces]
    #: Under a fallback: whether the remote target is down now (a generation fell back).
    health: RemoteHealth | None = None

    @property
    def verifying_model(self) -> OnnxModel | None:
        """The model that verifies on this device: the target, or the draft itself when the
        remote target was unreachable at load under ``fallback="draft"`` (lossy)."""
        return _verifying_model(self.pair, self.remote_options, self.remote_down)

    @property
    def verifies_locally(self) -> bool:
        return self.remote is None or self.remote_options.remote_when == "budget"

    @property
    def lossy(self) -> bool:
        """The draft goes on alone, unverified: the remote target was down at load."""
        return self.remote_down is not None and self.remote_options.fallback == "draft"

    @property
    def providers(self) -> dict[str, list[str]]:
        """What really runs (ONNX Runtime falls back silently), per model."""
        target, draft = self.pair.target, self.pair.draft
        found = {"target": list(target.providers)} if target else {}
        if draft is not None:
            found["draft"] = list(draft.providers)
        return found

    def drafter_name(self, options: GenerationOptions) -> str:
        return self.drafting.drafter_for(options)

    @property
    def default_k(self) -> int | str:
        return self.drafting.k

    @property
    def default_k_source(self) -> str:
        return self.drafting.k_source


def describe(
    pair: LoadedPair,
    *,
    remote: RemoteTarget | None,
    remote_options: RemoteOptions,
    telemetry: Telemetry,
    encode: Callable[[str, bool], list[int]],
    cost_profile: Callable[[], CostProfile],
    token_pieces: Callable[[], TokenPieces],
) -> PlanSource:
    """The engine's :class:`PlanSource`: the context limit is the smallest of the models' and
    the remote target's, and the vocabulary the verifying side's. A remote target unreachable
    now is given up (``remote_down``) when the fallback lets the engine go on without it."""
    target, draft = pair.target, pair.draft
    limits = [model.max_length for model in (target, draft) if model is not None]
    remote_down: str | None = None
    vocab_size = 0
    if remote is not None:
        remote_options.check_loaded(has_target=target is not None, has_draft=draft is not None)
        try:
            info = remote.info()
        except RemoteUnavailableError as error:
            if remote_options.fallback == "fail":
                raise
            # The problem alone: its fix ("use a fallback") is what is happening now.
            remote, remote_down = None, error.problem
        else:
            if remote.api == "edgespec" and draft is not None:
                check_remote_tokenizer(info, draft, remote)
            limits.append(info.max_length)
            # An engine reports no vocabulary: the draft's names the tokens it may be sent.
            vocab_size = info.vocab_size or (draft.vocab_size if draft else 0)
    if remote is None:
        verifying = _verifying_model(pair, remote_options, remote_down)
        if verifying is None:
            raise ConfigError("an engine needs a target", fix="pass --target DIR or --remote URL")
        vocab_size = verifying.vocab_size
    built = target if target is not None else draft
    build_record = (
        {} if built is None else dict(built.bundle.manifest.extra.get("builtin_pair", {}))
    )
    drafting = decide_drafting(
        has_draft=draft is not None,
        has_head=pair.head is not None,
        draft_extra=None if draft is None else draft.bundle.manifest.extra,
        build_record=build_record,
        measured=(
            load_choice(target.bundle, _beside(pair))
            if target is not None and remote is None
            else None
        ),
    )
    stored = drafting.stored_costs
    if stored is not None:  # the profile measured on this device is already at hand
        cost_profile = lambda: stored  # noqa: E731
    return PlanSource(
        pair=pair,
        remote=remote,
        remote_options=remote_options,
        remote_down=remote_down,
        vocab_size=vocab_size,
        max_length=min(limits),
        drafting=drafting,
        build_record=build_record,
        telemetry=telemetry,
        encode=encode,
        cost_profile=cost_profile,
        token_pieces=token_pieces,
        health=(
            RemoteHealth(remote)
            if remote is not None
            and (remote_options.fallback != "fail" or remote_options.remote_when == "budget")
            else None
        ),
    )


def _beside(pair: LoadedPair) -> Any:
    """The bundle that drafts beside the target (its head, else its draft; None: neither),
    which keys the device's stored choice."""
    model = pair.head or pair.draft
    return model.bundle if model is not None else None


def check_remote_tokenizer(info: Any, draft: OnnxModel, remote: RemoteTarget) -> None:
    """Refuses a draft whose tokenizer is not the server's target's: the target's tokens are
    read back with the draft's tokenizer, so another vocabulary turns its output into other
    text. The same tokenizer file passes; another one passes only with the same vocabulary
    size and end-of-turn ids (a re-export of the same tokenizer)."""
    import hashlib

    from edgespec.engine.pairing import MAX_VOCAB_SIZE_DIFFERENCE

    tokenizer = draft.bundle.manifest.tokenizer
    same_file = (
        hashlib.sha256(draft.bundle.tokenizer_path.read_bytes()).hexdigest()
        == info.tokenizer_sha256
    )
    if same_file:
        return
    sizes = abs(info.vocab_size - draft.vocab_size) <= MAX_VOCAB_SIZE_DIFFERENCE
    eos = set(info.eos_token_ids) == set(tokenizer.eos_token_ids)
    if sizes and eos:
        return
    what = (
        f"a vocabulary of {draft.vocab_size:,} tokens against the server's {info.vocab_size:,}"
        if not sizes
        else f"end-of-turn ids {sorted(tokenizer.eos_token_ids)} against the server's "
        f"{sorted(info.eos_token_ids)}"
    )
    raise IncompatiblePairError(
        f"the draft {draft.bundle.root.name} does not share the tokenizer of the target "
        f"served at {remote.url}: {what}",
        fix="draft with the model the server serves (or its catalog draft: --model NAME)",
    )


def _verifying_model(
    pair: LoadedPair, options: RemoteOptions, remote_down: str | None
) -> OnnxModel | None:
    if remote_down is not None and options.fallback == "draft":
        return pair.draft
    return pair.target


def plan(source: PlanSource, prompt: str | Sequence[int], options: GenerationOptions) -> Plan:
    """Everything one generation runs with, validated before anything is generated."""
    drafter_name = source.drafter_name(options)
    sampling = options.sampling(drafter_name)
    prompt_ids = _prompt_ids(source, prompt, options)
    # A remote target that made an earlier generation fall back is skipped until it answers.
    down = source.health.down if source.health is not None else None
    remote = source.remote if down is None else None
    if remote is not None and isinstance(options.k, int):
        limit = remote.info().max_k
        if options.k > limit:
            raise ConfigError(
                f"k {options.k} is more than the server's limit of {limit}",
                fix="use a smaller k, or k 'auto'",
            )
    pair = source.pair
    if drafter_name == "combined":
        # Its rounds price drafts with the pair's costs: measured (or read) here, before the
        # first round, so that a first generation's decode time and rate are its own.
        source.cost_profile()
    draft_source = assembly.DraftSource(
        draft=pair.draft,
        head=pair.head,
        vocab_size=source.vocab_size,
        stop_probability=options.draft_min_probability,
        costs=source.cost_profile,
    )
    features = assembly.reads_features(drafter_name, draft_source)
    if features and source.remote is not None:
        raise ConfigError(
            f"the {drafter_name} drafter drafts from the target's features, which a remote "
            "target does not return",
            fix="draft with --drafter model (hybrid verification keeps model drafts) or ngram",
        )
    drafter = assembly.drafter(drafter_name, draft_source)
    metered = None if remote is None else assembly.remote_verifier(remote, source.token_pieces)
    local = (
        assembly.local_verifier(
            _verifying_model(pair, source.remote_options, source.remote_down or down),
            features=features,
        )
        if metered is None
        else None
    )
    k_policy = assembly.k_policy(
        options,
        drafter_name=drafter_name,
        k=source.drafting.k_for(options),
        # Seeded at the prompt's length: AutoK then learns what rounds really cost.
        profile=lambda: source.cost_profile().at_depth(len(prompt_ids)),
        alpha=source.drafting.seed_alpha,
        cap=None if metered is None else (lambda: metered.suggested_k),
    )
    watch = source.telemetry.watch(k_policy)
    # Wrapped once the watch exists: under remote_when "budget", its mode moves rounds.
    run = (
        None
        if metered is None
        else assembly.remote_run(
            metered,
            source.remote_options,
            target=pair.target,
            draft=pair.draft,
            use_remote=lambda: watch.mode == "remote",
            on_down=source.health.mark_down if source.health is not None else None,
        )
    )
    verifier = local if run is None else run.verifier
    assert verifier is not None
    return Plan(
        prompt_ids=prompt_ids,
        drafter=drafter,
        verifier=verifier,
        k_policy=k_policy,
        sampling=sampling,
        max_new_tokens=options.max_new_tokens,
        eos_ids=pair.eos_ids,
        stop=options.stop,
        watch=watch,
        remote=run,
        providers=source.providers,
        fell_back=source.remote_down or down,
        lossy=source.lossy or (down is not None and source.remote_options.fallback == "draft"),
    )


def _prompt_ids(
    source: PlanSource, prompt: str | Sequence[int], options: GenerationOptions
) -> list[int]:
    ids = list(prompt) if not isinstance(prompt, str) else source.encode(prompt, options.chat)
    if not ids or (isinstance(prompt, str) and not prompt.strip()):
        raise ConfigError(
            "the prompt is empty or only whitespace", fix="pass at least one character of text"
        )
    if any(not 0 <= t < source.vocab_size for t in ids):
        raise ConfigError(
            f"prompt token ids must lie in [0, {source.vocab_size})",
            fix="encode the prompt with the bundle's tokenizer",
        )
    if len(ids) + options.max_new_tokens > source.max_length:
        prompt_words = f"the prompt ({_tokens(len(ids))})"
        longer = (
            "load with a longer context (--context N; Engine.load's context), up to the models' own"
        )
        if len(ids) >= source.max_length:  # no max_new_tokens makes room
            raise ContextLimitError(
                f"{prompt_words} fills the context of {source.max_length} tokens by itself",
                fix=f"shorten the prompt, or {longer}",
            )
        raise ContextLimitError(
            f"{prompt_words} plus max_new_tokens ({options.max_new_tokens}) exceeds the "
            f"context of {source.max_length} tokens",
            fix=f"lower max_new_tokens to {source.max_length - len(ids)} or less, shorten the "
            f"prompt, or {longer}",
        )
    return ids


def _tokens(count: int) -> str:
    return f"{count:,} token{'s' * (count != 1)}"


def measure_profile(source: PlanSource) -> CostProfile:
    """T(w)/T(1) and the draft step cost on this device: of remote rounds (the server's curve
    plus the measured round trip) when verification is remote, else of the local models."""
    # The model that drafts beside the target: its head when it has one (the combined
    # drafter prices its rounds with the head's step), else the draft model.
    draft = source.pair.head or source.pair.draft
    if source.remote is not None and not source.verifies_locally:
        draft_step = measure_costs(draft, None, max_width=1) if draft else None
        return remote_profile(
            source.remote.info(),
            rtt_s=source.remote.measure_rtt(),
            draft_step_s=draft_step.target_step_s if draft_step else 0.0,
        )
    verifying = source.verifying_model
    assert verifying is not None, "an engine without a remote target has a verifying model"
    # Kept per pair, device, threads and providers: a measurement takes 45 target passes (its
    # time: docs/runtime.md, "Choosing k"), which each process's first generation paid.
    kept = costs_path(
        verifying.bundle,
        draft.bundle if draft else None,
        threads=verifying.intra_op_threads,
        providers=verifying.providers,
        draft_window=draft.attention_window if draft else 0,
    )
    stored = load_costs(kept)
    if stored is not None:
        return stored
    measured = measure_costs(verifying, draft)
    try:
        save_costs(measured, kept)
    except OSError as error:  # a read-only cache: measured again next time
        log.warning("could not keep the measured costs in %s: %s", kept, error)
    return measured


def token_pieces(pair: LoadedPair) -> TokenPieces:
    """The draft tokenizer's table of token texts for an OpenAI verifier."""
    bos = pair.bos_token
    bos_id = pair.tokenizer.token_to_id(bos) if bos else None
    return TokenPieces(
        pair.tokenizer, bos_ids=() if bos_id is None else (bos_id,), eos_ids=sorted(pair.eos_ids)
    )
