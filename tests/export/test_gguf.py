"""GGUF import: llama.cpp's blocks kept, the in-place KV graph checked and run exactly.

Tiny Llama checkpoints are written as GGUF files with the ``gguf`` package's reference
quantizers (Q4_0, Q4_1, Q8_0), then imported with ``edgespec export FILE.gguf`` (the
fixtures: ``tests/export/conftest.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.cli.bundles import bundle_summary
from edgespec.graph.kernels import gguf_kernel_library
from edgespec.manifest import load_bundle

from support.gguf_bundles import FORMATS, ON_MATMUL_NBITS, PROMPTS, padded_steps

pytestmark = pytest.mark.integration
pytest.importorskip("gguf")


@pytest.mark.parametrize("kind", [*FORMATS, "F32", "qwen2-Q4_1", "qwen3-Q8_0", "groups3-Q4_1"])
def test_import_keeps_the_grid_and_passes_its_checks(
    gguf_bundles: dict[str, Path], kind: str
) -> None:
    manifest = load_bundle(gguf_bundles[kind]).manifest
    record = manifest.extra["gguf"]
    assert record["grid_kept"] is True and record["requantized_types"] == []
    # MatMulNBits graphs pad single steps to two rows (bit-identical to wider passes); the GGUF
    # kernels give a row the same bits in any pass, and a float graph steps one row at a time
    # (a GEMV), argmax-identical to wider passes.
    assert manifest.graph.kv_sharing == "shared"
    padded = padded_steps(kind)
    assert padded is None or manifest.graph.min_pass_width == (2 if padded else 1)
    on_kernels = kind != "F32" and gguf_kernel_library() is not None
    assert (manifest.quantization.scheme == "gguf_blocks") == (
        on_kernels and kind not in ON_MATMUL_NBITS
    )
    parity, invariance = manifest.verification.parity, manifest.verification.batch_invariance
    assert parity is not None and parity.passed and parity.top1_agreement >= 0.9
    assert invariance is not None and invariance.passed
    assert kind == "F32" or invariance.max_abs_logit_diff == 0.0
    expected_bits = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8, "F32": 32, "qwen2-Q4_1": 4, "qwen3-Q8_0": 8}
    expected_bits["groups3-Q4_1"] = 4
    assert manifest.quantization.bits == expected_bits[kind]
    if kind.startswith("qwen3"):  # checked against llama.cpp's own logits on the same file
        agreement = manifest.extra["llama_cpp_agreement"]
        assert not agreement["checked"] or agreement["top1_agreement"] >= 0.9


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "qwen2-Q4_1", "qwen3-Q8_0", "groups3-Q4_1"])
def test_speculative_greedy_equals_target_greedy(gguf_bundles: dict[str, Path], kind: str) -> None:
    engine = Engine.load(target=gguf_bundles[kind])
    for prompt in PROMPTS:
        expected = engine.generate(prompt, drafter="none", max_new_tokens=40)
        for k in (1, 3, 8):
            result = engine.generate(prompt, drafter="ngram", k=k, max_new_tokens=40)
            assert result.tokens == expected.tokens, (prompt, k)
    draft = gguf_bundles[kind if kind.startswith(("qwen", "groups3")) else "Q8_0"]
    with_draft = Engine.load(target=gguf_bundles[kind], draft=draft)
    # The draft steps one row at a time (the target checks what it proposes); the target keeps
    # its graph's padding, so its verify rows equal its single steps bit for bit.
    assert with_draft.draft is not None and with_draft.target is not None
    assert with_draft.draft.driver.graph.min_pass_width == 1
    target_graph = load_bundle(gguf_bundles[kind]).manifest.graph
    assert with_draft.target.driver.graph.min_pass_width == target_graph.min_pass_width
    summary = bundle_summary(load_bundle(gguf_bundles[kind]))
    padded = "as a target, one-token steps padded to 2 rows" in summary
    assert padded == (target_graph.min_pass_width == 2) and padded_steps(kind) in (padded, None)
    unpadded = "every pass as it comes, target or draft" in summary
    assert ("as a draft, one row per step" in summary) == padded != unpadded
    for prompt in PROMPTS:
        expected = with_draft.generate(prompt, drafter="none", max_new_tokens=30)
        result = with_draft.generate(prompt, drafter="model", k=4, max_new_tokens=30)
        assert result.tokens == expected.tokens and result.stats.drafted > 0


def test_both_attention_forms_of_the_same_weights_write_the_same_text(
    gguf_bundles: dict[str, Path],
) -> None:
    """6 query heads over 2 KV heads, on the default attention (the GGUF kernels' where they
    run) and on ONNX Runtime's: the same greedy text, and decoding reaches the context limit."""
    from edgespec.runtime.model import OnnxModel

    default, plain = (load_bundle(gguf_bundles[k]) for k in ("groups3-Q4_1", "plain-Q4_1"))
    assert plain.manifest.graph.kv_capacity is None and plain.manifest.model.max_length == 256
    engines = [Engine.load(target=gguf_bundles[k]) for k in ("groups3-Q4_1", "plain-Q4_1")]
    for prompt in PROMPTS:
        outputs = [e.generate(prompt, drafter="none", max_new_tokens=24).tokens for e in engines]
        assert outputs[0] == outputs[1], prompt
    model = OnnxModel(default)
    cache = model.new_cache()
    rng = np.random.default_rng(1)
    logits = model.forward(list(rng.integers(3, 200, size=250)), cache)
    assert logits.shape[0] == 250 and cache.length == 250
    while cache.length < 256:
        model.forward([int(logits[-1].argmax())], cache)
    assert cache.length == 256


