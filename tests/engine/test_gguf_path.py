"""A GGUF file given by its path wherever a bundle is taken: imported once into the cache,
keyed by the file's sha256 and the importer's revision, listed by ``edgespec cache``."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_a_gguf_file_runs_by_its_path(
    tiny_model: Callable[[str], Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from edgespec.api import Engine
    from edgespec.models.inventory import inventory

    from support.gguf_model import write_llama_gguf

    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    path = write_llama_gguf(tiny_model("llama"), tmp_path / "model.gguf", weight_type="Q8_0")
    first = Engine.load(target=path)
    assert first.draft is None  # no catalog model shares a tiny vocabulary: prompt lookup
    imported = first.target.bundle.root if first.target is not None else None
    assert imported is not None and imported.parent == tmp_path / "cache" / "files"
    expected = first.generate([5, 17, 33, 2], max_new_tokens=12, drafter="none").tokens
    made = (imported / "manifest.json").stat().st_mtime_ns

    again = Engine.load(target=path)  # from the cache: not imported again
    assert again.target is not None and again.target.bundle.root == imported
    assert (imported / "manifest.json").stat().st_mtime_ns == made
    assert again.generate([5, 17, 33, 2], max_new_tokens=12, drafter="ngram").tokens == expected
    listed = [entry for entry in inventory() if entry.path == imported]
    assert listed and str(path.resolve()) in listed[0].kind

    # Another file at the same path (another weight type) is another import.
    shutil.copy(
        write_llama_gguf(tiny_model("llama"), tmp_path / "f32.gguf"), tmp_path / "model.gguf"
    )
    changed = Engine.load(target=path)
    assert changed.target is not None and changed.target.bundle.root != imported


def test_a_file_of_no_catalog_family_says_prompt_lookup_drafts_in_one_line(
    tiny_model: Callable[[str], Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from edgespec.api import Engine

    from support.gguf_model import write_llama_gguf

    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    path = write_llama_gguf(tiny_model("llama"), tmp_path / "model.gguf", weight_type="Q8_0")
    Engine.load(target=path)
    capsys.readouterr()
    engine = Engine.load(target=path)
    lines = [line for line in capsys.readouterr().err.splitlines() if "prompt lookup" in line]
    assert engine.draft is None and len(lines) == 1
    assert "no catalog draft shares" in lines[0] and "--draft" in lines[0]
    assert engine.default_drafter == "ngram"
