"""The engine's public face on exported tiny pairs: streaming, stats, chat templates, warnings,
bad input refused in one line, the CLI's generate and bench, closing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.errors import BundleError, ConfigError, ContextLimitError, IncompatiblePairError

pytestmark = pytest.mark.integration

PROMPTS = ("def fibonacci(n):\n    if n", "import os\nimport sys\n\nclass ")


def test_stop_string_across_token_boundaries(engines: Callable[[str, str], Engine]) -> None:
    engine = engines("llama", "fp32")
    full = engine.generate(PROMPTS[0], drafter="none", max_new_tokens=40)
    stop = full.text[3:6]
    assert len(stop) == 3
    result = engine.generate(PROMPTS[0], k=3, max_new_tokens=40, stop=[stop])
    assert result.text == full.text[: full.text.index(stop)]
    assert result.finish_reason == "stop_string"
    # Tokens end with the one that completed the stop string.
    assert result.tokens == full.tokens[: len(result.tokens)]
    decoded = engine.tokenizer.decode(list(result.tokens))
    assert stop in decoded and stop not in engine.tokenizer.decode(list(result.tokens[:-1]))
    streamed = "".join(engine.stream(PROMPTS[0], k=3, max_new_tokens=40, stop=[stop]))
    assert streamed == result.text


def test_engine_is_reachable_from_the_package_root(exported: Callable[..., Path]) -> None:
    import edgespec

    engine = edgespec.Engine.load(target=exported("llama", "fp32"))
    assert isinstance(engine.generate(PROMPTS[0], max_new_tokens=3), edgespec.Result)


def test_stream_yields_the_text_in_pieces(engines: Callable[[str, str], Engine]) -> None:
    engine = engines("qwen2", "fp32")
    pieces = list(engine.stream(PROMPTS[1], k=4, max_new_tokens=30))
    assert len(pieces) > 1
    assert "".join(pieces) == engine.generate(PROMPTS[1], k=4, max_new_tokens=30).text


def test_stats_keys(engines: Callable[[str, str], Engine]) -> None:
    stats = engines("llama", "fp32").generate(PROMPTS[0], k=4, max_new_tokens=20).stats
    for key in (
        "new_tokens",
        "rounds",
        "alpha",
        "mean_accepted",
        "acceptance_by_position",
        "draft_ms",
        "verify_ms",
        "overhead_ms",
        "prefill_ms",
        "time_to_first_token_ms",
        "tokens_per_s",
        "k_values",
    ):
        assert key in stats.to_dict()
    # k shrinks in the last rounds so that no round drafts past max_new_tokens.
    assert stats.new_tokens == 20 and max(stats.k_values) == 4
    assert stats.providers["target"] == ["CPUExecutionProvider"]


def test_engine_warns_about_unverified_targets(
    exported: Callable[..., Path],
    tiny_model: Callable[[str], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert Engine.load(target=exported("llama", "fp32")).warnings == []
    unverified = tmp_path / "unverified"
    assert (
        main(
            ["export", str(tiny_model("llama")), "--out", str(unverified), "--no-verify", "--quiet"]
        )
        == 0
    )
    assert "not checked batch invariant" in Engine.load(target=unverified).warnings[0]
    capsys.readouterr()
    assert main(["generate", "x", "--target", str(unverified), "--max-new-tokens", "2"]) == 0
    assert "edgespec: warning: target" in capsys.readouterr().err


def test_chat_template_is_applied(engines: Callable[[str, str], Engine]) -> None:
    engine = engines("llama", "fp32")
    assert engine.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<s>user: hi\nassistant:"
    )
    assert engine.encode("hi", chat=True)[0] == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"prompt": ""}, "the prompt is empty"),
        ({"k": -1}, "k -1 is out of range; k is 0 (no drafting) to 8, or 'auto'"),
        ({"k": 100}, "k 100 is out of range"),
        ({"temperature": float("nan")}, "temperature nan is not a finite number"),
        ({"temperature": -0.5}, "temperature -0.5 is negative"),
        ({"top_p": 0.0}, "top_p 0.0 is outside (0, 1]"),
        ({"top_p": 1.5}, "top_p 1.5 is outside (0, 1]"),
        ({"drafter": "psychic"}, "unknown drafter"),
        ({"drafter": "ngram", "temperature": 0.5, "sampling_mode": "rejection"}, "cannot use"),
    ],
)
def test_bad_generation_options(
    engines: Callable[[str, str], Engine], options: dict[str, object], message: str
) -> None:
    prompt = options.pop("prompt", PROMPTS[0])
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        engines("llama", "fp32").generate(prompt, **options)


def test_prompt_longer_than_the_context(engines: Callable[[str, str], Engine]) -> None:
    engine = engines("llama", "fp32")
    ids = engine.encode("x = 1\n" * 200)
    assert len(ids) > 256
    with pytest.raises(ContextLimitError, match="fills the context of 256 tokens by itself") as r:
        engine.generate(ids, max_new_tokens=10)
    # A prompt alone too long is not told to lower max_new_tokens.
    assert r.value.fix is not None and "max_new_tokens" not in r.value.fix
    assert "--context" in r.value.fix
    with pytest.raises(ContextLimitError, match=r"plus max_new_tokens \(60\) exceeds") as r:
        engine.generate(ids[:200], max_new_tokens=60)
    assert r.value.fix is not None and r.value.fix.startswith("lower max_new_tokens to 56 or less")
    with pytest.raises(ContextLimitError, match=r"the prompt \(1 token\) plus"):
        engine.generate(ids[:1], max_new_tokens=300)


def test_tokenizer_mismatch_names_the_difference(
    exported: Callable[..., Path], tmp_path: Path
) -> None:
    from support.tiny_models import build_model, corpus_texts, train_tokenizer

    texts = corpus_texts()[::-1]
    tokenizer = train_tokenizer(texts[:2])
    ids = [t for text in texts for t in tokenizer(text)["input_ids"]]
    model = build_model("mistral", tmp_path / "foreign", tokenizer, ids, steps=0)
    assert main(["export", str(model), "--out", str(tmp_path / "b"), "--quiet", "--no-verify"]) == 0
    with pytest.raises(
        IncompatiblePairError, match=r"token id .* in the draft and .* in the target"
    ):
        Engine.load(target=exported("llama", "fp32"), draft=tmp_path / "b")


def test_corrupted_bundle(exported: Callable[..., Path], tmp_path: Path) -> None:
    import shutil

    broken = Path(shutil.copytree(exported("llama", "fp32"), tmp_path / "broken"))
    graph = broken / "model.onnx"
    graph.write_bytes(graph.read_bytes()[:1000])
    with pytest.raises(BundleError, match="truncated"):
        Engine.load(target=broken)


def test_cli_generate_json_and_errors(
    exported: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = exported("llama", "fp32"), exported("mistral", "fp32")
    assert (
        main(
            [
                "generate",
                PROMPTS[0],
                "--target",
                str(target),
                "--draft",
                str(draft),
                "--max-new-tokens",
                "12",
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"text", "tokens", "stats"} and len(result["tokens"]) == 12
    # A value an option cannot take is a usage error: exit 2, before anything loads.
    assert main(["generate", PROMPTS[0], "--target", str(target), "--top-p", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == (
        "edgespec: error: --top-p 2.0 is outside (0, 1]; use 1.0 (off) or e.g. 0.9"
    )


def test_cli_bench_json_keys(
    exported: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\\n    return\nclass Point:\n")
    assert (
        main(
            [
                "bench",
                "--target",
                str(exported("llama", "fp32")),
                "--draft",
                str(exported("mistral", "fp32")),
                "--prompts",
                str(prompts),
                "--max-new-tokens",
                "8",
                "--json",
            ]
        )
        == 0
    )
    results = json.loads(capsys.readouterr().out)
    for key in (
        "speedup",
        "alpha",
        "mean_accepted",
        "c",
        "verify_cost",
        "theoretical_speedup",
        "efficiency",
        "tokens_per_s",
    ):
        assert key in results
    assert len(results["verify_cost"]) == 9 and results["verify_cost"][0] == 1.0
    assert results["greedy"]["identical_output"] is True


def test_an_engine_closes_and_refuses_to_generate_after() -> None:
    from edgespec.api import Engine
    from edgespec.errors import ConfigError

    with Engine.load(measure_energy=False) as engine:
        assert engine.generate("def f():", max_new_tokens=4).tokens
    with pytest.raises(ConfigError, match="engine is closed"):
        engine.generate("def f():", max_new_tokens=4)
    engine.close()  # twice: nothing happens
    assert engine.target is not None and engine.target.released
