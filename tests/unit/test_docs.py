"""The code blocks of README.md and docs/*.md run as written, and their links resolve.

- A fenced block tagged ``python`` is executed in a fresh interpreter, offline
  (``HF_HUB_OFFLINE=1``), in an empty temporary directory, unless the line just before its
  fence is ``<!-- not run: REASON -->`` (for blocks that need a server, a GPU, a hub model or
  bundles the reader exports first).
- A block tagged ``bash`` or ``console`` runs only when the line just before its fence is
  ``<!-- run -->``, from the checkout's root (such blocks name paths in it, e.g. the built-in
  pair's bundles). A ``bash`` block runs as a script under ``set -euo pipefail``; in a
  ``console`` block the lines starting with ``$ `` are the commands, the rest is their output.
  Every other shell block is an illustration (placeholders such as DIR or URL).
- Every fence names its language, so how a block is treated is always explicit.

Their Python formatting is checked by ``ruff format --check .`` in CI, which formats the
``python`` blocks of Markdown files too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```([\w+-]*)\s*$")
RUN = "<!-- run -->"
NOT_RUN = re.compile(r"^<!-- not run: (?P<reason>\S.*?) -->$")
SHELL = ("bash", "console")
#: Linked before they exist: written together with the code they describe.
PENDING = {DOCS / "architecture.md"}
TIMEOUT_S = 180


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str  # the line just before the fence, stripped

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def parse_blocks(path: Path, text: str | None = None) -> list[Block]:
    """Fenced blocks at the start of a line (the only kind these pages use)."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
        if end is None:
            raise AssertionError(f"{path}:{i + 1}: a fence is never closed")
        marker = lines[i - 1].strip() if i > 0 else ""
        code = "\n".join(lines[i + 1 : end]) + "\n"
        blocks.append(Block(path, i + 1, opening.group(1), code, marker))
        i = end + 1
    return blocks


def all_blocks() -> list[Block]:
    return [block for path in markdown_files() for block in parse_blocks(path)]


def runs(block: Block) -> bool:
    if block.lang == "python":
        return NOT_RUN.match(block.marker) is None
    return block.lang in SHELL and block.marker == RUN


def environment() -> dict[str, str]:
    """Offline, no colour, and this interpreter's scripts (``edgespec``) first on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "PATH": path}


def run_block(block: Block, tmp_path: Path) -> None:
    """Runs one block; raises AssertionError with its output when it fails."""
    if block.lang == "python":
        command, cwd = [sys.executable, "-c", block.code], tmp_path
    elif block.lang == "bash":
        command, cwd = ["bash", "-c", "set -euo pipefail\n" + block.code], ROOT
    elif block.lang == "console":
        lines = [line[2:] for line in block.code.splitlines() if line.startswith("$ ")]
        assert lines, f"{block.name}: a console block marked {RUN} has no '$ ' command"
        command, cwd = ["bash", "-c", "set -euo pipefail\n" + "\n".join(lines)], ROOT
    else:
        raise AssertionError(f"{block.name}: cannot run a {block.lang!r} block")
    result = subprocess.run(
        command,
        cwd=cwd,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, (
        f"{block.name} ({block.lang}) exited {result.returncode}\n"
        f"--- code\n{block.code}--- stdout\n{result.stdout[-3000:]}\n"
        f"--- stderr\n{result.stderr[-3000:]}"
    )


BLOCKS = all_blocks()
RUNNABLE = [block for block in BLOCKS if runs(block)]


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.name for block in RUNNABLE])
def test_block_runs(block: Block, tmp_path: Path) -> None:
    run_block(block, tmp_path)


def test_blocks_are_found_and_marked_consistently() -> None:
    assert len(markdown_files()) >= 8, "README.md and the docs pages"
    problems = []
    for block in BLOCKS:
        if not block.lang:
            problems.append(f"{block.name}: the fence names no language (text, bash, ...)")
        if block.marker.startswith("<!--") and block.marker != RUN:
            if not NOT_RUN.match(block.marker):
                problems.append(f"{block.name}: unknown marker {block.marker!r}")
            elif block.lang != "python":
                problems.append(f"{block.name}: only python blocks take 'not run'")
        if block.marker == RUN and block.lang not in ("python", *SHELL):
            problems.append(f"{block.name}: {block.lang!r} blocks cannot run")
    assert not problems, "\n".join(problems)
    names = {block.path.name for block in RUNNABLE}
    assert {"README.md", "runtime.md", "budgets.md"} <= names
    assert any(block.lang == "python" for block in RUNNABLE)
    assert any(block.lang in SHELL for block in RUNNABLE)


def test_readme_keeps_the_quick_start_and_the_ci_test_command() -> None:
    """``.ci/run`` runs the README's test command; the quick start is the first two commands."""
    readme = parse_blocks(ROOT / "README.md")
    assert readme[0].code == "pip install .\nedgespec chat\n"
    assert "The capital of France is Paris." in readme[1].code  # the real answer it shows
    assert any(block.code.strip() == "HF_HUB_OFFLINE=1 pytest tests" for block in readme)
    assert "HF_HUB_OFFLINE=1 pytest tests\n" in (ROOT / ".ci" / "run").read_text()
    assert len((ROOT / "README.md").read_text().splitlines()) <= 260


def test_a_failing_block_fails(tmp_path: Path) -> None:
    page = ROOT / "docs" / "example.md"
    text = (
        "```python\nraise SystemExit('broken python block')\n```\n\n"
        f"{RUN}\n```bash\necho partial\nfalse\necho never\n```\n\n"
        f"{RUN}\n```console\n$ edgespec no-such-command\nsome output\n```\n\n"
        "<!-- not run: needs a server -->\n```python\nraise SystemExit(1)\n```\n\n"
        "```bash\nfalse  # an illustration: not run\n```\n"
    )
    blocks = parse_blocks(page, text)
    assert [runs(block) for block in blocks] == [True, True, True, False, False]
    for block, message in zip(
        blocks[:3], ("broken python block", "partial", "invalid choice"), strict=True
    ):
        with pytest.raises(AssertionError, match=message):
            run_block(block, tmp_path)


LINK = re.compile(r"\]\((?!https?://|mailto:)(?P<target>[^)\s]+)\)")


def slugs(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    found: set[str] = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence or not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def test_links_resolve() -> None:
    problems, pending = [], set()
    for page in markdown_files():
        for match in LINK.finditer(page.read_text(encoding="utf-8")):
            file_part, _, anchor = match.group("target").partition("#")
            target = (page.parent / file_part).resolve() if file_part else page
            if not target.exists():
                if target in PENDING:
                    pending.add(target.relative_to(ROOT))
                else:
                    problems.append(f"{page.relative_to(ROOT)}: {match.group('target')} is missing")
            elif anchor and target.suffix == ".md" and anchor not in slugs(target):
                problems.append(f"{page.relative_to(ROOT)}: no heading #{anchor} in {target.name}")
    assert not problems, "\n".join(problems)
    if pending:
        pytest.skip(f"linked, not written yet: {sorted(map(str, pending))}")
