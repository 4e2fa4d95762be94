"""GGUF import: llama.cpp's blocks kept, the in-place KV graph checked and run, bad files refused.

Tiny Llama checkpoints are written as GGUF files with the ``gguf`` package's reference
quantizers (Q4_0, Q4_1, Q8_0), then imported with ``edgespec export FILE.gguf``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.cli.bundles import bundle_summary
from edgespec.graph.kernels import gguf_kernel_library
from edgespec.manifest import load_bundle

pytestmark = pytest.mark.integration
pytest.importorskip("gguf")

PROMPTS = ("def add(a, b):\n    return", "import os\nimport sys\n\n", "class Point:\n    def")
FORMATS = ("Q4_0", "Q4_1", "Q8_0")
# Imported onto ONNX Runtime's MatMulNBits (--kernels mlas): Q4_1's offset term and padded
# steps stay tested where the GGUF kernels are built; the rest import as the default does.
ON_MATMUL_NBITS = ("Q4_1", "qwen2-Q4_1")


def _padded(kind: str) -> bool | None:
    """Whether the bundle's graph pads one-token steps to two rows: MatMulNBits graphs do,
    float graphs do not, and on the GGUF kernels the import's exactness check decides (None):
    their products and their attention give a row the same bits in any pass."""
    if kind in ("F32", "Q4_1-as-fp32"):
        return False
    if gguf_kernel_library() is None or kind in ON_MATMUL_NBITS:
        return True
    return None


@pytest.fixture(scope="module")
def gguf_files(
    tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    from support.gguf_model import write_llama_gguf

    root = tmp_path_factory.mktemp("gguf")
    model = tiny_model("llama")
    files = {
        kind: write_llama_gguf(model, root / f"{kind}.gguf", weight_type=kind) for kind in FORMATS
    }
    files["F32"] = write_llama_gguf(model, root / "F32.gguf")
    files["qwen2-Q4_1"] = write_llama_gguf(
        tiny_model("qwen2"), root / "qwen2.gguf", weight_type="Q4_1"
    )
    files["qwen3-Q8_0"] = write_llama_gguf(
        tiny_model("qwen3"), root / "qwen3.gguf", weight_type="Q8_0"
    )
    files["groups3-Q4_1"] = write_llama_gguf(
        tiny_model("llama-groups-of-3"), root / "groups3.gguf", weight_type="Q4_1"
    )
    return files


@pytest.fixture(scope="module")
def gguf_bundles(
    gguf_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf_bundles")
    bundles = {}
    for kind, path in gguf_files.items():
        out = root / kind
        argv = ["export", str(path), "--out", str(out), "--quiet", "--max-length", "256"]
        argv += ["--kernels", "mlas"] if kind in ON_MATMUL_NBITS else []
        assert main(argv) == 0
        bundles[kind] = out
    out = root / "plain-Q4_1"  # 3 query heads per KV head, ONNX Runtime's attention
    argv = ["export", str(gguf_files["groups3-Q4_1"]), "--out", str(out), "--quiet"]
    assert main([*argv, "--max-length", "256", "--attention", "plain"]) == 0
    bundles["plain-Q4_1"] = out
    out = root / "Q4_1-as-fp32"
    argv = ["export", str(gguf_files["Q4_1"]), "--out", str(out), "--quant", "fp32", "--quiet"]
    assert main([*argv, "--max-length", "256"]) == 0
    bundles["Q4_1-as-fp32"] = out
    return bundles


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
    padded = _padded(kind)
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
    assert padded == (target_graph.min_pass_width == 2) and _padded(kind) in (padded, None)
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
    assert plain.manifest.graph.kv_capacity == 256 == plain.manifest.model.max_length
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
    assert _padded(kind) in (rows == 2, None)
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


def test_cuda_target_keeps_its_cache_on_the_gpu(gguf_bundles: dict[str, Path]) -> None:
    """Where CUDA is available: the target's in-place cache lives on the GPU, a CPU draft
    beside it, and greedy speculation equals target-only decoding."""
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("no CUDA execution provider in this ONNX Runtime build")
    engine = Engine.load(
        target=gguf_bundles["Q4_1"],
        draft=gguf_bundles["Q8_0"],
        target_providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
        draft_providers=["CPUExecutionProvider"],
    )
    assert engine.pair.target.kv_device == "cuda" and engine.pair.draft.kv_device is None
    for prompt in PROMPTS:
        expected = engine.generate(prompt, drafter="none", max_new_tokens=32)
        result = engine.generate(prompt, drafter="model", k=4, max_new_tokens=32)
        assert result.tokens == expected.tokens


@pytest.mark.parametrize("kind", ["Q4_1", "plain-Q4_1"])
def test_cuda_runs_a_float16_attention_copy_that_keeps_speculation_exact(
    gguf_bundles: dict[str, Path], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA's GroupQueryAttention takes no float32, so the import writes a copy of the graph
    whose attention (and KV cache) is float16, and CUDA sessions run it. Run here on the CPU,
    whose attention takes float16 too: the copy shares the bundle's data file, its logits stay
    near the float32 graph's, and greedy speculation on it equals its own target-only
    decoding."""
    import onnx

    from edgespec.export.half_attention import HALF_ATTENTION_FILE, has_float_attention
    from edgespec.runtime.model import OnnxModel, cpu_parts_under_cuda

    bundle = load_bundle(gguf_bundles[kind])
    spec = bundle.manifest.graph
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert spec.half_attention_file == HALF_ATTENTION_FILE
    assert HALF_ATTENTION_FILE in {record.path for record in bundle.manifest.files}
    copy = bundle.root / HALF_ATTENTION_FILE
    assert has_float_attention(bundle.graph_path) and not has_float_attention(copy)
    assert copy.stat().st_size < bundle.graph_path.stat().st_size + 64 * 1024
    graph = onnx.load(str(copy), load_external_data=False).graph
    inputs = {value.name: value.type.tensor_type.elem_type for value in graph.input}
    assert {inputs[name] for name in spec.past_key} == {onnx.TensorProto.FLOAT16}
    assert OnnxModel.runs_attention_in_half(spec, cuda)
    assert not OnnxModel.runs_attention_in_half(spec, ["CPUExecutionProvider"])
    # what a CUDA session of an older bundle, or of one on the GGUF kernels, leaves to the CPU
    left = cpu_parts_under_cuda(spec, bundle.manifest.quantization.op_types, cuda)
    assert not any("attention" in part for part in left)
    older = replace(spec, half_attention_file=None)
    assert len(cpu_parts_under_cuda(older, ("GgufMatMul",), cuda)) == 2
    assert cpu_parts_under_cuda(older, ("GgufMatMul",), ["CPUExecutionProvider"]) == []

    full = OnnxModel(bundle, providers=["CPUExecutionProvider"])
    monkeypatch.setattr(OnnxModel, "runs_attention_in_half", staticmethod(lambda g, p: True))
    half = OnnxModel(bundle, providers=["CPUExecutionProvider"])
    assert half.kv_dtype == np.float16 and full.kv_dtype == np.float32
    prompt = list(range(5, 40))
    ours = np.array(half.forward(prompt, half.new_cache()))
    theirs = np.array(full.forward(prompt, full.new_cache()))
    spread = float(theirs.max() - theirs.min())
    assert float(np.max(np.abs(ours - theirs))) < 0.02 * spread
    engine = Engine.load(target=bundle.root)
    assert engine.pair.target.kv_dtype == np.float16
    for text in PROMPTS:
        expected = engine.generate(text, drafter="none", max_new_tokens=24)
        result = engine.generate(text, drafter="ngram", k=4, max_new_tokens=24)
        assert result.tokens == expected.tokens


