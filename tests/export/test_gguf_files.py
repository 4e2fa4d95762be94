"""GGUF files against llama.cpp: tokenizers and logits, block types and float16 fields kept
exactly, tied embeddings, sentencepiece vocabularies, Gemma 3, and bad files refused in one
line without writing anything."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.cli.bundles import bundle_summary
from edgespec.graph.kernels import gguf_kernel_library
from edgespec.manifest import load_bundle

from support.gguf_bundles import PROMPTS

pytestmark = pytest.mark.integration
pytest.importorskip("gguf")


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
    result = subprocess.run(  # outside the checkout: the installed package, as users run it
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=tmp_path
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
    # Cut after its header: the tensor table already says how short it is.
    whole = gguf_files["Q4_0"].read_bytes()
    truncated.write_bytes(whole[: len(whole) * 9 // 10])
    line = _one_error_line(capsys, "export", str(truncated), "--out", str(out))
    assert f"truncated.gguf is truncated: its header's tensors need {len(whole):,} bytes" in line
    assert "download the file again" in line
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

    from support.gguf_blocks import write_tied_k_quant_gguf

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
