"""``edgespec mobile``: the draft bundle as ONNX Runtime's .ort format, loaded and decoded by
the Python runtime token for token like the .onnx draft, with its coverage/memory report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.manifest import load_bundle

pytestmark = pytest.mark.integration

PROMPTS = ("def fibonacci(n):\n    if n", "import os\nimport sys\n\nclass ")


@pytest.fixture(scope="module")
def mobile(
    exported: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    draft = exported("mistral", "fp32")
    out = tmp_path_factory.mktemp("mobile") / "draft-mobile"
    assert main(["mobile", str(draft), "--out", str(out)]) == 0
    return draft, out


def test_mobile_bundle_holds_the_ort_graph_and_a_report(mobile: tuple[Path, Path]) -> None:
    draft, out = mobile
    bundle = load_bundle(out)
    assert bundle.manifest.graph.file == "model.ort"
    assert bundle.manifest.graph.inputs == load_bundle(draft).manifest.graph.inputs
    assert not any(f.role == "graph_data" for f in bundle.manifest.files)
    assert bundle.manifest.extra["mobile"]["graph_format"] == "ort"
    config = (out / "required_operators.config").read_text()
    assert "ai.onnx" in config and "MatMul" in config
    report = json.loads((out / "mobile_report.json").read_text())
    providers = [c["provider"] for c in report["coverage"]]
    assert providers[0] == "CPU" and "NNAPI" in providers
    assert "XNNPACK" in providers and "QNN" in providers
    cpu = report["coverage"][0]
    assert cpu["nodes"] == cpu["total"] > 0
    assert report["memory_mb"]["expected_total"] > report["memory_mb"]["ort_file"] > 0
    assert "| NNAPI |" in (out / "MOBILE.md").read_text()


def test_existing_output_is_refused(mobile: tuple[Path, Path], capsys) -> None:
    draft, out = mobile
    assert main(["mobile", str(draft), "--out", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err


def test_ort_draft_generates_like_the_onnx_draft(
    exported: Callable[..., Path], mobile: tuple[Path, Path]
) -> None:
    draft, out = mobile
    target = exported("llama", "fp32")
    with_onnx = Engine.load(target=target, draft=draft)
    with_ort = Engine.load(target=target, draft=out)
    alone_onnx = Engine.load(target=draft)
    alone_ort = Engine.load(target=out)
    for prompt in PROMPTS:
        # The draft on its own: the .ort graph decodes the same greedy tokens.
        plain = alone_onnx.generate(prompt, drafter="none", max_new_tokens=40)
        assert alone_ort.generate(prompt, drafter="none", max_new_tokens=40).tokens == plain.tokens
        # As the draft of a pair: same proposals, so the same rounds and the same output.
        for k in (1, 4):
            expected = with_onnx.generate(prompt, drafter="model", k=k, max_new_tokens=40)
            got = with_ort.generate(prompt, drafter="model", k=k, max_new_tokens=40)
            assert got.tokens == expected.tokens
            assert got.stats.rounds == expected.stats.rounds
            assert got.stats.alpha == expected.stats.alpha