def test_tokenizer_and_logits_agree_with_llama_cpp(
    gguf_files: dict[str, Path], gguf_bundles: dict[str, Path]
) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    from tokenizers import Tokenizer

    llm = llama_cpp.Llama(model_path=str(gguf_files["Q8_0"]), n_ctx=256, verbose=False)
    ours = Tokenizer.from_file(str(gguf_bundles["Q8_0"] / "tokenizer.json"))
    for text in (*PROMPTS, "  spaces\tand tabs\n\n12345 <|endoftext|>"):
        assert ours.encode(text).ids == llm.tokenize(text.encode(), add_bos=False, special=True)
    agreement = load_bundle(gguf_bundles["Q8_0"]).manifest.extra["llama_cpp_agreement"]
    assert agreement["checked"] and agreement["top1_agreement"] >= 0.9
    # llama.cpp's batched logits against its own one-token logits, recorded beside ours
    assert 0.9 <= agreement["llama_cpp_self_agreement"] <= 1.0
    summary = bundle_summary(load_bundle(gguf_bundles["Q8_0"]))
    top1 = f"{agreement['top1_agreement']:.1%}"
    assert f"llama.cpp   top-1 agreement {top1} with its logits" in summary


def test_the_importer_needs_no_torch(gguf_files: dict[str, Path], tmp_path: Path) -> None:
    code = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    if name.split('.')[0] in ('torch', 'transformers', 'optimum'):\n"
        "        raise ImportError(name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        "from edgespec.cli import main\n"
        f"sys.exit(main(['export', {str(gguf_files['Q4_0'])!r}, '--out', {str(tmp_path / 'b')!r},"
        " '--quiet', '--max-length', '128']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["source"]["kind"] == "gguf"


