"""A catalog model's bundle and its draft's, fetched and imported on first use; the default
pair every command uses when no bundle is named.

``EDGESPEC_TARGET`` (and ``EDGESPEC_DRAFT``) name other bundles to use by default instead of
the default model.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import BundleError
from edgespec.manifest import Bundle, load_bundle
from edgespec.models.catalog import (
    CATALOG,
    DRAFT_HEAD_TYPE,
    DRAFT_REQUANTIZE,
    CatalogModel,
    default_model,
)
from edgespec.models.fetch import convert_once, gguf_file, notify_stderr
from edgespec.models.store import (
    SOURCE_RECORD,
    Notify,
    bundle_dir,
    cache_dir,
    cached_or_built,
    draft_dir,
    file_bundle_dir,
    file_digest,
    head_dir,
    shipped_draft_path,
    shipped_head_path,
)

#: Environment variables naming the bundles used when no target (draft) is given.
TARGET_ENV, DRAFT_ENV = "EDGESPEC_TARGET", "EDGESPEC_DRAFT"


def model_bundle(
    model: CatalogModel,
    *,
    cache: Path | None = None,
    verify_checksums: bool = True,
    notify: Notify = notify_stderr,
) -> Bundle:
    """``model``'s cached bundle, fetched and imported first when absent."""
    root = bundle_dir(model, cache)

    def build() -> Bundle:
        path = gguf_file(model, cache or cache_dir(), notify)
        return convert_once(str(path), root, model.title, notify, system_prompt=model.system_prompt)

    return cached_or_built(root, build, verify_checksums=verify_checksums, notify=notify)


def draft_bundle(
    model: CatalogModel,
    *,
    cache: Path | None = None,
    verify_checksums: bool = True,
    notify: Notify = notify_stderr,
) -> Bundle | None:
    """The bundle of what drafts for ``model``: its shipped draft, its catalog draft (with a
    reduced head when the catalog says so), or None (prompt lookup drafts)."""
    root = draft_dir(model, cache)
    if root is None:
        if model.draft is None:
            return None
        draft = CATALOG[model.draft]
        return model_bundle(draft, cache=cache, verify_checksums=verify_checksums, notify=notify)
    shipped = shipped_draft_path(model)

    def build() -> Bundle:
        if shipped is not None:
            title = f"the draft of {model.title}"
            return convert_once(
                str(shipped), root, title, notify, system_prompt=model.system_prompt
            )
        return _import_with_head(model, root, cache or cache_dir(), notify)

    return cached_or_built(root, build, verify_checksums=verify_checksums, notify=notify)


def head_bundle(
    model: CatalogModel,
    *,
    cache: Path | None = None,
    verify_checksums: bool = True,
    notify: Notify = notify_stderr,
) -> Bundle | None:
    """The bundle of the head edgespec ships for ``model`` (built on first use from the head
    file and the model's GGUF, after :func:`model_bundle` has fetched it), or None."""
    root, shipped = head_dir(model, cache), shipped_head_path(model)
    if root is None or shipped is None:
        return None
    target = model_bundle(model, cache=cache, verify_checksums=verify_checksums, notify=notify)

    def build() -> Bundle:
        from edgespec.export.gguf.reader import open_gguf
        from edgespec.export.head.bundle import head_bundle as build_head

        notify(f"edgespec: building the head on {model.title} (once) ...")
        return build_head(
            shipped,
            open_gguf(gguf_file(model, cache or cache_dir(), notify)),
            target_sha256=target.manifest.source.config_sha256,
            out=root,
            capacity=target.manifest.model.max_length,
        )

    return cached_or_built(root, build, verify_checksums=verify_checksums, notify=notify)


def gguf_file_bundle(
    path: Path,
    *,
    cache: Path | None = None,
    verify_checksums: bool = True,
    notify: Notify = notify_stderr,
) -> Bundle:
    """The bundle of a GGUF file given by its path: imported once into the cache with the
    importer's progress (keyed by the file's sha256 and the importer's revision), then
    loaded from there."""
    root = file_bundle_dir(path, file_digest(path, cache), cache)

    def build() -> Bundle:
        bundle = convert_once(str(path), root, path.name, notify)
        (root / SOURCE_RECORD).write_text(f"{path.resolve()}\n", encoding="utf-8")
        return bundle

    return cached_or_built(root, build, verify_checksums=verify_checksums, notify=notify)


def _import_with_head(model: CatalogModel, root: Path, cache: Path, notify: Notify) -> Bundle:
    """Imports ``model``'s catalog draft as a draft: a head over its most used tokens and its
    layers' wider blocks and the head's rows as 4-bit ones (a reduced copy of its GGUF,
    deleted once imported)."""
    from edgespec.export.draft_head import reduced_head_gguf

    assert model.draft is not None
    draft, size = CATALOG[model.draft], model.draft_head_tokens
    path = gguf_file(draft, cache, notify)
    notify(
        f"edgespec: giving {draft.title} a 4-bit head over its {size:,} most used tokens and "
        "4-bit layers, as a draft ..."
    )
    # Beside the kept file (same disk), not beside an installed package's.
    folder_root = cache / "downloads"
    folder_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder_root, prefix=".head-") as folder:
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


@dataclass(frozen=True, kw_only=True)
class DefaultPair:
    """The bundles used when none are named: a target, and a draft when one is configured or
    shipped (the default model's is distilled for it; its record recommends the combined
    drafter: prompt lookup when the context matches, the draft otherwise)."""

    target: Bundle
    draft: Bundle | None


def configured_pair(*, verify_checksums: bool = True) -> DefaultPair | None:
    """The bundles $EDGESPEC_TARGET (with $EDGESPEC_DRAFT) name, or None when it is not set."""
    named = os.environ.get(TARGET_ENV)
    if not named:
        return None
    draft = os.environ.get(DRAFT_ENV)
    return DefaultPair(
        target=_load_named(named, TARGET_ENV, verify_checksums),
        draft=_load_named(draft, DRAFT_ENV, verify_checksums) if draft else None,
    )


def default_pair(*, verify_checksums: bool = True, notify: Notify = notify_stderr) -> DefaultPair:
    """$EDGESPEC_TARGET (with $EDGESPEC_DRAFT) when set, else the default model's bundle and
    its draft's, fetched and converted on first use."""
    configured = configured_pair(verify_checksums=verify_checksums)
    if configured is not None:
        return configured
    model = default_model()
    return DefaultPair(
        target=model_bundle(model, verify_checksums=verify_checksums, notify=notify),
        draft=draft_bundle(model, verify_checksums=verify_checksums, notify=notify),
    )


def _load_named(path: str, variable: str, verify_checksums: bool) -> Bundle:
    try:
        return load_bundle(path, verify_checksums=verify_checksums)
    except BundleError as error:
        raise type(error)(
            f"{variable}={path}: {error.problem}", fix=f"{error.fix}, or unset {variable}"
        ) from error
