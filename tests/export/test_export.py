"""Exports of tiny models of several architectures through the CLI, and what they record."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgespec.manifest import MANIFEST_NAME, Manifest, load_bundle

pytestmark = pytest.mark.integration

ARCHITECTURES = ("llama", "qwen2", "gpt2", "phi3")
QUANTS = ("fp32", "int4")


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_export_writes_a_verified_bundle(
    exported: Callable[..., Path],
    tiny_model: Callable[[str], Path],
    architecture: str,
    quant: str,
) -> None:
    from transformers import AutoConfig

    bundle = load_bundle(exported(architecture, quant))
    manifest = bundle.manifest
    config = AutoConfig.from_pretrained(tiny_model(architecture))

    assert manifest.schema_version == 1
    assert manifest.source.kind == "local" and manifest.source.model == architecture
    assert manifest.model.model_type == config.model_type
    assert manifest.model.num_layers == config.num_hidden_layers
    assert manifest.model.num_kv_heads == getattr(
        config, "num_key_value_heads", config.num_attention_heads
    )
    assert manifest.model.head_dim == config.hidden_size // config.num_attention_heads
    assert manifest.model.vocab_size == config.vocab_size
    assert manifest.model.max_length == 256
    graph = manifest.graph
    names = {t.name for t in graph.inputs} | {t.name for t in graph.outputs}
    for layer in range(config.num_hidden_layers):
        assert graph.past_key[layer] == f"past_key_values.{layer}.key"
        assert graph.present_value[layer] == f"present.{layer}.value"
    assert set(graph.past_key + graph.past_value + graph.present_key + graph.present_value) <= names
    assert graph.kv_dtype == "float32"
    tokenizer = manifest.tokenizer
    assert (tokenizer.bos_token_id, tokenizer.eos_token_ids, tokenizer.pad_token_id) == (0, (1,), 2)
    assert tokenizer.vocab_type == "BPE" and tokenizer.has_chat_template
    assert manifest.memory.kv_bytes_per_token == (
        2 * manifest.model.num_layers * manifest.model.num_kv_heads * manifest.model.head_dim * 4
    )
    recorded = {record.path for record in manifest.files}
    assert {"model.onnx", "tokenizer.json", "config.json"} <= recorded
    assert sorted(p.name for p in bundle.root.iterdir()) == sorted(recorded | {MANIFEST_NAME})

    verification = manifest.verification
    assert verification.performed and verification.providers == ("CPUExecutionProvider",)
    parity = verification.parity
    invariance = verification.batch_invariance
    assert parity is not None and parity.passed
    assert invariance is not None and invariance.passed and verification.batch_invariant
    assert invariance.widths == tuple(range(2, 10))
    assert invariance.argmax_mismatch_fraction == 0.0
    assert set(invariance.mismatch_fraction_by_width) == {str(w) for w in range(2, 10)}
    if quant == "fp32":
        assert manifest.quantization.scheme == "none"
        assert parity.max_abs_logit_diff <= (parity.logit_tolerance or 0)
        assert parity.greedy_match_tokens == parity.greedy_tokens == 4 * 32
    else:
        q = manifest.quantization
        assert (q.scheme, q.bits, q.block_size, q.accuracy_level) == ("matmul_nbits", 4, 32, 4)
        assert parity.top1_agreement >= 0.8
        assert (
            manifest.memory.weight_bytes
            < load_bundle(exported(architecture, "fp32")).manifest.memory.weight_bytes
        )


def test_int4_graph_quantizes_matmuls_and_the_embedding(exported: Callable[..., Path]) -> None:
    import onnx

    model = onnx.load(str(exported("llama", "int4") / "model.onnx"))
    op_types = {node.op_type for node in model.graph.node}
    assert {"MatMulNBits", "GatherBlockQuantized"} <= op_types
    manifest = load_bundle(exported("llama", "int4")).manifest
    assert manifest.quantization.op_types == ("MatMul", "Gather")
    # Every recipe was compared against PyTorch; the kept one agrees best.
    recipes = manifest.extra["int4_recipes"]
    assert [r["recipe"] for r in recipes] == ["rtn-symmetric", "rtn-asymmetric", "hqq"]
    kept = [r for r in recipes if r["kept"]]
    assert len(kept) == 1 and f"({kept[0]['recipe']})" in manifest.quantization.tool
    assert kept[0]["top1_agreement"] == max(r["top1_agreement"] for r in recipes)
    assert manifest.quantization.symmetric == (kept[0]["recipe"] == "rtn-symmetric")
    hqq = onnx.load(str(exported("llama", "int4") / "model.onnx"))  # every product has a level
    levels = [
        a.i
        for n in hqq.graph.node
        if n.op_type == "MatMulNBits"
        for a in n.attribute
        if a.name == "accuracy_level"
    ]
    assert len(levels) == sum(n.op_type == "MatMulNBits" for n in hqq.graph.node)


def test_manifest_round_trips_and_bundle_is_relocatable(
    exported: Callable[..., Path], tmp_path: Path
) -> None:
    original = exported("qwen2", "fp32")
    copy = shutil.copytree(original, tmp_path / "moved")
    manifest = load_bundle(copy).manifest
    assert Manifest.from_dict(json.loads(manifest.to_json())) == manifest
    assert manifest == load_bundle(original).manifest
    assert str(original) not in (copy / MANIFEST_NAME).read_text()


def test_graph_runs_from_manifest_names_alone(
    exported: Callable[..., Path], tiny_model: Callable[[str], Path]
) -> None:
    """A consumer that knows only the manifest reproduces PyTorch's greedy continuation."""
    import onnxruntime
    import torch
    from transformers import AutoModelForCausalLM

    bundle = load_bundle(exported("gpt2", "fp32"))
    graph, model = bundle.manifest.graph, bundle.manifest.model
    session = onnxruntime.InferenceSession(
        str(bundle.graph_path), providers=["CPUExecutionProvider"]
    )
    prompt = [0, 17, 42, 99, 7]
    past = {
        name: np.zeros((1, model.num_kv_heads, 0, model.head_dim), np.float32)
        for name in graph.past_key + graph.past_value
    }
    tokens = list(prompt)
    feed_ids = prompt
    for _ in range(10):
        length = len(tokens)
        feeds = {graph.input_ids: np.array([feed_ids], np.int64), **past}
        if graph.attention_mask:
            feeds[graph.attention_mask] = np.ones((1, length), np.int64)
        if graph.position_ids:
            feeds[graph.position_ids] = np.arange(length - len(feed_ids), length)[None]
        outputs = session.run(None, feeds)
        by_name = dict(zip([o.name for o in session.get_outputs()], outputs, strict=True))
        tokens.append(int(by_name[graph.logits][0, -1].argmax()))
        past = {
            p: by_name[q]
            for p, q in zip(
                graph.past_key + graph.past_value,
                graph.present_key + graph.present_value,
                strict=True,
            )
        }
        feed_ids = tokens[-1:]
    reference = AutoModelForCausalLM.from_pretrained(tiny_model("gpt2")).eval()
    with torch.inference_mode():
        expected = reference.generate(
            torch.tensor([prompt]),
            max_new_tokens=10,
            do_sample=False,
            min_new_tokens=10,
            pad_token_id=2,
        )
    assert tokens == expected[0].tolist()


