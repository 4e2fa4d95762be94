"""What edgespec keeps in its cache folder, what each entry is for, and pruning it.

The cache (:mod:`edgespec.models.store` draws its layout) holds, per catalog model, the
imported bundle, the bundle of the draft made for it, and the GGUF the bundle was imported
from, kept so that a damaged or outdated bundle is imported again without the network. Beside
them: bundles no catalog entry of this edgespec loads (older importer revisions, older names),
unfinished imports and downloads whose process is gone, the stored device profiles, and what
the test suite and the benchmarks build.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgespec.export.bundle import PARTIAL_NAME, owner_alive
from edgespec.models.catalog import CATALOG, CatalogModel
from edgespec.models.store import bundle_dir, cache_dir, draft_dir, head_dir, source_path

#: An unfinished download or draft reduction (a temporary folder without an owner's process
#: id) older than this is taken as left behind by a process that was killed.
LEFT_BEHIND_S = 3600.0


@dataclass(frozen=True, kw_only=True)
class CacheEntry:
    """One file or folder of the cache."""

    path: Path
    #: "bundle", "draft bundle", "source", "stale bundle", "stale source", "unfinished", or
    #: what else it is
    #: ("device profiles", "llama.cpp build", "test files", "benchmark files").
    kind: str
    #: The catalog model it belongs to (None: none does).
    model: str | None
    size_bytes: int
    #: How it comes back once removed, in words.
    comes_back: str
    #: Whether it comes back without the network.
    offline: bool

    @property
    def prunable_without_asking(self) -> bool:
        return self.kind in ("stale bundle", "stale source", "unfinished")


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


def model_paths(model: CatalogModel, cache: Path) -> dict[str, Path]:
    """``model``'s bundle, the bundle of the draft made for it (a shipped draft, or a catalog
    draft with a reduced head; a catalog draft used as it is is a model of its own), and its
    source."""
    paths = {"bundle": bundle_dir(model, cache), "source": source_path(model, cache)}
    draft = draft_dir(model, cache)
    if draft is not None:
        paths["draft bundle"] = draft
    head = head_dir(model, cache)
    if head is not None:
        paths["head bundle"] = head
    return paths


@dataclass(frozen=True, kw_only=True)
class Footprint:
    """A catalog model with what drafts for it: what a first use fetches, and what the cache
    then holds (bundles and kept sources; measured where cached)."""

    download_mb: int
    disk_mb: int


def footprint(model: CatalogModel, cache: Path | None = None) -> Footprint:
    cache = cache or cache_dir()
    members = [model]
    if model.draft is not None:
        members.append(CATALOG[model.draft])
    download = sum(member.download_mb for member in members)
    # A catalog draft used as it is has a bundle of its own; one with a reduced head (or a
    # shipped draft) has the draft bundle recorded on the model.
    bundles = [(bundle_dir(model, cache), model.bundle_mb)]
    if model.draft is not None and not model.draft_head_tokens:
        draft = CATALOG[model.draft]
        bundles.append((bundle_dir(draft, cache), draft.bundle_mb))
    drafted = model_paths(model, cache).get("draft bundle")
    if drafted is not None:
        bundles.append((drafted, model.draft_bundle_mb))
    disk = sum(
        size_of(path) / 1e6 if path.exists() else (recorded or 0) for path, recorded in bundles
    )
    for member in members:
        source = source_path(member, cache)
        disk += size_of(source) / 1e6 if source.exists() else member.download_mb
    return Footprint(download_mb=download, disk_mb=round(disk))


def inventory(cache: Path | None = None) -> list[CacheEntry]:
    """Every entry of the cache, catalog models' first (in catalog order)."""
    cache = cache or cache_dir()
    if not cache.is_dir():
        return []
    known: dict[Path, CacheEntry] = {}
    for model in CATALOG.values():
        for kind, path in model_paths(model, cache).items():
            if path.exists():
                comes_back, offline = _comes_back(model, kind, cache)
                known[path] = CacheEntry(
                    path=path,
                    kind=kind,
                    model=model.name,
                    size_bytes=size_of(path),
                    comes_back=comes_back,
                    offline=offline,
                )
    entries = list(known.values())
    every_path = {path for model in CATALOG.values() for path in model_paths(model, cache).values()}
    entries += [entry for entry in _others(cache, every_path) if entry.path not in known]
    return entries


def _comes_back(model: CatalogModel, kind: str, cache: Path) -> tuple[str, bool]:
    """How an entry of ``model`` comes back once removed, and whether that needs no network."""
    if kind == "source":
        return "fetched again from the package index", False
    if kind == "draft bundle" and model.shipped_draft is not None:
        return "imported again from the draft edgespec ships, on next use", True
    if kind == "head bundle":
        return "built again from the head edgespec ships and the kept source, on next use", True
    # A reduced-head draft is imported from its catalog draft's source.
    origin = CATALOG[model.draft or model.name] if kind == "draft bundle" else model
    if source_path(origin, cache).exists():
        return "imported again from its kept source, on next use", True
    return "fetched and imported again, on next use", False


