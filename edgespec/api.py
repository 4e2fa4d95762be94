"""The public engine: load a target (and a draft) bundle, generate or stream text.

This is the only place that picks concrete drafters, verifiers and policies.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.builtin import builtin_pair
from edgespec.config import BudgetConfig, SamplingConfig
from edgespec.errors import ConfigError, EdgespecError, RemoteError
from edgespec.hybrid import Remote, RemoteRun, check_fallback, remote_profile, remote_run
from edgespec.manifest import Bundle, load_bundle
from edgespec.pairing import check_pair
from edgespec.runtime.decoder import FixedK, KPolicy, decode
from edgespec.runtime.drafters.base import Drafter
from edgespec.runtime.drafters.model import ModelDrafter
from edgespec.runtime.drafters.ngram import PromptLookupDrafter
from edgespec.runtime.drafters.none import NoDrafter
from edgespec.runtime.policy import AutoK, CappedK, CostProfile
from edgespec.runtime.profile import measure_costs
from edgespec.runtime.session import ModelSession, SessionOptions
from edgespec.runtime.stats import StatsCollector
from edgespec.runtime.text import StopMatcher, TextStream
from edgespec.runtime.verifiers.base import Verifier
from edgespec.runtime.verifiers.engine import EngineTarget, TokenPieces
from edgespec.runtime.verifiers.local import LocalVerifier
from edgespec.runtime.verifiers.remote import RemoteTarget
from edgespec.telemetry.estimate import admit, estimate_pair
from edgespec.telemetry.guard import Telemetry
from edgespec.telemetry.memory import MemoryProbe, base_rss_bytes
from edgespec.telemetry.sysfs import Tree

DRAFTERS = ("model", "ngram", "none")
DEFAULT_K = 4


class IncompatiblePairError(EdgespecError):
    """The draft's tokenizer cannot serve the target's."""


class ContextLimitError(ConfigError):
    """The prompt plus the requested tokens do not fit the context."""


@dataclass(frozen=True, kw_only=True)
class Delta:
    """A piece of streamed text; ``drafted`` when it came from accepted draft tokens."""

    text: str
    drafted: bool


@dataclass(frozen=True, kw_only=True)
class Result:
    """A finished generation: the new ``text`` and ``tokens`` (prompt excluded) and ``stats``.

    ``error`` is set (and ``finish_reason`` is "error") when the verification server became
    unreachable under ``fallback="fail"``: ``text`` is then what was verified before that.
    """

    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    stats: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> str:
        data = {"text": self.text, "tokens": list(self.tokens), "stats": self.stats}
        return json.dumps(data if self.error is None else {**data, "error": self.error})


class Generation:
    """Iterates over :class:`Delta` pieces as tokens are committed; ``result`` once done."""

    def __init__(self, pieces: Iterator[Delta]) -> None:
        self._pieces = pieces
        self.result: Result | None = None

    def __iter__(self) -> Iterator[Delta]:
        return self._pieces


class Engine:
    """A target bundle (or a remote target), an optional draft bundle, their sessions and the
    tokenizer. With ``remote``, rounds are verified by the server and a local ``target`` (if
    any) serves ``fallback="local"``."""

    def __init__(
        self,
        *,
        target: ModelSession | None,
        draft: ModelSession | None,
        tokenizer: Any,
        eos_ids: frozenset[int],
        chat_template: str | None,
        bos_token: str | None,
        eos_token: str | None,
        telemetry: Telemetry | None = None,
        remote: Remote | None = None,
        fallback: str = "fail",
        remote_when: str = "always",
    ) -> None:
        self.target = target
        #: Energy, memory and budgets (edgespec.telemetry): consulted around each generation.
        self.telemetry = telemetry or Telemetry()
        self.draft = draft
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.chat_template = chat_template
        self.remote = remote
        self.fallback = fallback
        self.remote_when = remote_when
        self._special = {"bos_token": bos_token or "", "eos_token": eos_token or ""}
        self._profile: CostProfile | None = None
        self._pieces_table: TokenPieces | None = None
        limits = [s.max_length for s in (target, draft) if s is not None]
        if remote is not None:
            check_fallback(fallback, target=target, draft=draft, remote_when=remote_when)
            limits.append(remote.info().max_length)
            # An engine reports no vocabulary: the draft's names the tokens it may be sent.
            self.vocab_size = remote.info().vocab_size or (draft.vocab_size if draft else 0)
        elif target is not None:
            self.vocab_size = target.vocab_size
        else:
            raise ConfigError("an engine needs a target", fix="pass target=DIR or remote=URL")
        self.max_length = min(limits)

    @classmethod
    def load(
        cls,
        *,
        target: str | Path | None = None,
        draft: str | Path | None = None,
        target_providers: Sequence[str] | None = None,
        draft_providers: Sequence[str] | None = None,
        threads: int = 0,
        io_binding: bool | None = None,
        verify_checksums: bool = True,
        memory_budget_mb: float | None = None,
        shrink_context: bool = False,
        budget: BudgetConfig | None = None,
        telemetry_root: str | Path = "/",
        measure_energy: bool = True,
        remote: str | Remote | None = None,
        api_key: str | None = None,
        fallback: str = "fail",
        remote_when: str = "always",
    ) -> Engine:
        """Loads and validates the bundles, checks the pair, and creates both sessions.

        ``memory_budget_mb`` (or ``budget.memory_mb``) is checked against the pair's estimate
        from its manifests before any session exists: over it, loading fails with a
        :class:`~edgespec.errors.BudgetError` that says what would fit, unless
        ``shrink_context`` allows a shorter max context. ``budget`` also turns on the budget
        policy between rounds; ``telemetry_root`` is where the probes read /proc and /sys.

        ``io_binding`` True uses the IO-binding path; the default is the plain path, measured
        as fast or faster on CPU (see ``edgespec.runtime.session``). With no ``target`` the
        built-in pair is loaded (its draft too, unless ``draft`` names another).

        ``remote`` (a URL of ``edgespec serve``, a configured :class:`RemoteTarget`, or an
        :class:`~edgespec.runtime.verifiers.engine.EngineTarget` for an OpenAI-compatible
        engine such as vLLM or llama-cpp-python's server: greedy only) verifies there; then a
        local target is loaded only when ``target`` is given or ``fallback`` is "local".
        ``fallback``: "fail" (stop, return the verified text and the error), "local" (continue
        with the local target: lossless) or "draft" (continue with the draft alone: marked
        lossy in the stats). ``remote_when`` "budget" loads the local target too and verifies
        locally until the budget policy's mode is "remote" (battery under
        ``budget.min_battery_pct``), then on the remote target; "always" (default) verifies
        every round remotely.
        """
        from tokenizers import Tokenizer

        if isinstance(remote, str):
            remote = RemoteTarget(remote, api_key=api_key)
        wants_local = remote is None or fallback == "local" or remote_when == "budget"
        if target is None and (draft is None or wants_local):
            pair = builtin_pair()
            draft = draft or pair.draft
            if wants_local:
                target = pair.target

        target_bundle = load_bundle(target, verify_checksums=verify_checksums) if target else None
        draft_bundle = load_bundle(draft, verify_checksums=verify_checksums) if draft else None
        if draft_bundle is not None and target_bundle is not None:
            report = check_pair(draft_bundle, target_bundle)
            if not report.compatible:
                raise IncompatiblePairError(
                    f"draft {draft} cannot serve target {target}: {report.reason}",
                    fix="use a draft with the target's tokenizer (edgespec pair shows the check)",
                )
        tree = Tree(telemetry_root)
        if memory_budget_mb is None and budget is not None:
            memory_budget_mb = budget.memory_mb
        admission = admit(
            estimate_pair(
                target_bundle, draft_bundle, base_bytes=base_rss_bytes(MemoryProbe(tree))
            ),
            budget_mb=memory_budget_mb,
            shrink_context=shrink_context,
        )
        options = SessionOptions(
            intra_op_threads=threads,
            spinning=False,
            io_binding=io_binding,
            max_length=admission.estimate.context,
        )
        target_session = (
            ModelSession(target_bundle, providers=target_providers, options=options)
            if target_bundle is not None
            else None
        )
        draft_session = (
            ModelSession(draft_bundle, providers=draft_providers, options=options)
            if draft_bundle is not None
            else None
        )
        text_bundle = target_bundle or draft_bundle
        if text_bundle is None:
            raise ConfigError("a remote target needs a local draft", fix="pass draft=DIR")
        spec = text_bundle.manifest.tokenizer
        template, bos, eos = _chat_settings(text_bundle)
        return cls(
            target=target_session,
            draft=draft_session,
            tokenizer=Tokenizer.from_file(str(text_bundle.tokenizer_path)),
            eos_ids=frozenset(spec.eos_token_ids),
            chat_template=template,
            bos_token=bos,
            eos_token=eos,
            telemetry=Telemetry(
                tree=tree,
                budget=budget,
                admission=admission,
                measure_energy=measure_energy,
                remote_available=remote is not None and remote_when == "budget",
            ),
            remote=remote,
            fallback=fallback,
            remote_when=remote_when,
        )

    @property
    def warnings(self) -> list[str]:
        """Provider fallbacks, and a target whose export did not show batch invariance."""
        sessions = [("target", self.target), ("draft", self.draft)]
        lines = [
            f"{name} asked for {session.requested_providers[0]} but runs on "
            f"{', '.join(session.providers)}"
            for name, session in sessions
            if session is not None and session.fell_back
        ]
        if self.target is None:
            return lines
        invariant = self.target.bundle.manifest.verification.batch_invariant
        if invariant is not True:
            lines.append(
                f"target {self.target.bundle.root} was "
                f"{'not checked' if invariant is None else 'found NOT'} batch invariant at "
                "export, so greedy speculative output may differ from its own greedy output"
            )
        return lines

    @property
    def providers(self) -> dict[str, list[str]]:
        """What really runs (ONNX Runtime falls back silently), per model."""
        found = {"target": list(self.target.providers)} if self.target else {}
        if self.draft is not None:
            found["draft"] = list(self.draft.providers)
        return found

    def encode(self, prompt: str, *, chat: bool = False) -> list[int]:
        if chat:
            prompt = self.apply_chat_template([{"role": "user", "content": prompt}])
            return list(self.tokenizer.encode(prompt, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(prompt).ids)

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> str:
        if not self.chat_template:
            raise ConfigError(
                "this bundle's tokenizer has no chat template", fix="pass the prompt as plain text"
            )
        import jinja2

        def raise_exception(message: str) -> None:  # used by many hub chat templates
            raise ConfigError(f"the chat template refused the messages: {message}")

        environment = jinja2.Environment(autoescape=False, keep_trailing_newline=True)
        environment.globals["raise_exception"] = raise_exception
        template = environment.from_string(self.chat_template)
        return template.render(messages=list(messages), add_generation_prompt=True, **self._special)

    @property
    def greedy_only(self) -> bool:
        """Whether only greedy decoding can be verified (an OpenAI-compatible engine)."""
        return isinstance(self.remote, EngineTarget)

    @property
    def build_record(self) -> dict[str, Any]:
        """How the built-in pair was trained and selected (empty for other bundles)."""
        session = self.target if self.target is not None else self.draft
        if session is None:
            return {}
        return dict(session.bundle.manifest.extra.get("builtin_pair", {}))

    @property
    def default_k(self) -> int:
        """The draft length used when none is given: the pair's measured best, else 4."""
        return int(self.build_record.get("selection", {}).get("recommended_k", DEFAULT_K))

    def cost_profile(self) -> CostProfile:
        """T(w)/T(1) and the draft step cost on this device (measured once, then cached)."""
        if self._profile is None and self.remote is not None and self.remote_when == "always":
            draft_step = measure_costs(self.draft, None, max_width=1) if self.draft else None
            self._profile = remote_profile(
                self.remote.info(),
                rtt_s=self.remote.measure_rtt(),
                draft_step_s=draft_step.target_step_s if draft_step else 0.0,
            )
        if self._profile is None:
            assert self.target is not None
            self._profile = measure_costs(self.target, self.draft)
        return self._profile

    def generate(self, prompt: str | Sequence[int], **options: Any) -> Result:
        """Generates to completion; keyword options as in :meth:`stream`."""
        generation = self.stream_deltas(prompt, **options)
        for _ in generation:
            pass
        assert generation.result is not None
        return generation.result

    def stream(self, prompt: str | Sequence[int], **options: Any) -> Iterator[str]:
        """Yields text as it is committed; same options as :meth:`stream_deltas`."""
        for delta in self.stream_deltas(prompt, **options):
            yield delta.text

    def stream_deltas(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        k: int | str | None = None,
        drafter: str | None = None,
        sampling_mode: str | None = None,
        stop: Sequence[str] = (),
        chat: bool = False,
        draft_min_probability: float = 0.0,
    ) -> Generation:
        """Validates everything first (nothing is generated on bad input), then streams.

        ``drafter`` is model (the default with a draft bundle), ngram (the default without)
        or none (k = 0: plain target decoding). ``sampling_mode``
        is rejection (default with the model drafter) or match (default with ngram/none, and
        reproducible: the same seed gives the same text with or without speculation).
        ``draft_min_probability`` ends a proposal early when the draft's own probability of
        its next token falls below it (0, the default, drafts the full k: on the measured pair
        0.03 and 0.1 lowered the speedup).
        """
        if drafter is None:
            drafter = "model" if self.draft is not None else "ngram"
        if drafter not in DRAFTERS:
            raise ConfigError(f"unknown drafter {drafter!r}", fix=f"use one of {DRAFTERS}")
        if drafter == "model" and self.draft is None:
            raise ConfigError(
                "the model drafter needs a draft bundle", fix="pass draft=... or drafter='ngram'"
            )
        if k is None:
            k = self.default_k
        if isinstance(k, str) and k != "auto":
            raise ConfigError(f"k must be a number or 'auto', not {k!r}", fix="e.g. k=4")
        if isinstance(k, int) and k < 0:
            raise ConfigError(f"k must be >= 0, not {k}", fix="use 0 for no drafting, or 1-8")
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens is {max_new_tokens}", fix="ask for at least 1")
        mode = sampling_mode or ("rejection" if drafter == "model" else "match")
        sampling = SamplingConfig(
            temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, mode=mode
        )
        if not sampling.greedy and mode == "rejection" and drafter == "ngram":
            raise ConfigError(
                "the ngram drafter has no draft probabilities, so it cannot use rejection sampling",
                fix="use sampling_mode='match' (the default for ngram)",
            )
        prompt_ids = list(prompt) if not isinstance(prompt, str) else self.encode(prompt, chat=chat)
        if not prompt_ids or (isinstance(prompt, str) and not prompt):
            raise ConfigError("the prompt is empty", fix="pass at least one character of text")
        if any(not 0 <= t < self.vocab_size for t in prompt_ids):
            raise ConfigError(
                f"prompt token ids must lie in [0, {self.vocab_size})",
                fix="encode the prompt with the bundle's tokenizer",
            )
        if len(prompt_ids) + max_new_tokens > self.max_length:
            raise ContextLimitError(
                f"the prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({max_new_tokens}) "
                f"exceeds the context limit of {self.max_length} tokens",
                fix="shorten the prompt, lower max_new_tokens, or re-export with a larger "
                "--max-length",
            )
        if self.remote is not None and isinstance(k, int) and k > self.remote.info().max_k:
            raise ConfigError(
                f"k = {k} is more than the server's limit of {self.remote.info().max_k}",
                fix="use a smaller k or k='auto'",
            )
        stop_matcher = StopMatcher(stop) if stop else None
        if not 0.0 <= draft_min_probability < 1.0:
            raise ConfigError(
                f"draft_min_probability {draft_min_probability} is outside [0, 1)",
                fix="use 0 (off) or a small probability such as 0.05",
            )
        chosen = self._drafter(drafter, draft_min_probability)
        policy: KPolicy = (
            FixedK(0)
            if drafter == "none"
            else AutoK(self.cost_profile())
            if k == "auto"
            else FixedK(int(k))
        )
        remote = None
        if self.remote is not None:
            run = remote_run(
                self.remote,
                fallback=self.fallback,
                target=self.target,
                draft=self.draft,
                pieces=self._token_pieces() if isinstance(self.remote, EngineTarget) else None,
                remote_when=self.remote_when,
            )
            if k == "auto" and drafter != "none":
                # The server's suggested k (it shrinks as its queue grows) caps auto k.
                policy = CappedK(policy, cap=lambda: run.remote.suggested_k)
            remote = run
        generation = Generation(iter(()))
        generation._pieces = self._pieces(
            generation, prompt_ids, chosen, policy, sampling, max_new_tokens, stop_matcher, remote
        )
        return generation

    def _token_pieces(self) -> TokenPieces:
        """The draft tokenizer's table of token texts for an engine verifier (built once)."""
        if self._pieces_table is None:
            bos = self._special["bos_token"]
            bos_id = self.tokenizer.token_to_id(bos) if bos else None
            self._pieces_table = TokenPieces(
                self.tokenizer,
                bos_ids=() if bos_id is None else (bos_id,),
                eos_ids=sorted(self.eos_ids),
            )
        return self._pieces_table

    def _drafter(self, name: str, stop_probability: float) -> Drafter:
        if name == "model":
            assert self.draft is not None
            return ModelDrafter(
                self.draft, vocab_size=self.vocab_size, stop_probability=stop_probability
            )
        if name == "ngram":
            return PromptLookupDrafter()
        return NoDrafter()

    def _pieces(
        self,
        generation: Generation,
        prompt_ids: list[int],
        drafter: Drafter,
        policy: KPolicy,
        sampling: SamplingConfig,
        max_new_tokens: int,
        stop_matcher: StopMatcher | None,
        remote: RemoteRun | None,
    ) -> Iterator[Delta]:
        stats = StatsCollector()
        text = TextStream(self.tokenizer)
        verifier: Verifier
        if remote is not None:
            verifier = remote.verifier
        else:
            assert self.target is not None
            verifier = LocalVerifier(self.target)
        watch = self.telemetry.watch(policy)
        if remote is not None and remote.switching is not None:
            remote.switching.use_remote = lambda: watch.mode == "remote"
        watch.start()
        rounds = decode(
            prompt_ids,
            drafter=drafter,
            verifier=verifier,
            k_policy=watch.k_policy,
            sampling=sampling,
            rng=np.random.default_rng(sampling.seed),
            max_new_tokens=max_new_tokens,
            eos_ids=self.eos_ids,
            observers=(stats,),
        )
        tokens: list[int] = []
        shown: list[str] = []
        stopped = False
        error: str | None = None
        try:
            for committed in rounds:
                n_accepted = stats.records[-1].n_accepted
                for drafted, part in (
                    (True, committed[:n_accepted]),
                    (False, committed[n_accepted:]),
                ):
                    pieces: list[str] = []
                    # Token by token, so that a stop string ends the result at the token that
                    # completed it: no token after it is kept.
                    for token in part:
                        tokens.append(token)
                        piece = text.push([token])
                        if stop_matcher is not None and piece:
                            outcome = stop_matcher.feed(piece)
                            piece, stopped = outcome.emit, outcome.stopped
                        pieces.append(piece)
                        if stopped:
                            break
                    if "".join(pieces):
                        shown.append("".join(pieces))
                        yield Delta(text=shown[-1], drafted=drafted)
                    if stopped:
                        break
                if stopped:
                    rounds.close()
                    stats.on_finish("stop_string")
                    break
        except RemoteError as failure:
            # fallback "fail", or an engine that cannot verify on: what was verified so far,
            # and the error.
            error = str(failure)
            stats.on_finish("error")
        if not stopped:
            tail = text.finish()
            if stop_matcher is not None:
                outcome = stop_matcher.feed(tail)
                tail = outcome.emit if outcome.stopped else outcome.emit + stop_matcher.flush()
                if outcome.stopped:
                    stats.on_finish("stop_string")
            if tail:
                shown.append(tail)
                yield Delta(text=tail, drafted=False)
        verifier.close()
        result_stats = stats.as_dict()
        result_stats["providers"] = self.providers
        result_stats.update(watch.stats(result_stats["new_tokens"]))
        if remote is not None:
            result_stats.update(remote.stats(len(tokens)))
        generation.result = Result(
            text="".join(shown),
            tokens=tuple(tokens),
            finish_reason=stats.finish_reason,
            stats=result_stats,
            error=error,
        )


def _chat_settings(bundle: Bundle) -> tuple[str | None, str | None, str | None]:
    """The chat template and bos/eos strings from the bundle's tokenizer_config.json."""
    config_path = bundle.root / "tokenizer_config.json"
    template = None
    if config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
    jinja_path = bundle.root / "chat_template.jinja"
    if template is None and jinja_path.is_file():
        template = jinja_path.read_text(encoding="utf-8")
    special = bundle.manifest.tokenizer.special_tokens
    return template, special.get("bos_token"), special.get("eos_token")
