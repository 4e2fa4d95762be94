"""``edgespec pair``: identical tokenizers, compatible ones, and the first difference named."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from edgespec.cli import main
from edgespec.engine.pairing import check_pair

from support.fake_bundle import make_bundle

BASE = ["<s>", "</s>", "<pad>", "a", "b", "c"]


def test_identical_tokenizers(tmp_path: Path) -> None:
    report = check_pair(make_bundle(tmp_path / "d"), make_bundle(tmp_path / "t"))
    assert report.compatible and report.identical_tokenizer
    assert "identical tokenizers" in report.reason


def test_different_files_same_vocabulary_are_compatible(tmp_path: Path) -> None:
    draft = make_bundle(tmp_path / "d", sha256="d" * 64)
    target = make_bundle(tmp_path / "t", tokens=[*BASE, "dd", "ee"])
    report = check_pair(draft, target)
    assert report.compatible and not report.identical_tokenizer
    assert [c.name for c in report.checks] == [
        "vocab_type",
        "tokenizer_vocab_size",
        "model_vocab_size",
        "special_tokens",
        "token_strings",
        "compatible_tokenizers",
    ]
    assert "all 6 shared token ids" in report.checks[4].detail


def test_first_differing_token_is_named(tmp_path: Path) -> None:
    draft = make_bundle(tmp_path / "d", sha256="d" * 64)
    target = make_bundle(tmp_path / "t", tokens=["<s>", "</s>", "<pad>", "a", "x", "c"])
    report = check_pair(draft, target)
    assert not report.compatible
    assert report.reason == "token id 4 is 'b' in the draft and 'x' in the target"


def test_vocab_size_difference_over_128(tmp_path: Path) -> None:
    draft = make_bundle(tmp_path / "d", sha256="d" * 64)
    target = make_bundle(tmp_path / "t", tokens=BASE + [f"t{i}" for i in range(129)])
    report = check_pair(draft, target)
    assert not report.compatible
    assert "tokenizer vocab size is 6 in the draft and 135 in the target" in report.reason


def test_vocab_type_and_special_tokens(tmp_path: Path) -> None:
    draft = make_bundle(tmp_path / "d", sha256="d" * 64, vocab_type="Unigram")
    target = make_bundle(tmp_path / "t")
    assert "vocabulary type is Unigram in the draft" in check_pair(draft, target).reason
    other = make_bundle(tmp_path / "o", sha256="o" * 64, bos=None)
    assert (
        check_pair(other, target).reason == "bos_token_id is None in the draft and 0 in the target"
    )


def test_cli_exit_codes_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft, target = make_bundle(tmp_path / "d"), make_bundle(tmp_path / "t")
    assert main(["pair", str(draft), str(target)]) == 0
    assert capsys.readouterr().out.startswith("compatible: identical tokenizers")
    bad = make_bundle(tmp_path / "bad", sha256="b" * 64, tokens=["<s>", "x"])
    assert main(["pair", str(bad), str(target), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["compatible"] is False and report["checks"][0]["name"] == "vocab_type"
    assert "token id 1 is 'x' in the draft and '</s>'" in report["reason"]


def test_cli_broken_bundle_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = make_bundle(tmp_path / "t")
    assert main(["pair", str(tmp_path / "missing"), str(target)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bundle directory" in err[0] and "does not exist" in err[0]


@pytest.mark.integration
def test_exported_pair_with_a_foreign_tokenizer(
    exported: Callable[..., Path],
    tiny_model: Callable[[str], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Real bundles: two architectures sharing a tokenizer pair; a retrained tokenizer does not."""
    from support.tiny_models import build_model, corpus_texts, train_tokenizer

    llama, gpt2 = exported("llama", "fp32"), exported("gpt2", "int4")
    assert main(["pair", str(gpt2), str(llama)]) == 0
    texts = corpus_texts()[::-1]
    foreign_tokenizer = train_tokenizer(texts[:2])
    ids = [t for text in texts for t in foreign_tokenizer(text)["input_ids"]]
    foreign_model = build_model("llama", tmp_path / "foreign", foreign_tokenizer, ids, steps=0)
    foreign = tmp_path / "foreign-bundle"
    assert (
        main(["export", str(foreign_model), "--out", str(foreign), "--no-verify", "--quiet"]) == 0
    )
    capsys.readouterr()
    assert main(["pair", str(foreign), str(llama)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("NOT compatible: token id ")
