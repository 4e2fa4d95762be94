"""A draft over a window of its history (``draft_window``): its session's attention reads the
first 128 positions and the last ``window`` only, the same bits as the whole history's until
the history outgrows both, and the pair's output is still the target's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.integration

WINDOW = 256
CONTEXT = 1024


@pytest.fixture(scope="module")
def long_gguf(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from support.gguf_model import write_llama_gguf

    out = tmp_path_factory.mktemp("window") / "model.gguf"
    # the tiny Llama's rotary tables stretched to 1,024 positions: room for a window and more
    return write_llama_gguf(
        tiny_model("llama"), out, weight_type="Q8_0", rope_scaling={"context_length": CONTEXT}
    )


def test_a_windowed_draft_reads_the_sink_and_the_window_only(
    long_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgespec.models.bundles import gguf_file_bundle
    from edgespec.runtime.model import ModelOptions, OnnxModel

    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    bundle = gguf_file_bundle(long_gguf)
    whole = OnnxModel(bundle, options=ModelOptions(max_length=CONTEXT))
    windowed = OnnxModel(bundle, options=ModelOptions(max_length=CONTEXT, attention_window=WINDOW))
    assert (whole.attention_window, windowed.attention_window) == (0, WINDOW)
    tokens = list(np.random.default_rng(0).integers(3, whole.vocab_size, 700))
    logits = []
    for model in (whole, windowed):
        cache = model.new_cache()
        logits.append(np.array(model.forward(tokens, cache)))
    # Row t sees 0 .. 127 and t - 255 .. t: everything up to t = 383, then less.
    seen_whole = WINDOW + 128
    assert np.array_equal(logits[0][:seen_whole], logits[1][:seen_whole])
    differs = np.abs(logits[0] - logits[1]).max(axis=1) > 1e-4
    assert differs[seen_whole + 64 :].all()


def test_the_pair_with_a_windowed_draft_gives_the_targets_tokens(
    long_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgespec.api import Engine

    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    engine = Engine.load(target=long_gguf, draft=long_gguf, context=CONTEXT, draft_window=WINDOW)
    assert engine.draft is not None and engine.draft.attention_window == WINDOW
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, 200, 600)]
    expected = engine.generate(prompt, max_new_tokens=32, drafter="none").tokens
    result = engine.generate(prompt, max_new_tokens=32, drafter="model", k=4)
    assert result.tokens == expected
    assert result.stats.draft_steps > 0


def test_a_window_shorter_than_its_sink_is_refused_in_one_line() -> None:
    from edgespec.api import Engine
    from edgespec.errors import ConfigError

    with pytest.raises(ConfigError, match="draft window of 100 positions"):
        Engine.load(target="unused", draft_window=100)