def test_folded_attention_is_refused_with_the_fix(
    gguf_bundles: dict[str, Path],
    gguf_files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Folded attention is no longer an export form: asking for it, or loading a bundle an
    older edgespec wrote with it, ends in one line that says what to do."""
    import shutil

    from edgespec.errors import BundleError

    argv = ["export", str(gguf_files["Q4_1"]), "--out", str(tmp_path / "x")]
    assert main([*argv, "--attention", "folded"]) == 2  # a bad argument
    line = capsys.readouterr().err.strip()
    assert line.startswith("edgespec: error: --attention 'folded' is no longer an export form")
    assert "\n" not in line and not (tmp_path / "x").exists()
    old = tmp_path / "folded"
    shutil.copytree(gguf_bundles["plain-Q4_1"], old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["graph"]["kv_positions_per_token"] = 3
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError) as raised:
        load_bundle(old)
    assert "folded attention" in raised.value.problem
    assert "edgespec export" in str(raised.value.fix)


def test_dequantized_import_is_a_float_graph_of_the_same_weights(
    gguf_bundles: dict[str, Path],
) -> None:
    manifest = load_bundle(gguf_bundles["Q4_1-as-fp32"]).manifest
    assert manifest.extra["gguf"]["dequantized"] is True
    assert manifest.extra["gguf"]["grid_kept"] is False
    assert manifest.quantization.scheme == "none" and manifest.quantization.weight_dtype == "fp32"
    assert manifest.graph.min_pass_width == 1
    parity = manifest.verification.parity
    assert parity is not None and parity.top1_agreement == 1.0
    assert parity.max_abs_logit_diff < 1e-3  # float32 against the float64 reference
    # The tied LM head reads the embedding table itself: one float32 copy of the weights.
    table_bytes = 4 * manifest.model.vocab_size * manifest.model.hidden_size
    assert manifest.memory.weight_bytes < 4 * manifest.model.parameters + table_bytes // 2
    engine = Engine.load(target=gguf_bundles["Q4_1-as-fp32"])
    for prompt in PROMPTS:
        expected = engine.generate(prompt, drafter="none", max_new_tokens=32)
        for k in (1, 4):
            result = engine.generate(prompt, drafter="ngram", k=k, max_new_tokens=32)
            assert result.tokens == expected.tokens, (prompt, k)


@pytest.mark.parametrize("kind", ["Q4_1", "Q4_1-as-fp32", "groups3-Q4_1"])
def test_in_place_path_equals_the_plain_path_through_rollbacks(
    gguf_bundles: dict[str, Path], kind: str
) -> None:
    from edgespec.graph.kv_cache import SharedKVCache
    from edgespec.runtime.model import ModelOptions, OnnxModel

    bundle = load_bundle(gguf_bundles[kind])
    fast = OnnxModel(bundle, options=ModelOptions(io_binding=True))
    plain = OnnxModel(bundle, options=ModelOptions(io_binding=False))
    spec = bundle.manifest.model
    # The device-resident kind of cache (ONNX Runtime's own memory, as on a GPU), on the CPU.
    allocated = SharedKVCache(
        layers=spec.num_layers,
        kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        capacity=bundle.manifest.graph.kv_capacity or fast.max_length,
        dtype=fast.kv_dtype,
        device="cpu",
    )
    models = (fast, plain, fast)
    caches = [fast.new_cache(), plain.new_cache(), allocated]
    rng = np.random.default_rng(0)
    steps = [list(rng.integers(3, 200, size=n)) for n in (7, 1, 4, 1, 9, 2)]
    for step, tokens in enumerate(steps):
        got = [np.array(m.forward(tokens, c)) for m, c in zip(models, caches, strict=True)]
        assert np.array_equal(got[0], got[1]) and np.array_equal(got[0], got[2]), step
        if step % 2:  # a rejection: keep all but the last two positions
            for cache in caches:
                cache.crop(cache.length - 2)
    assert caches[0].length == caches[1].length == caches[2].length
    with pytest.raises(ValueError, match="host memory"):
        plain.forward([5], allocated)


class _RecordingSession:
    """An ONNX Runtime session that records the shape of each pass's logits (the plain path's
    ``session.run``, whose first output is the logits)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.logits_shapes: list[tuple[int, ...]] = []

    def run(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        results = self.session.run(outputs, feeds)
        self.logits_shapes.append(results[0].shape)
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


@pytest.mark.parametrize("kind", ["Q4_1", "qwen2-Q4_1", "groups3-Q4_1", "F32"])
def test_prefill_computes_only_the_last_row_of_logits(
    gguf_bundles: dict[str, Path], kind: str
) -> None:
    """A prefill asks the graph for the last row's logits only (the graph's narrowest pass of
    rows: one on a float graph, two where one-row products round apart), and the rows it
    computes are bit-identical to the same rows of a pass that computes every row; the cache
    it leaves gives the next pass the same logits too. 200 tokens: two chunks of a prefill."""
    from edgespec.graph.driver import GraphDriver
    from edgespec.graph.paths import GraphSizes
    from edgespec.runtime.model import ModelOptions, OnnxModel

    bundle = load_bundle(gguf_bundles[kind])
    graph, spec = bundle.manifest.graph, bundle.manifest.model
    assert graph.logits_rows == "logits_rows"
    assert graph.logits_rows in {t.name for t in graph.inputs}
    rng = np.random.default_rng(4)
    prompt = [int(t) for t in rng.integers(3, 200, size=200)]
    verify = [int(t) for t in rng.integers(3, 200, size=5)]
    for io_binding in (True, False):
        model = OnnxModel(bundle, options=ModelOptions(io_binding=io_binding))
        full = np.array(model.forward(prompt, model.new_cache()))
        assert full.shape == (200, spec.vocab_size)
        last = np.array(model.forward(prompt, model.new_cache(), last_only=True))
        assert last.shape == (1, spec.vocab_size)
        if kind != "F32":  # a float graph's one-row head is a GEMV: argmax-identical only
            np.testing.assert_array_equal(last[0], full[-1])
        assert last.argmax() == full[-1].argmax()
        expected_cache, cache = model.new_cache(), model.new_cache()
        model.forward(prompt, expected_cache)
        model.start([*prompt, verify[0]], cache)
        assert cache.length == expected_cache.length == 200
        expected = np.array(model.forward(verify, expected_cache))
        np.testing.assert_array_equal(np.array(model.forward(verify, cache)), expected)
    # The plain path's passes, recorded: every prefill chunk returned [1, R, vocab].
    recording = _RecordingSession(model.session)
    sizes = GraphSizes(
        kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        vocab_size=spec.vocab_size,
        capacity=graph.kv_capacity or spec.max_length,
    )
    model.driver = GraphDriver(recording, graph, sizes, bound=False)
    model.start([*prompt, verify[0]], model.new_cache())
    rows = graph.min_pass_width
    assert padded_steps(kind) in (rows == 2, None)
    assert recording.logits_shapes
    assert set(recording.logits_shapes) == {(1, rows, spec.vocab_size)}
    recording.logits_shapes.clear()
    model.forward(verify, model.new_cache())  # a verify pass: every row
    assert recording.logits_shapes == [(1, 5, spec.vocab_size)]


def _without_logits_rows(bundle_dir: Path, out: Path) -> Path:
    """A copy of an in-place bundle as graphs without the ``logits_rows`` input were built
    (every row through the final norm and the LM head), its manifest saying so."""
    import hashlib
    import shutil

    import onnx

    shutil.copytree(bundle_dir, out)
    graph_path = out / "model.onnx"
    model = onnx.load(str(graph_path), load_external_data=False)
    gather = next(n for n in model.graph.node if "logits_rows" in n.input)
    for node in model.graph.node:
        node.input[:] = [gather.input[0] if i == gather.output[0] else i for i in node.input]
    model.graph.node.remove(gather)
    rows_input = next(i for i in model.graph.input if i.name == "logits_rows")
    model.graph.input.remove(rows_input)
    onnx.save(model, str(graph_path))
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["graph"]["logits_rows"]
    manifest["graph"]["inputs"] = [
        t for t in manifest["graph"]["inputs"] if t["name"] != "logits_rows"
    ]
    data = graph_path.read_bytes()
    for record in manifest["files"]:
        if record["path"] == "model.onnx":
            record.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest_path.write_text(json.dumps(manifest))
    return out


@pytest.mark.parametrize("kind", ["Q4_1", "groups3-Q4_1"])
def test_bundle_without_logits_rows_still_runs(
    gguf_bundles: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    """A bundle whose graph computes every row (built before the ``logits_rows`` input) loads
    and runs as before: prefills, verify passes and speculation, with the same logits."""
    from edgespec.runtime.model import ModelOptions, OnnxModel

    old = load_bundle(_without_logits_rows(gguf_bundles[kind], tmp_path / "old"))
    assert old.manifest.graph.logits_rows is None
    new = load_bundle(gguf_bundles[kind])
    rng = np.random.default_rng(5)
    prompt = [int(t) for t in rng.integers(3, 200, size=150)]
    for io_binding in (True, False):
        models = [OnnxModel(b, options=ModelOptions(io_binding=io_binding)) for b in (old, new)]
        full = [np.array(m.forward(prompt, m.new_cache())) for m in models]
        np.testing.assert_array_equal(full[0], full[1])
        last = np.array(models[0].forward(prompt, models[0].new_cache(), last_only=True))
        np.testing.assert_array_equal(last[0], full[0][-1])
        caches = [m.new_cache() for m in models]
        for model, cache in zip(models, caches, strict=True):
            model.start(prompt, cache)
        step = [prompt[-1], 7, 9]
        verified = [np.array(m.forward(step, c)) for m, c in zip(models, caches, strict=True)]
        np.testing.assert_array_equal(verified[0], verified[1])
    engines = [Engine.load(target=b.root) for b in (old, new)]
    for prompt_text in PROMPTS:
        old_plain, expected = (
            e.generate(prompt_text, drafter="none", max_new_tokens=24).tokens for e in engines
        )
        assert old_plain == expected
        result = engines[0].generate(prompt_text, drafter="ngram", k=4, max_new_tokens=24)
        assert result.tokens == expected