def test_fp16_and_int8_exports_pass_their_checks(exported: Callable[..., Path]) -> None:
    fp16 = load_bundle(exported("llama", "fp16")).manifest
    assert fp16.graph.kv_dtype == "float16" and fp16.quantization.scheme == "fp16"
    assert fp16.memory.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2
    assert fp16.verification.parity is not None and fp16.verification.parity.passed
    int8 = load_bundle(exported("llama", "int8")).manifest
    assert (int8.quantization.scheme, int8.quantization.bits) == ("matmul_nbits", 8)
    assert int8.verification.batch_invariance is not None


def test_fifth_architecture_exports(exported: Callable[..., Path]) -> None:
    manifest = load_bundle(exported("mistral", "fp32")).manifest
    assert manifest.model.architecture == "MistralForCausalLM"
    assert manifest.verification.parity is not None and manifest.verification.parity.passed


def test_dynamic_int8_warns_and_records_its_measurement(
    tiny_model: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from edgespec.cli import main

    out = tmp_path / "dyn"
    code = main(
        [
            "export",
            str(tiny_model("llama")),
            "--out",
            str(out),
            "--quant",
            "int8-dynamic",
            "--allow-batch-variance",
        ]
    )
    assert code == 0
    err = capsys.readouterr().err
    assert "warning: int8-dynamic computes one activation scale" in err
    manifest = load_bundle(out).manifest
    assert manifest.quantization.scheme == "dynamic_int8"
    assert manifest.verification.batch_invariance is not None


def test_no_verify_records_that_nothing_was_checked(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    from edgespec.cli import main

    out = tmp_path / "unverified"
    assert (
        main(
            [
                "export",
                str(tiny_model("llama")),
                "--out",
                str(out),
                "--no-verify",
                "--quiet",
                "--max-length",
                "128",
            ]
        )
        == 0
    )
    manifest = load_bundle(out).manifest
    assert manifest.verification.performed is False
    assert manifest.verification.batch_invariant is None
    assert manifest.model.max_length == 128


def test_export_shows_progress_for_each_long_step(
    tiny_model: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from edgespec.cli import main

    assert (
        main(
            [
                "export",
                str(tiny_model("llama")),
                "--out",
                str(tmp_path / "b"),
                "--quant",
                "int4",
                "--graph",
                "optimum",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    for stage in ("export", "quantize", "verify"):
        assert f"{stage}: done in" in captured.err
    assert "batch invariance, width 9 [8/8]" in captured.err
    assert "parity with PyTorch [4/4]" in captured.err
    assert captured.out.startswith("bundle")


def test_force_replaces_an_existing_bundle(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    from edgespec.cli import main

    out = tmp_path / "bundle"
    out.mkdir()
    (out / "old.txt").write_text("previous export")
    assert (
        main(
            [
                "export",
                str(tiny_model("gpt2")),
                "--out",
                str(out),
                "--force",
                "--quiet",
                "--no-verify",
            ]
        )
        == 0
    )
    assert not (out / "old.txt").exists()
    load_bundle(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]
