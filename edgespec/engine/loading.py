"""Loading a pair: bundles (or the default model), the pairing check, memory admission, the
ONNX Runtime sessions and the tokenizer. Everything a generation needs that outlives it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgespec.config import BudgetConfig
from edgespec.engine.catalog_drafts import HEADLESS_DRAFTERS, catalog_draft_for, drafts_with_a_model
from edgespec.engine.options import DEFAULT_DRAFT_WINDOW
from edgespec.engine.pairing import check_head, check_pair
from edgespec.errors import ConfigError, IncompatiblePairError
from edgespec.graph.window import SINK
from edgespec.manifest import Bundle, load_bundle, starts_with_gguf_magic
from edgespec.models import catalog
from edgespec.models.bundles import configured_pair, gguf_file_bundle, model_bundle
from edgespec.models.bundles import draft_bundle as draft_bundle_of
from edgespec.models.bundles import head_bundle as head_bundle_of
from edgespec.protocol.server_info import ChatFormat
from edgespec.runtime.model import ModelOptions, OnnxModel
from edgespec.telemetry.estimate import MIN_CONTEXT, Admission, admit, estimate_pair
from edgespec.telemetry.memory import MemoryProbe, base_rss_bytes
from edgespec.telemetry.sysfs import Tree

#: The shortest draft window (:mod:`edgespec.graph.window`): twice its sink.
MIN_DRAFT_WINDOW = 2 * SINK


@dataclass(frozen=True, kw_only=True)
class LoadRequest:
    """Which bundles to load and how (see :meth:`edgespec.api.Engine.load`)."""

    target: str | Path | None = None
    draft: str | Path | None = None
    #: A head bundle on the target (``edgespec distill --head``); a catalog model's shipped
    #: head is loaded without naming it, unless ``heads`` is False.
    head: str | Path | None = None
    heads: bool = True
    #: The drafter the caller will run, when it knows: "model" loads the draft and no head,
    #: "head" the head and no draft; None or another loads the catalog model's head where it
    #: ships one (and then no draft model) and its draft otherwise.
    drafter: str | None = None
    #: A catalog model's name (``edgespec.models.catalog``): it and its draft, fetched on first use.
    model: str | None = None
    target_providers: Sequence[str] | None = None
    draft_providers: Sequence[str] | None = None
    threads: int = 0
    #: The verifying session's threads wait for their next kernel by spinning (see
    #: :func:`session_options`); False lets them sleep: slower, gentler on shared cores.
    spinning: bool = True
    io_binding: bool | None = None
    #: ONNX Runtime's CPU memory arena (:class:`~edgespec.runtime.model.ModelOptions`); a
    #: long-running server turns it off so that a long request's buffers do not outlive it.
    memory_arena: bool = True
    verify_checksums: bool = True
    memory_budget_mb: float | None = None
    #: Tokens of context the sessions run at, up to the models' own (their KV caches are
    #: allocated for it); None: 4,096, or the models' own if that is shorter.
    context: int | None = None
    shrink_context: bool = False
    #: The draft model's attention over its last this many positions and the first 128
    #: (:mod:`edgespec.graph.window`); 0: its whole history; None: the default,
    #: :data:`~edgespec.engine.options.DEFAULT_DRAFT_WINDOW`.
    draft_window: int | None = None
    budget: BudgetConfig | None = None
    telemetry_root: str | Path = "/"

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ConfigError(f"threads is {self.threads}", fix="use 0 (automatic) or a count")
        if self.context is not None and self.context < MIN_CONTEXT:
            raise ConfigError(
                f"a context of {self.context} tokens is too short",
                fix=f"pass --context {MIN_CONTEXT} or more",
            )
        if self.draft_window is not None and 0 < self.draft_window < MIN_DRAFT_WINDOW:
            raise ConfigError(
                f"a draft window of {self.draft_window} positions is shorter than the "
                f"{SINK} first positions it keeps",
                fix=f"pass --draft-window {MIN_DRAFT_WINDOW} or more, or 0 for the whole history",
            )
        if self.model is not None and self.target is not None:
            raise ConfigError(
                "pass a model name or a target bundle, not both",
                fix="drop --target (or --model)",
            )


@dataclass(frozen=True, kw_only=True)
class ChatTemplate:
    """A bundle's Jinja chat template with the special-token strings it may use."""

    source: str
    bos_token: str
    eos_token: str
    #: Put first when the messages hold no system message (the bundle's ``system_prompt``).
    system_prompt: str | None = None

    @classmethod
    def from_format(cls, chat: ChatFormat) -> ChatTemplate:
        """The template a remote target described (``ServerInfo.chat``)."""
        return cls(
            source=chat.template,
            bos_token=chat.bos_token,
            eos_token=chat.eos_token,
            system_prompt=chat.system_prompt,
        )

    def to_format(self) -> ChatFormat:
        """What ``edgespec serve`` tells devices that format chats for it."""
        return ChatFormat(
            template=self.source,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            system_prompt=self.system_prompt,
        )

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        import jinja2

        conversation = list(messages)
        if self.system_prompt and not any(m.get("role") == "system" for m in conversation):
            conversation.insert(0, {"role": "system", "content": self.system_prompt})

        def raise_exception(message: str) -> None:  # used by many hub chat templates
            raise ConfigError(f"the chat template refused the messages: {message}")

        environment = jinja2.Environment(autoescape=False, keep_trailing_newline=True)
        environment.globals["raise_exception"] = raise_exception
        template = environment.from_string(self.source)
        return template.render(
            messages=conversation,
            add_generation_prompt=True,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )


@dataclass(frozen=True, kw_only=True)
class LoadedPair:
    """The local target and draft models (either may be absent), the tokenizer of the pair,
    and the memory admission that sized their context."""

    target: OnnxModel | None
    draft: OnnxModel | None
    tokenizer: Any
    eos_ids: frozenset[int]
    bos_token: str | None
    chat_template: ChatTemplate | None
    admission: Admission
    tree: Tree
    #: A head on the target, which drafts from its features (None: none loaded).
    head: OnnxModel | None = None


def resolve_bundles(
    request: LoadRequest, *, wants_target: bool
) -> tuple[Bundle | None, Bundle | None]:
    """The target and draft bundles: those named; else those $EDGESPEC_TARGET and
    $EDGESPEC_DRAFT name; else a catalog model's, the named one or the default one
    (:mod:`edgespec.models`). With a remote target (``wants_target`` False) and no draft
    named, the model's draft drafts, else the model itself does."""
    checks = request.verify_checksums
    target_bundle = bundle_at(request.target, checks) if request.target else None
    draft_bundle = bundle_at(request.draft, checks) if request.draft else None
    wanted = request.model is not None or (
        target_bundle is None and (wants_target or draft_bundle is None)
    )
    configured = (
        configured_pair(verify_checksums=checks) if wanted and request.model is None else None
    )
    if configured is not None:
        if wants_target:
            target_bundle = configured.target
            if request.draft is None:
                draft_bundle = configured.draft
        elif draft_bundle is None:
            draft_bundle = configured.draft or configured.target
    elif wanted:
        named = catalog.find(request.model) if request.model else catalog.default_model()
        if wants_target:  # first: what a first use must fetch, before its draft is made
            target_bundle = model_bundle(named, verify_checksums=checks)
        # A head drafts: the draft model is neither loaded nor made.
        if draft_bundle is None and request.drafter != "head":
            draft_bundle = draft_bundle_of(named, verify_checksums=checks)
        if draft_bundle is None and not wants_target:  # a remote target verifies
            draft_bundle = model_bundle(named, verify_checksums=checks)  # the model drafts
    elif (
        target_bundle is not None and draft_bundle is None and drafts_with_a_model(request.drafter)
    ):
        check_context(request.context, target_bundle)  # refused before a draft is looked for
        draft_bundle = catalog_draft_for(target_bundle, verify_checksums=checks)
    if draft_bundle is not None and target_bundle is not None:
        report = check_pair(draft_bundle, target_bundle)
        if not report.compatible:
            raise IncompatiblePairError(
                f"draft {draft_bundle.root} cannot serve target {target_bundle.root}: "
                f"{report.reason}",
                fix="use a draft with the target's tokenizer (edgespec pair shows the check)",
            )
    return target_bundle, draft_bundle


