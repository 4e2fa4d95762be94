"""Reading files under a root directory, so every probe can run against a fake sysfs tree."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

#: Reads one file's text. Tests inject one that raises ``PermissionError`` (they may run as
#: root, where the real one never does).
ReadText = Callable[[Path], str]


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


@dataclass(frozen=True, kw_only=True)
class Unavailable:
    """A source that is not usable here and why (``not present``, ``permission``, ...)."""

    name: str
    reason: str

    def describe(self) -> str:
        return f"{self.name}: unavailable: {self.reason}"


class Tree:
    """A directory tree (``/`` on a device, a ``tmp_path`` in tests) and how to read it."""

    def __init__(self, root: str | Path = "/", *, read: ReadText = read_text) -> None:
        self.root = Path(root)
        self._read = read

    @property
    def is_system(self) -> bool:
        """True for the real ``/``: only then may probes also ask psutil."""
        return self.root == Path("/")

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def glob(self, pattern: str) -> Iterator[Path]:
        """Paths matching an absolute glob pattern, sorted, each real directory once."""
        seen: set[Path] = set()
        for path in sorted(self.root.glob(pattern.lstrip("/"))):
            real = path.resolve()
            if real not in seen:
                seen.add(real)
                yield path

    def text(self, path: Path) -> str:
        """The stripped content; raises ``OSError`` (``PermissionError`` included)."""
        return self._read(path).strip()

    def maybe_text(self, path: Path) -> str | None:
        """The stripped content, or None when the file is absent or unreadable."""
        try:
            return self.text(path)
        except OSError:
            return None

    def number(self, path: Path) -> float:
        return float(self.text(path))
