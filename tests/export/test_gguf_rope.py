"""Rotary scaling read from GGUF files as llama.cpp runs it: Llama 3.x's frequency factors
(``rope_freqs.weight``), linear and YaRN scaling, each against llama.cpp's own logits; a
scaling the importer does not run is refused in one line, with nothing written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgespec.cli import main
from edgespec.cli.bundles import bundle_summary
from edgespec.manifest import load_bundle

pytestmark = pytest.mark.integration
pytest.importorskip("gguf")

#: Llama 3's shape of factors (1 for the fast pairs, growing for the slow ones), steeper, so
#: that 40 positions of a 16-wide head show them.
FREQUENCY_FACTORS = np.array([1.0, 1.0, 1.5, 2.0, 4.0, 8.0, 16.0, 32.0], dtype=np.float32)
CASES: dict[str, dict[str, Any]] = {
    "frequency factors": {"rope_freqs": FREQUENCY_FACTORS},
    "linear x4": {"rope_scaling": {"type": "linear", "factor": 4.0}},
    # A 256-position original context: YaRN's ramp spans pairs 0-4 of the 8.
    "yarn x4": {
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "original_context_length": 256,
            "context_length": 1024,
        }
    },
}
TOKENS = [0, *range(300, 339)]


def _llama_cpp_logits(path: Path) -> np.ndarray:
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False)
    llm.eval(TOKENS)
    return np.array(llm.scores[: len(TOKENS)])


def _ours(bundle: Path) -> np.ndarray:
    from edgespec.runtime.model import OnnxModel

    model = OnnxModel(load_bundle(bundle))
    cache = model.new_cache()
    # forward returns a view of its output buffer, valid until the next pass: copy each.
    return np.concatenate(
        [np.array(model.forward(TOKENS[i : i + 8], cache)) for i in range(0, len(TOKENS), 8)]
    )


@pytest.fixture(scope="module")
def unscaled_logits(
    tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> np.ndarray:
    from support.gguf_model import write_llama_gguf

    path = write_llama_gguf(tiny_model("llama"), tmp_path_factory.mktemp("rope") / "plain.gguf")
    return _llama_cpp_logits(path)


@pytest.mark.parametrize(
    ("case", "weight_type"),
    [(name, None) for name in CASES] + [("yarn x4", "Q8_0"), ("frequency factors", "Q8_0")],
)
def test_scaled_rotary_follows_llama_cpp(
    tiny_model: Callable[[str], Path],
    tmp_path: Path,
    unscaled_logits: np.ndarray,
    case: str,
    weight_type: str | None,
) -> None:
    """Over 40 positions the bundle's logits follow llama.cpp's on the same scaled file (F32:
    a float graph; Q8_0: the GGUF kernels and their attention), while the same weights
    unscaled score apart from them: the scaling is what the match shows."""
    from support.gguf_model import write_llama_gguf

    path = write_llama_gguf(
        tiny_model("llama"), tmp_path / "scaled.gguf", weight_type=weight_type, **CASES[case]
    )
    assert main(["export", str(path), "--out", str(tmp_path / "bundle"), "--quiet"]) == 0
    bundle = load_bundle(tmp_path / "bundle")
    assert bundle.manifest.verification.parity.passed
    recorded = bundle.manifest.extra["rope_scaling"]
    assert recorded == ("frequency factors" if case == "frequency factors" else case)
    assert f"rotary {recorded}" in bundle_summary(bundle)
    theirs = _llama_cpp_logits(path)
    # Measured: 0.02-0.04% of the largest logit in float32, 0.3% on Q8_0; the unscaled
    # weights 4-33% away.
    tolerance = (2e-3 if weight_type is None else 1e-2) * np.abs(theirs).max()
    assert np.abs(_ours(tmp_path / "bundle") - theirs).max() < tolerance
    if weight_type is None:
        assert np.abs(unscaled_logits - theirs).max() > 5 * tolerance


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"rope_scaling": {"type": "longrope", "factor": 4.0}}, "'longrope' rotary scaling"),
        ({"rope_freqs": np.ones(5, dtype=np.float32)}, "rope_freqs.weight of shape (5,)"),
    ],
)
def test_unsupported_rotary_is_one_line_and_writes_nothing(
    tiny_model: Callable[[str], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fields: dict[str, Any],
    named: str,
) -> None:
    from support.gguf_model import write_llama_gguf

    path = write_llama_gguf(tiny_model("llama"), tmp_path / "odd.gguf", **fields)
    out = tmp_path / "out"
    assert main(["export", str(path), "--out", str(out), "--quiet"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgespec: error: "), lines
    assert named in lines[0]
    assert not out.exists()