def bundle_at(path: str | Path, verify_checksums: bool) -> Bundle:
    """The bundle at ``path``: a bundle directory, or a GGUF file, imported into the cache on
    its first use (keyed by its sha256) and loaded from there afterwards."""
    if Path(path).is_file() and starts_with_gguf_magic(Path(path)):
        return gguf_file_bundle(Path(path), verify_checksums=verify_checksums)
    return load_bundle(path, verify_checksums=verify_checksums)


def check_context(context: int | None, *bundles: Bundle | None) -> None:
    """Refuses a context longer than a model's own, naming the longest one allowed."""
    held = [bundle for bundle in bundles if bundle is not None]
    if context is None or not held:
        return
    longest = min(bundle.manifest.context(bundle.manifest.model.max_length) for bundle in held)
    if context > longest:
        short = min(held, key=lambda b: b.manifest.context(b.manifest.model.max_length))
        raise ConfigError(
            f"a context of {context} tokens is longer than {short.root.name} runs at "
            f"({longest} tokens, the model's own or its import's)",
            fix=f"pass --context {longest} or less",
        )


def load_pair(request: LoadRequest, *, wants_target: bool = True) -> LoadedPair:
    """Loads and validates the bundles, admits them against the memory budget (from the
    manifests, before any session exists) and creates the sessions."""
    from tokenizers import Tokenizer

    target_bundle, draft_bundle = resolve_bundles(request, wants_target=wants_target)
    head = resolve_head(request, target_bundle)
    if head is not None and request.draft is None and request.drafter != "model":
        draft_bundle = None  # the head drafts: no draft model beside it
    tree = Tree(request.telemetry_root)
    budget_mb = request.memory_budget_mb
    if budget_mb is None and request.budget is not None:
        budget_mb = request.budget.memory_mb
    check_context(request.context, target_bundle, draft_bundle, head)
    admission = admit(
        estimate_pair(
            target_bundle,
            draft_bundle,
            head=head,
            base_bytes=base_rss_bytes(MemoryProbe(tree)),
            context=request.context,
        ),
        budget_mb=budget_mb,
        shrink_context=request.shrink_context,
    )
    target_options, draft_options = session_options(
        request,
        local_target=target_bundle is not None,
        context=admission.estimate.context,
        draft_weight_bytes=draft_bundle.manifest.memory.weight_bytes if draft_bundle else 0,
    )
    text_bundle = target_bundle or draft_bundle
    if text_bundle is None:
        raise ConfigError("a remote target needs a local draft", fix="pass a draft bundle")
    special = text_bundle.manifest.tokenizer.special_tokens
    return LoadedPair(
        target=_model(target_bundle, request.target_providers, target_options),
        draft=_model(draft_bundle, request.draft_providers, draft_options),
        # a head's one layer reads its whole history (a twenty-eighth of the 1.5B's attention
        # a position): no window, so it drafts as it was trained and measured
        head=_model(
            head,
            request.draft_providers,
            replace(draft_options, intra_op_threads=1, attention_window=0),
        ),
        tokenizer=Tokenizer.from_file(str(text_bundle.tokenizer_path)),
        eos_ids=frozenset(text_bundle.manifest.tokenizer.eos_token_ids),
        bos_token=special.get("bos_token"),
        chat_template=chat_template(text_bundle),
        admission=admission,
        tree=tree,
    )


