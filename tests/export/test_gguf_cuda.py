"""GGUF bundles under CUDA: the target's cache on the GPU and the float16 attention copy that
CUDA sessions run (skipped where CUDA is absent, except the copy's CPU checks)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgespec.api import Engine
from edgespec.manifest import load_bundle

from support.gguf_bundles import PROMPTS

pytestmark = pytest.mark.integration
pytest.importorskip("gguf")


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
