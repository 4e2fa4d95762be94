"""The cache: where fetched sources and imported bundles live, one layout for every model.

    CACHE/downloads/GGUF_NAME                  a model's file, kept so that a damaged or
                                               outdated bundle is imported again offline
    CACHE/models/NAME-REVISION                 a catalog model's bundle
    CACHE/models/NAME-draft-FORM-REVISION      the draft made for it (shipped, or a catalog
                                               draft with a reduced head)
    CACHE/models/NAME-head-HASH-REVISION       the head on it that edgespec ships, built from
                                               the head file and the model's own GGUF
    CACHE/files/STEM-HASH-REVISION             a GGUF file given by its path (--target FILE),
                                               keyed by the file's sha256; SOURCE_RECORD in it
                                               names the file

REVISION is the importer's (:func:`importer_revision`), so a newer edgespec whose graphs or
tokenizer differ imports again instead of loading a stale bundle. A bundle is built under a
lock, so two first uses at once import it once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.manifest import Bundle, load_bundle, sha256_of_file
from edgespec.models.catalog import DRAFT_FORM, CatalogModel

#: Overrides the cache directory (default ``$XDG_CACHE_HOME/edgespec``, else ~/.cache/edgespec).
CACHE_ENV = "EDGESPEC_CACHE"
#: Where edgespec keeps the drafts and the heads it ships.
DRAFTS_DIR = Path(__file__).resolve().parent.parent / "data" / "drafts"
HEADS_DIR = Path(__file__).resolve().parent.parent / "data" / "heads"

Notify = Callable[[str], None]


def cache_dir() -> Path:
    """Where fetched and converted models live: $EDGESPEC_CACHE, else
    $XDG_CACHE_HOME/edgespec, else ~/.cache/edgespec."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "edgespec"


def importer_revision() -> str:
    """The GGUF importer's revision as cached bundles' names carry it: its graph's and its
    tokenizer's, and an ``m`` where the bundles hold ONNX Runtime's MatMulNBits."""
    from edgespec.export.gguf.graph import GRAPH_REVISION
    from edgespec.export.gguf.tokenizer import TOKENIZER_REVISION
    from edgespec.graph.kernels import cuda_available, gguf_kernel_library

    # A build without the GGUF kernels, or with CUDA (where --kernels auto picks ONNX
    # Runtime's MatMulNBits), imports into other graphs: keep them apart.
    on_kernels = gguf_kernel_library() is not None and not cuda_available()
    kernels = "" if on_kernels else "m"
    return f"r{GRAPH_REVISION}t{TOKENIZER_REVISION}{kernels}"


def bundle_dir(model: CatalogModel, cache: Path | None = None) -> Path:
    """Where ``model``'s bundle is cached."""
    return (cache or cache_dir()) / "models" / f"{model.name}-{importer_revision()}"


def shipped_draft_path(model: CatalogModel) -> Path | None:
    """The draft GGUF edgespec ships for ``model``, if any."""
    path = DRAFTS_DIR / model.shipped_draft if model.shipped_draft else None
    return path if path is not None and path.is_file() else None


def shipped_head_path(model: CatalogModel) -> Path | None:
    """The head file edgespec ships for ``model`` (``edgespec distill --head``), if any."""
    path = HEADS_DIR / f"{model.name}.head.gguf"
    return path if path.is_file() else None


def head_dir(model: CatalogModel, cache: Path | None = None) -> Path | None:
    """Where ``model``'s shipped head is built (its file's hash in the name: a new head
    builds again); None when edgespec ships none for it."""
    shipped = shipped_head_path(model)
    if shipped is None:
        return None
    form = sha256_of_file(shipped)[:12]
    return (cache or cache_dir()) / "models" / f"{model.name}-head-{form}-{importer_revision()}"


#: The file in a path-given GGUF's bundle that names the file it was imported from.
SOURCE_RECORD = "source-path.txt"
#: Where the sha256 of path-given files are kept by (path, size, modification time), so a
#: later start does not hash a large file again.
DIGESTS = "digests.json"


