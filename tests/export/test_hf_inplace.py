"""``edgespec export HF_DIR --graph inplace``: Hugging Face Llama and Qwen2 checkpoints as the
in-place KV graph (the GGUF importer's), checked against the same checkpoint's optimum graph."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.manifest import load_bundle

pytestmark = pytest.mark.integration

PROMPTS = ("def add(a, b):\n    return", "import os\nimport sys\n\n", "class Point:\n    def")


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "mistral", "qwen3", "phi3"])
def test_inplace_graph_equals_the_optimum_graph_and_stays_exact(
    exported: Callable[..., Path], architecture: str
) -> None:
    from edgespec.runtime.model import OnnxModel

    inplace = load_bundle(exported(architecture, "fp32", "--graph", "inplace"))
    manifest = inplace.manifest
    assert manifest.graph.kv_sharing == "shared" and manifest.extra["graph_builder"] == "inplace"
    assert manifest.verification.parity is not None and manifest.verification.parity.passed
    assert manifest.verification.batch_invariant
    reference = load_bundle(exported(architecture, "fp32"))
    assert reference.manifest.graph.kv_sharing != "shared"
    fast, plain = OnnxModel(inplace), OnnxModel(reference)
    tokens = list(range(5, 40))
    ours = np.array(fast.forward(tokens, fast.new_cache()))
    theirs = np.array(plain.forward(tokens, plain.new_cache()))
    assert np.abs(ours - theirs).max() < 1e-4 * max(1.0, float(np.abs(theirs).max()))
    engine = Engine.load(target=inplace.root, measure_energy=False)
    optimum = Engine.load(target=reference.root, measure_energy=False)
    for prompt in PROMPTS:
        expected = engine.generate(prompt, drafter="none", max_new_tokens=32)
        assert expected.tokens == optimum.generate(prompt, drafter="none", max_new_tokens=32).tokens
        for k in (1, 4):
            result = engine.generate(prompt, drafter="ngram", k=k, max_new_tokens=32)
            assert result.tokens == expected.tokens, (prompt, k)


def test_inplace_refuses_what_it_does_not_cover(
    tiny_model: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "b"
    argv = ["export", str(tiny_model("llama")), "--out", str(out), "--graph", "inplace"]
    assert main([*argv, "--quant", "int8-dynamic"]) == 1
    assert "--graph inplace writes int4, int8, fp32 graphs, not int8-dynamic" in (
        capsys.readouterr().err
    )
    assert main([*argv, "--quant", "int4", "--block-size", "64"]) == 1
    assert "blocks of 32, not 64" in capsys.readouterr().err
    assert not out.exists()
    # A Mistral whose window is shorter than the graph's positions drops positions: refused.
    import json
    import shutil

    windowed = tmp_path / "windowed"
    shutil.copytree(tiny_model("mistral"), windowed)
    config = json.loads((windowed / "config.json").read_text())
    (windowed / "config.json").write_text(json.dumps({**config, "sliding_window": 16}))
    argv = ["export", str(windowed), "--out", str(out), "--graph", "inplace"]
    assert main([*argv, "--quant", "fp32", "--max-length", "64"]) == 1
    err = capsys.readouterr().err
    assert "cannot express sliding-window attention (a window of 16 positions" in err
    assert err.count("\n") <= 2 and not out.exists()
    argv = ["export", str(tiny_model("gpt2")), "--out", str(out), "--graph", "inplace"]
    assert main([*argv, "--quant", "fp32"]) == 1
    covered = "llama, mistral, phi3, qwen2, qwen3 and gemma3_text"
    assert f"cannot express a gpt2 model (it covers {covered})" in capsys.readouterr().err


@pytest.mark.parametrize(("quant", "dtype"), [("int4", "q4_1/q8_0"), ("int8", "q8_0")])
def test_inplace_quantizes_as_llama_cpp_does(
    exported: Callable[..., Path], quant: str, dtype: str
) -> None:
    """int4 is llama.cpp's Q4_1 (embedding Q8_0), int8 its Q8_0: the importer's blocks, single
    steps padded to two rows, exact speculation, and agreement with PyTorch recorded."""
    bundle = load_bundle(exported("llama", quant, "--graph", "inplace", "--min-top1", "0"))
    manifest = bundle.manifest
    assert manifest.quantization.weight_dtype == dtype and manifest.graph.min_pass_width == 2
    assert 0.0 <= manifest.extra["torch_top1_agreement"] <= 1.0
    assert manifest.verification.batch_invariant
    float_bytes = load_bundle(exported("llama", "fp32", "--graph", "inplace")).manifest
    assert manifest.memory.weight_bytes < float_bytes.memory.weight_bytes / 2.5
    engine = Engine.load(target=bundle.root, measure_energy=False)
    for prompt in PROMPTS:
        expected = engine.generate(prompt, drafter="none", max_new_tokens=32)
        result = engine.generate(prompt, drafter="ngram", k=4, max_new_tokens=32)
        assert result.tokens == expected.tokens, prompt


def test_auto_takes_the_inplace_graph_and_shows_progress(
    tiny_model: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "auto"
    assert main(["export", str(tiny_model("qwen2")), "--out", str(out), "--quant", "fp32"]) == 0
    err = capsys.readouterr().err
    for line in ("load: loading", "graph: done in", "verify: agreement with PyTorch"):
        assert line in err
    assert load_bundle(out).manifest.graph.kv_sharing == "shared"
    # Where the in-place graph does not apply (fp16), auto takes optimum's.
    assert (
        main(
            [
                "export",
                str(tiny_model("qwen2")),
                "--out",
                str(tmp_path / "h"),
                "--quant",
                "fp16",
                "--quiet",
            ]
        )
        == 0
    )
    assert load_bundle(tmp_path / "h").manifest.graph.kv_sharing != "shared"


def test_gemma3_text_checkpoints_take_the_inplace_graph_with_their_sliding_windows(
    exported: Callable[..., Path], tiny_model: Callable[[str], Path]
) -> None:
    """Gemma 3 (scaled embedding, (1 + w) norms, per-head Q/K norms, GELU, five 8-position
    sliding-window layers to one global): the export's own check against PyTorch passes
    (float32 max |Δlogit| within 1e-3), and greedy decoding past the window equals PyTorch's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bundle = load_bundle(exported("gemma3", "fp32", "--graph", "inplace"))
    assert bundle.manifest.extra["graph_builder"] == "inplace"
    assert bundle.manifest.verification.batch_invariant
    engine = Engine.load(target=bundle.root, measure_energy=False)
    model = AutoModelForCausalLM.from_pretrained(tiny_model("gemma3"), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model("gemma3"))
    for prompt in PROMPTS:
        ours = engine.generate(prompt, drafter="none", max_new_tokens=24)
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        assert ids.shape[1] + len(ours.tokens) > 8  # past the sliding window
        theirs = model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1] :]
        assert list(ours.tokens) == theirs.tolist()[: len(ours.tokens)], prompt
        assert engine.generate(prompt, drafter="ngram", k=4, max_new_tokens=24).tokens == (
            ours.tokens
        )


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    ("architecture", "rope_scaling"),
    [
        ("llama", LLAMA3_ROPE),
        ("llama", {"rope_type": "linear", "factor": 4.0}),
        ("llama", {"rope_type": "yarn", "factor": 4.0}),
        # Gemma 3 4B and up: linear x8 on the global layers, the sliding ones unscaled.
        ("gemma3", {"rope_type": "linear", "factor": 8.0}),
    ],
    ids=["llama3", "linear", "yarn", "gemma3-linear"],
)
def test_inplace_rotates_by_the_checkpoints_rope_scaling(
    tiny_model: Callable[[str], Path],
    tmp_path: Path,
    architecture: str,
    rope_scaling: dict[str, float],
) -> None:
    """A Llama 3.x-style, linear or YaRN rope scaling takes the in-place graph with
    transformers' own frequencies: the export's float32 check against PyTorch (max |Δlogit|
    within 1e-3) passes, the scaling is named, and the logits move from the unscaled
    checkpoint's."""
    import json
    import shutil

    from edgespec.cli.bundles import bundle_summary
    from edgespec.runtime.model import OnnxModel

    bundles = {}
    for name, scaling in (("plain", None), ("scaled", rope_scaling)):
        checkpoint = tmp_path / name
        shutil.copytree(tiny_model(architecture), checkpoint)
        config = json.loads((checkpoint / "config.json").read_text())
        (checkpoint / "config.json").write_text(json.dumps({**config, "rope_scaling": scaling}))
        out = tmp_path / f"{name}-bundle"
        argv = ["export", str(checkpoint), "--out", str(out), "--graph", "inplace"]
        assert main([*argv, "--quant", "fp32", "--quiet"]) == 0
        bundles[name] = load_bundle(out)
    label = f"{rope_scaling['rope_type']} x{rope_scaling['factor']:g}"
    assert bundles["scaled"].manifest.extra["rope_scaling"] == label
    assert f"rotary {label}" in bundle_summary(bundles["scaled"])
    assert bundles["plain"].manifest.extra["rope_scaling"] == "none"
    tokens = list(range(5, 45))  # past the tiny Gemma's window: its global layers decide
    logits = {}
    for name, bundle in bundles.items():
        model = OnnxModel(bundle)
        logits[name] = np.array(model.forward(tokens, model.new_cache()))
    assert np.abs(logits["scaled"] - logits["plain"]).max() > 1e-2


def test_inplace_refuses_rope_that_moves_with_the_length(
    tiny_model: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dynamic NTK scaling changes the frequencies with the sequence's length, which fixed
    rotary tables cannot follow: refused in one line, nothing written."""
    import json
    import shutil

    checkpoint = tmp_path / "dynamic"
    shutil.copytree(tiny_model("llama"), checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    (checkpoint / "config.json").write_text(json.dumps({**config, "rope_scaling": scaling}))
    out = tmp_path / "b"
    argv = ["export", str(checkpoint), "--out", str(out), "--graph", "inplace", "--quant", "fp32"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "cannot express dynamic rope scaling" in err and err.count("\n") <= 2
    assert not out.exists()