def resolve_head(request: LoadRequest, target: Bundle | None) -> Bundle | None:
    """The head on the target: the one named, else the catalog model's shipped head (when
    the target is the catalog model's, verified here, and the drafter may use it); refused
    when it was made for another target."""
    if target is None or request.drafter in HEADLESS_DRAFTERS:
        if request.head is not None and target is None:
            raise ConfigError(
                "a head drafts from the local target's features, and no target is loaded here",
                fix="drop --head (hybrid verification keeps model drafts), or load a target",
            )
        return None
    head = None
    if request.head is not None:
        head = load_bundle(request.head, verify_checksums=request.verify_checksums)
    elif request.heads and configured_pair() is None:
        # A head is made for one file: a target named by path gets its catalog model's
        # shipped head only when it is that model's own file.
        named = (
            catalog.model_of_file(target.manifest.source.config_sha256)
            if request.target is not None
            else catalog.find(request.model)
            if request.model
            else catalog.default_model()
        )
        if named is not None:
            head = head_bundle_of(named, verify_checksums=request.verify_checksums)
    if head is None:
        return None
    report = check_head(head, target)
    if report is not None:
        raise IncompatiblePairError(
            f"head {head.root} cannot serve target {target.root}: {report}",
            fix="train a head for this target with 'edgespec distill --head TARGET'",
        )
    return head


#: Weights above which a draft beside a local target gets the target's threads (see
#: :func:`session_options`).
THREADED_DRAFT_BYTES = 100 << 20


def session_options(
    request: LoadRequest, *, local_target: bool, context: int, draft_weight_bytes: int = 0
) -> tuple[ModelOptions, ModelOptions]:
    """Threading and pass shapes of the target's and the draft's sessions.

    A step of a small model is hundreds of short kernels; between two of them ONNX Runtime's
    worker threads either spin or sleep, and waking a sleeping thread costs more than many
    kernels take. So the session that verifies (the target, or the draft when verification is
    remote) spins (docs/runtime.md, "Execution providers and threads", has the measured gain).
    Two spinning sessions steal each other's cores, so beside a local target the draft does
    not spin. A small draft runs on the calling thread alone (intra-op 1: no worker threads),
    which measured faster than a 2-thread draft whether or not it spins: its kernels are too
    short to pay for waking a worker. A draft of more than :data:`THREADED_DRAFT_BYTES` of
    weights gets the target's threads (faster for Qwen2.5-Coder-0.5B drafting for the 1.5B:
    docs/runtime.md, "Execution providers and threads"), and the target's threads then stop
    spinning at the end of each of its passes.
    """
    target = ModelOptions(
        intra_op_threads=request.threads,
        spinning=request.spinning,
        io_binding=request.io_binding,
        max_length=context,
        memory_arena=request.memory_arena,
    )
    # A draft's proposals are checked by the target, so its passes need not be batch
    # invariant: its one-token steps run unpadded (runtime.model.ModelOptions.exact_passes).
    window = DEFAULT_DRAFT_WINDOW if request.draft_window is None else request.draft_window
    draft = replace(target, exact_passes=False, attention_window=window)
    if not local_target:
        return target, draft
    small = draft_weight_bytes <= THREADED_DRAFT_BYTES
    if request.spinning and small:
        return target, replace(draft, intra_op_threads=1, spinning=False)
    # The draft's threads run on the target's cores: the target's threads stop spinning when
    # its pass ends, or they hold those cores through the draft's steps (measured:
    # docs/runtime.md, "Execution providers and threads").
    target = replace(target, stop_spinning_after_run=True)
    return target, replace(draft, intra_op_threads=request.threads, spinning=False)


def _model(
    bundle: Bundle | None, providers: Sequence[str] | None, options: ModelOptions
) -> OnnxModel | None:
    return None if bundle is None else OnnxModel(bundle, providers=providers, options=options)


def chat_template(bundle: Bundle) -> ChatTemplate | None:
    """The chat template from the bundle's tokenizer_config.json (or chat_template.jinja)."""
    config_path = bundle.root / "tokenizer_config.json"
    source = None
    if config_path.is_file():
        source = json.loads(config_path.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(source, list):  # named templates: take the default one
            source = next((t["template"] for t in source if t.get("name") == "default"), None)
    jinja_path = bundle.root / "chat_template.jinja"
    if source is None and jinja_path.is_file():
        source = jinja_path.read_text(encoding="utf-8")
    if not source:
        return None
    special = bundle.manifest.tokenizer.special_tokens
    return ChatTemplate(
        source=source,
        bos_token=special.get("bos_token") or "",
        eos_token=special.get("eos_token") or "",
        system_prompt=bundle.manifest.system_prompt,
    )