def file_digest(path: Path, cache: Path | None = None) -> str:
    """The sha256 of ``path``, read from the cache's record when the file's size and
    modification time are those recorded, else computed and recorded."""
    import json

    record_path = (cache or cache_dir()) / "files" / DIGESTS
    stat = path.stat()
    key = str(path.resolve())
    try:
        records = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        records = {}
    known = records.get(key) if isinstance(records, dict) else None
    if (
        isinstance(known, dict)
        and known.get("size") == stat.st_size
        and known.get("mtime_ns") == stat.st_mtime_ns
    ):
        return str(known["sha256"])
    digest = sha256_of_file(path)
    records = records if isinstance(records, dict) else {}
    records[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest}
    record_path.parent.mkdir(parents=True, exist_ok=True)
    scratch = record_path.with_name(record_path.name + f".{os.getpid()}.tmp")
    scratch.write_text(json.dumps(records, indent=1), encoding="utf-8")
    os.replace(scratch, record_path)
    return digest


def file_bundle_dir(path: Path, digest: str, cache: Path | None = None) -> Path:
    """Where a GGUF file given by its path is imported: its name, its hash, the importer's
    revision (a changed file, or a newer importer, imports again)."""
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in path.stem)[:60]
    return (cache or cache_dir()) / "files" / f"{stem}-{digest[:12]}-{importer_revision()}"


def draft_dir(model: CatalogModel, cache: Path | None = None) -> Path | None:
    """Where the draft made for ``model`` is cached: a shipped draft (its file's hash and the
    target's system prompt in the name, so a new draft imports again) or its catalog draft
    with a reduced head; None when its draft, if any, is a catalog model used as it is."""
    shipped = shipped_draft_path(model)
    if shipped is not None:
        # The draft carries the target's system prompt (chat formatted on the device alone,
        # under a remote target, must match the target's), so it is part of the key too.
        seed = f"{sha256_of_file(shipped)}\n{model.system_prompt}"
        form = hashlib.sha256(seed.encode()).hexdigest()[:12]
    elif model.draft is not None and model.draft_head_tokens:
        form = f"head{model.draft_head_tokens}{DRAFT_FORM}"
    else:
        return None
    return (cache or cache_dir()) / "models" / f"{model.name}-draft-{form}-{importer_revision()}"


def source_path(model: CatalogModel, cache: Path | None = None) -> Path:
    """Where ``model``'s GGUF is kept once fetched."""
    return (cache or cache_dir()) / "downloads" / model.gguf_name


def is_cached(model: CatalogModel, cache: Path | None = None) -> bool:
    return (bundle_dir(model, cache) / "manifest.json").is_file()


def cached_or_built(
    root: Path, build: Callable[[], Bundle], *, verify_checksums: bool, notify: Notify
) -> Bundle:
    """The bundle at ``root``, else ``build()``'s, made under the entry's lock; a damaged
    bundle is rebuilt (with a notice), never used."""
    cached = _cached(root, verify_checksums, notify)
    if cached is not None:
        return cached
    with _exclusive(root.parent / f".{root.name}.lock"):
        # Another process may have built it while this one waited for the lock.
        cached = _cached(root, verify_checksums, notify=lambda line: None)
        if cached is not None:
            return cached
        return build()


def _cached(root: Path, verify_checksums: bool, notify: Notify) -> Bundle | None:
    if not root.exists():
        return None
    try:
        return load_bundle(root, verify_checksums=verify_checksums)
    except EdgespecError as error:
        notify(f"edgespec: the cached model at {root} is damaged ({error.problem}); rebuilding it")
        return None


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Holds an exclusive lock on ``lock_path`` (POSIX; elsewhere no lock)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: two first uses at once would both convert, then one wins
        yield
        return
    while True:
        handle = open(lock_path, "a")  # noqa: SIM115 (held past this loop, closed below)
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            current = os.stat(lock_path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        handle.close()  # the holder removed that file as it let go: lock the new one
    try:
        yield
    finally:
        # Removed before it is unlocked, so a process waiting on this file sees it is gone
        # and locks a new one: no empty lock files are left in the cache.
        lock_path.unlink(missing_ok=True)
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
