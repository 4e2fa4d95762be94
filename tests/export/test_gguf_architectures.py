"""GGUF architectures beyond the Llama block, each against llama.cpp's logits: Phi-3 (fused
Q/K/V and gate/up split back by row ranges, the file's blocks kept; longrope's short or long
frequency factors picked by the graph's context, as llama.cpp picks them by its own; a
rotary embedding over part of each head, as Phi-4-mini's) and SmolLM3 (no rotary embedding in
every fourth layer)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgespec.cli import main
from edgespec.graph.kernels import gguf_kernel_library
from edgespec.manifest import load_bundle

pytestmark = pytest.mark.integration
pytest.importorskip("gguf")

#: A 256-position original context stretched to 512, with factors of Phi-3.5's shape
#: (steeper). llama.cpp pads its context to a multiple of 256 positions, so its short factors
#: are seen only with an original context of 256 or more.
LONGROPE = {
    "extra_tensors": {
        "rope_factors_short.weight": np.array([1, 1, 1.2, 1.5, 2, 2.5, 3, 4], np.float32),
        "rope_factors_long.weight": np.array([1, 1.5, 2, 3, 5, 8, 12, 20], np.float32),
    },
    "rope_scaling": {"context_length": 512, "original_context_length": 256, "attn_factor": 1.2},
}
TOKENS = [0, *range(300, 339)]


def _llama_cpp_logits(path: Path, context: int) -> np.ndarray:
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=context, logits_all=True, verbose=False)
    llm.eval(TOKENS)
    return np.array(llm.scores[: len(TOKENS)])


def _imported_logits(path: Path, out: Path, *options: str, architecture: str = "") -> np.ndarray:
    """Imports ``path`` (its checks passing) and returns the bundle's logits [40, vocab] over
    :data:`TOKENS`, in passes of 8 (each copied: forward's output is reused)."""
    from edgespec.runtime.model import OnnxModel

    assert main(["export", str(path), "--out", str(out), *options, "--quiet"]) == 0
    bundle = load_bundle(out)
    assert bundle.manifest.verification.parity.passed
    if architecture:
        assert bundle.manifest.model.architecture == f"gguf:{architecture}"
    model = OnnxModel(bundle)
    cache = model.new_cache()
    return np.concatenate(
        [np.array(model.forward(TOKENS[i : i + 8], cache)) for i in range(0, len(TOKENS), 8)]
    )


@pytest.mark.parametrize("weight_type", [None, "Q8_0"])
def test_phi3_follows_llama_cpp_with_either_factor_set(
    tiny_model: Callable[[str], Path], tmp_path: Path, weight_type: str | None
) -> None:
    """A 256-position graph rotates by the short factors and a 512-position one by the long
    ones, each within 0.2% of llama.cpp's largest logit at the same context (1% on Q8_0,
    whose fused blocks run split on the GGUF kernels), while the two sets are far apart."""
    from edgespec.cli.bundles import bundle_summary

    from support.gguf_model import write_llama_gguf

    path = write_llama_gguf(
        tiny_model("phi3"), tmp_path / "phi3.gguf", weight_type=weight_type, **LONGROPE
    )
    theirs = {}
    for context, kind in ((256, "short"), (512, "long")):
        out = tmp_path / kind
        ours = _imported_logits(path, out, "--max-length", str(context), architecture="phi3")
        bundle = load_bundle(out)
        assert bundle.manifest.extra["rope_scaling"] == f"longrope, {kind} factors"
        assert f"longrope, {kind} factors" in bundle_summary(bundle)
        if weight_type is not None:
            assert bundle.manifest.extra["gguf"]["grid_kept"]
        theirs[kind] = _llama_cpp_logits(path, context)
        tolerance = (2e-3 if weight_type is None else 1e-2) * np.abs(theirs[kind]).max()
        assert np.abs(ours - theirs[kind]).max() < tolerance, kind
    assert np.abs(theirs["long"] - theirs["short"]).max() > 5 * tolerance


@pytest.mark.parametrize("weight_type", [None, "Q8_0"])
def test_partial_rotary_turns_the_first_dimensions_only(
    tiny_model: Callable[[str], Path], tmp_path: Path, weight_type: str | None
) -> None:
    """A Phi-3 file whose heads rotate over their first half only (``rope.dimension_count``
    16 of 32, as Phi-4-mini's 96 of 128) follows llama.cpp's logits on each attention path
    (F32: GroupQueryAttention; Q8_0: the kernels' attention after RotaryEmbedding), while
    the same weights rotated whole score apart."""
    import json
    import shutil

    from support.gguf_model import write_llama_gguf

    checkpoint = tiny_model("phi3-partial-rotary")
    path = write_llama_gguf(checkpoint, tmp_path / "partial.gguf", weight_type=weight_type)
    theirs = _llama_cpp_logits(path, 256)
    tolerance = (2e-3 if weight_type is None else 1e-2) * np.abs(theirs).max()
    ours = _imported_logits(path, tmp_path / "bundle", architecture="phi3")
    assert np.abs(ours - theirs).max() < tolerance
    if weight_type is None:
        whole = tmp_path / "whole"
        shutil.copytree(checkpoint, whole)
        config = json.loads((whole / "config.json").read_text())
        (whole / "config.json").write_text(json.dumps({**config, "partial_rotary_factor": 1.0}))
        rotated_whole = write_llama_gguf(whole, tmp_path / "whole.gguf")
        assert np.abs(_llama_cpp_logits(rotated_whole, 256) - theirs).max() > 5 * tolerance


def test_partial_rotary_that_attention_cannot_turn_is_one_line(
    tiny_model: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """8 turned dimensions of 16 on GroupQueryAttention (which turns multiples of 16): one
    line naming the fix, nothing written; a Q8_0 file of the same weights imports onto the
    kernels' attention."""
    import json
    import shutil

    from support.gguf_model import write_llama_gguf

    checkpoint = tmp_path / "narrow"
    shutil.copytree(tiny_model("phi3"), checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "partial_rotary_factor": 0.5}))
    path = write_llama_gguf(checkpoint, tmp_path / "narrow.gguf")
    out = tmp_path / "out"
    assert main(["export", str(path), "--out", str(out), "--quiet"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "turn 8 of 16" in lines[0] and "block-quantized" in lines[0]
    assert not out.exists()
    if gguf_kernel_library() is not None:
        quantized = write_llama_gguf(checkpoint, tmp_path / "q8.gguf", weight_type="Q8_0")
        assert main(["export", str(quantized), "--out", str(out), "--quiet"]) == 0


def _sharp_fourth_layer(source: Path, out: Path) -> Path:
    """The checkpoint with its fourth layer's Q and K scaled by 6 and its output by 8:
    attention sharp and loud enough that whether that layer rotates shows in the logits (in
    the briefly trained model's, barely)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(source, out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    attention = model.model.layers[3].self_attn
    with torch.no_grad():
        attention.q_proj.weight.mul_(6.0)
        attention.k_proj.weight.mul_(6.0)
        attention.o_proj.weight.mul_(8.0)
    model.save_pretrained(out)
    return out


@pytest.mark.parametrize("weight_type", [None, "Q8_0"])
def test_smollm3_leaves_every_fourth_layer_unrotated(
    tiny_model: Callable[[str], Path], tmp_path: Path, weight_type: str | None
) -> None:
    """A 4-layer SmolLM3 file (its fourth layer without rotary embedding) follows llama.cpp's
    logits, while the same weights read as a Llama (every layer rotating) score apart."""
    from support.gguf_model import write_llama_gguf

    checkpoint = _sharp_fourth_layer(tiny_model("llama-4-layers"), tmp_path / "checkpoint")
    path = write_llama_gguf(
        checkpoint, tmp_path / "smollm3.gguf", weight_type=weight_type, architecture="smollm3"
    )
    ours = _imported_logits(path, tmp_path / "bundle", architecture="smollm3")
    theirs = _llama_cpp_logits(path, 256)
    # Measured: 0.01% of the largest logit in float32, 0.15% on Q8_0; read as a Llama, 1%.
    tolerance = (4e-4 if weight_type is None else 1e-2) * np.abs(theirs).max()
    assert np.abs(ours - theirs).max() < tolerance
    if weight_type is None:
        as_llama = write_llama_gguf(checkpoint, tmp_path / "llama.gguf")
        assert np.abs(_llama_cpp_logits(as_llama, 256) - theirs).max() > 5 * tolerance


@pytest.mark.parametrize(
    ("weight_type", "attention"), [(None, "auto"), ("Q8_0", "auto"), ("Q8_0", "plain")]
)
def test_gemma2_caps_its_scores_and_logits_as_llama_cpp(
    tmp_path: Path, weight_type: str | None, attention: str
) -> None:
    """A random-weight Gemma 2 (even layers sliding over 4 positions, scores capped at 2 and
    logits at 3) follows llama.cpp's logits on each attention path (F32 and plain:
    GroupQueryAttention; Q8_0: the kernels' attention), top-1 included, while the same
    weights at llama.cpp's default caps (50 and 30) score apart."""
    from support.gguf_model import write_gemma3_gguf

    shape = {"head_dim": 32, "weight_type": weight_type, "gemma2": True}
    path = write_gemma3_gguf(tmp_path / "gemma2.gguf", **shape)
    ours = _imported_logits(
        path, tmp_path / "bundle", "--attention", attention, architecture="gemma2"
    )
    theirs = _llama_cpp_logits(path, 256)
    # Logits capped at 3. Measured: 0.006 apart in float32; 0.18-0.21 on Q8_0, as far as
    # with caps of 1,000 (0.24 of logits up to 32: the blocks' rounding), argmax equal.
    tolerance = (5e-3 if weight_type is None else 1e-1) * np.abs(theirs).max()
    assert np.abs(ours - theirs).max() < tolerance
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    if weight_type is None:
        default_caps = write_gemma3_gguf(tmp_path / "caps.gguf", **shape, softcaps=None)
        assert np.abs(_llama_cpp_logits(default_caps, 256) - theirs).max() > 5 * tolerance