def _llama_cpp_logits(path: Path, tokens: list[int]) -> np.ndarray:
    """llama.cpp's logits [len(tokens), vocab] for ``tokens`` in one batch (skips without it)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False)
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)])


def _one_error_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main([*argv, "--quiet"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgespec: error: "), lines
    return lines[0]


def test_bad_gguf_files_are_one_line_and_write_nothing(
    gguf_files: dict[str, Path],
    tiny_model: Callable[[str], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from support.gguf_model import write_llama_gguf

    out = tmp_path / "out"
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(gguf_files["Q4_0"].read_bytes()[:5000])
    assert "is not a readable GGUF file" in _one_error_line(
        capsys, "export", str(truncated), "--out", str(out)
    )
    other = write_llama_gguf(tiny_model("llama"), tmp_path / "gpt.gguf", architecture="gpt2")
    assert "is a 'gpt2' model" in _one_error_line(capsys, "export", str(other), "--out", str(out))
    bare = write_llama_gguf(tiny_model("llama"), tmp_path / "bare.gguf", with_tokenizer=False)
    assert "has no tokenizer metadata" in _one_error_line(
        capsys, "export", str(bare), "--out", str(out)
    )
    mystery = write_llama_gguf(tiny_model("llama"), tmp_path / "pre.gguf", pre="mystery-bpe")
    line = _one_error_line(capsys, "export", str(mystery), "--out", str(out))
    assert "pre-tokenizer 'mystery-bpe'" in line and "qwen2, " in line
    line = _one_error_line(
        capsys, "export", str(gguf_files["Q4_0"]), "--out", str(out), "--quant", "int4"
    )
    assert "keeps the file's own quantization" in line
    assert "package nonexistent-model-pkg is not installed" in _one_error_line(
        capsys, "export", "--from-package", "nonexistent-model-pkg", "--out", str(out)
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("kind", "block_bytes", "block_weights_count", "halves", "at"),
    [
        ("Q4_K", 144, 256, 2, 0),
        ("Q5_K", 176, 256, 2, 0),
        ("Q6_K", 210, 256, 1, 208),
        ("Q5_0", 22, 32, 1, 0),
        ("Q5_1", 24, 32, 2, 0),
    ],
)
def test_block_types_keep_llama_cpp_values(
    kind: str, block_bytes: int, block_weights_count: int, halves: int, at: int
) -> None:
    """Random blocks (any bytes are valid but the float16 scales, set here) convert to
    MatMulNBits blocks whose values are the gguf package's own dequantization (Q6_K's in
    blocks of 16)."""
    from types import SimpleNamespace

    import gguf

    from edgespec.export.gguf.matmul_nbits import dequantized
    from edgespec.export.gguf.weights import block_weights

    rows, columns = 6, 512
    generator = np.random.default_rng(0)
    count = rows * columns // block_weights_count
    blocks = generator.integers(0, 256, (count, block_bytes), dtype=np.uint8)
    scales = generator.uniform(0.001, 0.05, (count, halves)).astype(np.float16)
    blocks[:, at : at + 2 * halves] = scales.view(np.uint8)  # d (and dmin or m)
    qtype = gguf.GGMLQuantizationType[kind]
    tensor = SimpleNamespace(data=blocks, tensor_type=qtype, shape=(columns, rows))
    weights = block_weights(tensor)
    assert weights is not None and weights.grid_kept and weights.source_type == kind
    assert weights.bits == (4 if kind == "Q4_K" else 8)  # 5- and 6-bit grids: exact at 8 bits
    assert weights.block == (16 if kind == "Q6_K" else 32)
    expected = gguf.quants.dequantize(blocks, qtype).reshape(rows, columns)
    np.testing.assert_allclose(dequantized(weights), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("kind", "block_bytes", "halves"), [("Q4_1", 20, 2), ("Q4_K", 144, 2)])
def test_float16_fields_are_stored_as_float16_and_restored_exactly(
    kind: str, block_bytes: int, halves: int
) -> None:
    """The bundle stores llama.cpp's float16 scales and minimums as float16, and the graph
    recomputes the float32 scales and offsets the importer computed, bit for bit, when
    ONNX Runtime loads it. Q4_K's d·sc and dmin·m, which float16 cannot always hold, are
    stored as their factors, the file's own fields."""
    from types import SimpleNamespace

    import gguf
    import onnxruntime
    from onnx import TensorProto, helper

    from edgespec.export.gguf.builder import GraphBuilder
    from edgespec.export.gguf.weights import block_weights

    rows, columns = 6, 512
    generator = np.random.default_rng(1)
    count = rows * columns // (256 if kind == "Q4_K" else 32)
    blocks = generator.integers(0, 256, (count, block_bytes), dtype=np.uint8)
    fields = generator.uniform(-0.05, 0.05, (count, halves)).astype(np.float16)
    blocks[:, : 2 * halves] = fields.view(np.uint8)
    qtype = gguf.GGMLQuantizationType[kind]
    weights = block_weights(SimpleNamespace(data=blocks, tensor_type=qtype, shape=(columns, rows)))
    assert weights is not None and weights.offsets is not None
    builder = GraphBuilder(accuracy_level=4)
    names = builder.block_initializers("w", weights)
    assert names.offsets_t is not None
    stored = {i.name: i.data_type for i in builder.initializers}
    if kind == "Q4_1":
        assert stored["w.scales.f16"] == stored["w.minimums_t.f16"] == TensorProto.FLOAT16
    else:  # d·sc and dmin·m as the file's float16 per super-block and 6-bit integer per block
        assert stored["w.scales.super"] == stored["w.minimums.super"] == TensorProto.FLOAT16
        assert stored["w.scales.block"] == stored["w.minimums.block"] == TensorProto.UINT8
        assert not {"w.scales", "w.offsets_t"} & set(stored)
    outputs = [
        helper.make_tensor_value_info(names.scales, TensorProto.FLOAT, None),
        helper.make_tensor_value_info(names.offsets_t, TensorProto.FLOAT, None),
    ]
    identities = [helper.make_node("Identity", [n.name], [n.name + ".out"]) for n in outputs]
    for node, value in zip(identities, outputs, strict=True):
        value.name = node.output[0]
    graph = helper.make_graph(
        [*builder.nodes, *identities], "fields", [], outputs, builder.initializers
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    session = onnxruntime.InferenceSession(model.SerializeToString())
    scales, offsets_t = session.run(None, {})
    assert np.array_equal(scales, weights.scales)
    assert np.array_equal(offsets_t, weights.offsets.T)


@pytest.mark.parametrize(
    ("kernels", "layer_type"),
    [
        ("mlas", "Q4_K"),
        *(("gguf", kind) for kind in ("Q4_K", "Q5_K", "Q3_K", "Q2_K", "IQ4_XS", "IQ4_NL")),
    ],
)
def test_tied_k_quant_embedding_is_stored_once_on_the_file_grid(
    tmp_path: Path, kernels: str, layer_type: str
) -> None:
    """A tied Q4_K_M-style file (Q6_K embedding that is also the LM head, Q4_K and Q6_K
    layers; or Q5_K, Q3_K, Q2_K, IQ4_XS or IQ4_NL for Q4_K): every grid is kept, the embedding's one
    initializer feeds both the lookup and the LM head, the parameter count is the file's, and
    greedy speculative output equals the target's own. On ONNX Runtime's MatMulNBits the 6-bit
    grid is stored at 8 bits and single steps are padded; on edgespec's GGUF kernels the bundle
    holds the file's blocks (its size) and every pass runs as it comes."""
    import gguf
    import onnx

    from support.gguf_model import write_tied_k_quant_gguf

    if kernels == "gguf" and gguf_kernel_library() is None:
        pytest.skip("the GGUF kernels did not build in this install")
    path = write_tied_k_quant_gguf(tmp_path / "tied.gguf", layer_type=layer_type)
    out = tmp_path / "bundle"
    command = ["export", str(path), "--out", str(out), "--quiet", "--max-length", "256"]
    assert main([*command, "--kernels", kernels]) == 0
    manifest = load_bundle(out).manifest
    assert manifest.verification.parity.passed and manifest.verification.batch_invariant
    assert manifest.verification.batch_invariance.max_abs_logit_diff == 0.0
    assert manifest.extra["gguf"]["grid_kept"] and not manifest.extra["gguf"]["requantized_types"]
    tensors = gguf.GGUFReader(str(path)).tensors
    file_bytes = sum(int(t.n_bytes) for t in tensors)
    assert manifest.model.parameters == sum(int(t.n_elements) for t in tensors)
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    vocab = manifest.model.vocab_size
    tables = sorted(i.name for i in graph.initializer if i.dims and i.dims[0] == vocab)
    if kernels == "gguf":
        readers = [n.op_type for n in graph.node for name in n.input if name == "embed.gguf_blocks"]
        assert sorted(readers) == ["GgufGather", "GgufMatMul"]
        assert tables == ["embed.gguf_blocks"]
        assert manifest.quantization.scheme == "gguf_blocks"
        assert manifest.graph.min_pass_width == 1
        # The file's blocks as they are; the rest is the float norms and rotary tables, a tenth
        # of a model this small (the real-size tier holds the 0.5B to the file's size).
        assert manifest.memory.weight_bytes <= 1.15 * file_bytes
    else:
        readers = [n.op_type for n in graph.node for name in n.input if name == "embed.qweight"]
        assert sorted(readers) == ["Gather", "MatMulNBits"]
        assert tables == ["embed.qweight", "embed.scales.block", "embed.scales.super"]
        assert manifest.graph.min_pass_width == 2
        # Stored twice, the embedding (1.07 bytes per weight at 8 bits) would add 1.3x its size.
        assert manifest.memory.weight_bytes < 1.25 * file_bytes
    engine = Engine.load(target=out, draft=out)
    for prompt in PROMPTS:
        expected = engine.generate(prompt, drafter="none", max_new_tokens=24)
        result = engine.generate(prompt, drafter="model", k=4, max_new_tokens=24)
        assert result.tokens == expected.tokens and result.stats.drafted > 0


@pytest.mark.parametrize("add_space_prefix", [True, False])
def test_sentencepiece_vocabularies_tokenize_as_llama_cpp_does(
    tmp_path: Path, add_space_prefix: bool
) -> None:
    """A "llama" (SentencePiece) vocabulary becomes BPE merges ranked by score; its
    tokenization equals llama.cpp's, special and byte-fallback tokens included."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from types import SimpleNamespace

    from gguf import GGUFReader

    from edgespec.export.gguf.tokenizer import build_tokenizer

    from support.gguf_model import write_spm_vocab_gguf

    path = write_spm_vocab_gguf(tmp_path / "spm.gguf", add_space_prefix=add_space_prefix)
    built = build_tokenizer(SimpleNamespace(fields=GGUFReader(str(path)).fields, path=path))
    assert built.add_bos_token and built.bos_token_id == 1
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    texts = (
        "the quick brown fox",
        "thethe  quickly drafts\ntarget verifies<|user|>the lazy dog",
        "Über 🙂 tokens, one pass",
        " leading space and trailing ",
    )
    for text in texts:
        ours = built.tokenizer.encode(text, add_special_tokens=False).ids
        assert ours == llm.tokenize(text.encode(), add_bos=False, special=True), text
        # llama.cpp's pieces keep the space put before the text; ours drop it, as Hugging
        # Face's Llama tokenizers do, so that text without special tokens comes back whole.
        theirs = llm.detokenize(ours, special=True).decode()
        decoded = built.tokenizer.decode(ours, skip_special_tokens=False)
        assert decoded == theirs[1:] if add_space_prefix else decoded == theirs, text
        if "<|user|>" not in text:
            assert decoded == text


def test_quantized_gemma3_keeps_its_sliding_window_on_the_kernels(tmp_path: Path) -> None:
    """On the GGUF kernels Gemma 3's sliding-window layers run on the CacheAttention kernel
    (each row reads its window only): over 40 positions, ten times the 4-position window,
    every logit row follows llama.cpp's, the pass widths agree bit for bit, and no attention
    boundaries are needed."""
    from edgespec.graph.kernels import attends_on_kernel
    from edgespec.runtime.model import OnnxModel

    from support.gguf_model import write_gemma3_gguf

    if gguf_kernel_library() is None:
        pytest.skip("the GGUF kernels did not build in this install")
    path = write_gemma3_gguf(tmp_path / "gemma3.gguf", head_dim=32, weight_type="Q8_0")
    argv = ["export", str(path), "--out", str(tmp_path / "bundle"), "--quiet"]
    assert main(argv) == 0
    bundle = load_bundle(tmp_path / "bundle")
    graph = bundle.manifest.graph
    assert graph.attention_boundaries == () and graph.min_pass_width == 1
    assert attends_on_kernel(bundle.manifest.quantization.op_types)
    assert graph.kv_dtype == "float16"  # as llama.cpp keeps its cache
    invariance = bundle.manifest.verification.batch_invariance
    assert invariance is not None and invariance.max_abs_logit_diff == 0.0
    model = OnnxModel(bundle)
    tokens = [1, *range(300, 339)]
    cache = model.new_cache()
    # forward returns a view of its output buffer, valid until the next pass: copy each.
    ours = np.concatenate(
        [np.array(model.forward(tokens[i : i + 8], cache)) for i in range(0, 40, 8)]
    )
    theirs = _llama_cpp_logits(path, tokens)
    assert np.abs(ours - theirs).max() < 3e-2 * np.abs(theirs).max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_gemma3_imports_and_matches_llama_cpp(tmp_path: Path) -> None:
    """A random-weight Gemma 3 (sliding-window layers with a 4-position window, one global
    layer, Q/K norms, post norms, GELU, scaled embedding) in F32: the export passes its
    checks, and its logits at every position of a 20-token prompt equal llama.cpp's."""
    from edgespec.runtime.model import OnnxModel

    from support.gguf_model import write_gemma3_gguf

    path = write_gemma3_gguf(tmp_path / "gemma3.gguf")
    assert main(["export", str(path), "--out", str(tmp_path / "bundle"), "--quiet"]) == 0
    bundle = load_bundle(tmp_path / "bundle")
    assert bundle.manifest.verification.parity.passed
    assert bundle.manifest.verification.batch_invariant
    # Tied and float: the LM head reads the embedding table itself (no second copy).
    spec = bundle.manifest.model
    table_bytes = 4 * spec.vocab_size * spec.hidden_size
    assert bundle.manifest.memory.weight_bytes < 4 * spec.parameters + table_bytes // 2
    model = OnnxModel(bundle)
    tokens = [1, *range(300, 319)]
    ours = np.array(model.forward(tokens, model.new_cache()))
    theirs = _llama_cpp_logits(path, tokens)
    assert np.abs(ours - theirs).max() < 1e-2 * np.abs(theirs).max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_kernel_attention_without_the_kernels_is_refused_in_one_line(
    gguf_files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["export", str(gguf_files["Q4_1"]), "--out", str(tmp_path / "out"), "--quiet"]
    assert main([*argv, "--kernels", "mlas", "--attention", "kernel"]) != 0
    error = capsys.readouterr().err.strip()
    assert "--attention kernel runs on edgespec's GGUF kernels" in error
    assert "leave --attention at auto" in error and not (tmp_path / "out").exists()