def _others(cache: Path, known: set[Path]) -> Iterator[CacheEntry]:
    models = cache / "models"
    for path in sorted(models.iterdir()) if models.is_dir() else []:
        if path.name.endswith(".lock"):
            continue
        named = PARTIAL_NAME.fullmatch(path.name)
        if named is not None:
            if not owner_alive(int(named.group("pid"))):
                yield _unfinished(path, "an import whose process is gone")
            continue
        if path.is_dir() and path not in known:
            yield CacheEntry(
                path=path,
                kind="stale bundle",
                model=None,
                size_bytes=size_of(path),
                comes_back="not needed: no catalog entry of this edgespec loads it",
                offline=True,
            )
    downloads = cache / "downloads"
    now = time.time()
    for path in sorted(downloads.iterdir()) if downloads.is_dir() else []:
        if path.name.startswith("."):
            if path.is_dir() and now - path.stat().st_mtime > LEFT_BEHIND_S:
                yield _unfinished(path, "a download whose process is gone")
        elif path not in known:
            yield CacheEntry(
                path=path,
                kind="stale source",
                model=None,
                size_bytes=size_of(path),
                comes_back="not needed: no catalog entry of this edgespec imports it",
                offline=True,
            )
    files = cache / "files"
    for path in sorted(files.iterdir()) if files.is_dir() else []:
        if path.is_dir():
            yield _file_bundle(path)
    for name, kind, what in (
        ("profiles", "device profiles", "measured again by 'edgespec pair --profile'"),
        ("llama.cpp", "llama.cpp build", "built again by tools/build_llama_server.sh"),
        ("tests", "test files", "made again by the test suite"),
        ("bench", "benchmark files", "made again by the benchmarks"),
    ):
        path = cache / name
        if path.exists():
            yield CacheEntry(
                path=path,
                kind=kind,
                model=None,
                size_bytes=size_of(path),
                comes_back=what,
                offline=name != "tests",
            )


def _file_bundle(path: Path) -> CacheEntry:
    """A GGUF file's import (``--target FILE``): stale when its file is gone, or when another
    importer revision made it."""
    from edgespec.models.store import SOURCE_RECORD, importer_revision

    named = PARTIAL_NAME.fullmatch(path.name)
    if named is not None and not owner_alive(int(named.group("pid"))):
        return _unfinished(path, "an import whose process is gone")
    record = path / SOURCE_RECORD
    source = Path(record.read_text(encoding="utf-8").strip()) if record.is_file() else None
    current = path.name.endswith(f"-{importer_revision()}")
    if source is None or not source.is_file() or not current:
        reason = "its file is gone" if source is None or not source.is_file() else "an older import"
        return CacheEntry(
            path=path,
            kind="stale bundle",
            model=None,
            size_bytes=size_of(path),
            comes_back=f"not needed: {reason}",
            offline=True,
        )
    return CacheEntry(
        path=path,
        kind=f"file bundle of {source}",
        model=None,
        size_bytes=size_of(path),
        comes_back=f"imported again from {source}, on next use",
        offline=True,
    )


def _unfinished(path: Path, what: str) -> CacheEntry:
    return CacheEntry(
        path=path,
        kind="unfinished",
        model=None,
        size_bytes=size_of(path),
        comes_back=f"not needed: {what}",
        offline=True,
    )


def to_prune(
    entries: list[CacheEntry], *, model: str | None, sources: bool, stale: bool
) -> list[CacheEntry]:
    """The entries a prune removes: ``model``'s bundles and source; the sources of imported
    models (``sources``); stale bundles and unfinished imports and downloads (``stale``)."""
    imported = {entry.model for entry in entries if entry.kind == "bundle"}

    def chosen(entry: CacheEntry) -> bool:
        if model is not None and entry.model == model:
            return True
        if sources and entry.kind == "source" and entry.model in imported:
            return True
        return stale and entry.prunable_without_asking

    return [entry for entry in entries if chosen(entry)]


def remove(entry: CacheEntry) -> None:
    if entry.path.is_dir():
        shutil.rmtree(entry.path)
    else:
        entry.path.unlink(missing_ok=True)


def cached_size_mb(model: CatalogModel, cache: Path | None = None) -> float | None:
    """``model``'s cached bundle's size on disk (None: not cached)."""
    root = bundle_dir(model, cache)
    return size_of(root) / 1e6 if (root / "manifest.json").is_file() else None
