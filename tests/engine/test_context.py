"""The context a session runs at is chosen at load (``--context``, ``Engine.load(context=)``),
up to the model's trained length, from one import: the KV cache is allocated for it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from edgespec.errors import ConfigError

pytestmark = pytest.mark.integration

PROMPT = [5, 17, 33, 2, 9, 41]


@pytest.fixture(scope="module")
def gguf_target(
    tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A tiny Llama GGUF (trained length 256) imported once into a bundle."""
    from edgespec.config import ExportConfig
    from edgespec.export.gguf.pipeline import export_gguf

    from support.gguf_model import write_llama_gguf

    folder = tmp_path_factory.mktemp("context")
    path = write_llama_gguf(tiny_model("llama"), folder / "model.gguf", weight_type="Q8_0")
    export_gguf(ExportConfig(model=str(path), out=folder / "bundle"))
    return folder / "bundle"


def test_one_import_runs_at_every_context_up_to_the_trained_length(gguf_target: Path) -> None:
    from edgespec.api import Engine
    from edgespec.manifest import load_bundle

    manifest = load_bundle(gguf_target).manifest
    # The graph fixes no buffer length; its rotary tables cover the model's trained length.
    assert manifest.graph.kv_capacity is None
    assert manifest.model.max_length == manifest.model.max_position_embeddings == 256
    kv_shape = next(s.shape for s in manifest.graph.inputs if s.name == manifest.graph.past_key[0])
    assert kv_shape[2] == "capacity"

    outputs = {}
    for context in (64, 160, None):
        engine = Engine.load(target=gguf_target, context=context)
        assert engine.max_length == (context or 256)
        assert engine.target is not None
        cache = engine.target.new_cache()
        assert cache.capacity == engine.max_length  # allocated for the context, no more
        outputs[context] = engine.generate(PROMPT, max_new_tokens=40, drafter="none").tokens
        # The cache holds the whole context, to its last position, and not one more.
        tokens = [(7 * i) % 50 + 3 for i in range(engine.max_length)]
        engine.target.start(tokens, cache)  # all but the last token
        engine.target.forward(tokens[-1:], cache)
        assert cache.length == engine.max_length
        with pytest.raises(ConfigError):
            engine.target.forward([3], cache)
    assert outputs[64] == outputs[160] == outputs[None]


def test_a_context_past_the_trained_length_is_one_line(gguf_target: Path) -> None:
    from edgespec.api import Engine

    with pytest.raises(ConfigError, match="longer than") as caught:
        Engine.load(target=gguf_target, context=1000)
    assert "--context 256 or less" in str(caught.value.fix)
    with pytest.raises(ConfigError, match="too short"):
        Engine.load(target=gguf_target, context=8)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgespec",
            "generate",
            "--target",
            str(gguf_target),
            "--context",
            "100000",
            "hello",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=gguf_target.parent,  # outside the checkout, as a user runs it
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) <= 2 and "longer than" in lines[0] and "--context 256" in done.stderr


def test_the_memory_estimate_prices_the_context(gguf_target: Path) -> None:
    from edgespec.manifest import load_bundle
    from edgespec.telemetry.estimate import estimate_pair

    bundle = load_bundle(gguf_target)
    short = estimate_pair(bundle, None, base_bytes=0, context=64)
    long = estimate_pair(bundle, None, base_bytes=0, context=256)
    assert (short.context, long.context) == (64, 256)
    per_token = bundle.manifest.memory.kv_bytes_per_token
    assert long.total_bytes - short.total_bytes >= per_token * (256 - 64)


def test_a_prompt_that_starts_as_the_last_one_is_prefilled_from_where_they_part(
    gguf_target: Path,
) -> None:
    """A chat's next turn: the cache keeps the history's positions, and the answer is the one
    a fresh engine gives (for the target and for a draft model beside it)."""
    from edgespec.api import Engine

    engine = Engine.load(target=gguf_target, draft=gguf_target, context=256)
    first = [(11 * i) % 60 + 3 for i in range(70)]
    answer = engine.generate(first, max_new_tokens=20, drafter="model", k=3).tokens
    follow_up = [*first, *answer, 8, 9, 10, 11]
    again = engine.generate(follow_up, max_new_tokens=20, drafter="model", k=3)
    assert engine.target is not None and engine.draft is not None
    assert engine.target.reused_tokens >= len(first) + len(answer) - 1
    assert engine.draft.reused_tokens >= len(first)
    fresh = Engine.load(target=gguf_target, draft=gguf_target, context=256)
    expected = fresh.generate(follow_up, max_new_tokens=20, drafter="none").tokens
    assert again.tokens == expected
    # Another prompt shares nothing: it is prefilled whole, and still right.
    other = [(5 * i) % 40 + 7 for i in range(50)]
    assert engine.generate(other, max_new_tokens=12, drafter="ngram").tokens == (
        fresh.generate(other, max_new_tokens=12, drafter="none").tokens
    )
    assert engine.target.reused_tokens == 0
