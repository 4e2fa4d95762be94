"""The speculative engine on exported tiny pairs: exactness, rollback, sampling modes, errors."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.config import SamplingConfig
from edgespec.errors import BundleError, ConfigError, ContextLimitError, IncompatiblePairError
from edgespec.manifest import load_bundle
from edgespec.runtime.decoder import decode
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.k_policy import FixedK
from edgespec.runtime.model import ModelOptions, OnnxModel
from edgespec.runtime.stats import StatsCollector
from edgespec.runtime.verifiers.local import LocalVerifier

pytestmark = pytest.mark.integration

PROMPTS = ("def fibonacci(n):\n    if n", "import os\nimport sys\n\nclass ")
TARGETS = [("llama", "fp32"), ("llama", "int4"), ("qwen2", "fp32"), ("qwen2", "int4")]


@pytest.fixture(scope="module")
def engines(exported: Callable[..., Path]) -> Callable[[str, str], Engine]:
    """``engines(arch, quant)``: that target with the tiny Mistral draft (shared tokenizer)."""
    cache: dict[tuple[str, str], Engine] = {}

    def get(architecture: str, quant: str) -> Engine:
        if (architecture, quant) not in cache:
            target = exported(architecture, quant)
            assert load_bundle(target).manifest.verification.batch_invariant
            cache[(architecture, quant)] = Engine.load(
                target=target, draft=exported("mistral", "fp32")
            )
        return cache[(architecture, quant)]

    return get


@pytest.mark.parametrize(("architecture", "quant"), TARGETS)
def test_greedy_speculation_equals_target_greedy_for_every_k(
    engines: Callable[[str, str], Engine], architecture: str, quant: str
) -> None:
    engine = engines(architecture, quant)
    for prompt in PROMPTS:
        expected = engine.generate(prompt, drafter="none", max_new_tokens=40)
        assert len(expected.tokens) == 40 or expected.finish_reason == "eos"
        for k in range(1, 9):
            for drafter in ("model", "ngram"):
                result = engine.generate(prompt, drafter=drafter, k=k, max_new_tokens=40)
                assert result.tokens == expected.tokens, (drafter, k)
                assert result.text == expected.text


def test_self_draft_accepts_everything(exported: Callable[..., Path]) -> None:
    """Draft = target: every round accepts all k tokens (the second off-by-one in the guide)."""
    bundle = exported("llama", "fp32")
    engine = Engine.load(target=bundle, draft=bundle)
    expected = engine.generate(PROMPTS[0], drafter="none", max_new_tokens=41)
    for k in (1, 4, 8):
        result = engine.generate(PROMPTS[0], k=k, max_new_tokens=41)
        assert result.tokens == expected.tokens
        assert result.stats.accepted == result.stats.drafted > 0
        assert result.stats.acceptance_by_position == [1.0] * k


def test_io_bound_engine_equals_default_engine(exported: Callable[..., Path]) -> None:
    """The whole loop (draft and target rollbacks included) on the IO-binding path."""
    target, draft = exported("qwen2", "int4"), exported("mistral", "fp32")
    plain = Engine.load(target=target, draft=draft)
    bound = Engine.load(target=target, draft=draft, io_binding=True)
    assert bound.target.io_binding and not plain.target.io_binding
    for k in (1, 3, 8):
        expected = plain.generate(PROMPTS[0], k=k, max_new_tokens=40)
        result = bound.generate(PROMPTS[0], k=k, max_new_tokens=40)
        assert result.tokens == expected.tokens
        sampled = bound.generate(PROMPTS[0], k=k, max_new_tokens=40, temperature=0.9, seed=4)
        assert (
            sampled.tokens
            == plain.generate(PROMPTS[0], k=k, max_new_tokens=40, temperature=0.9, seed=4).tokens
        )


def test_match_mode_draft_shares_the_targets_draws(exported: Callable[..., Path]) -> None:
    """The draft races each position with the target's keyed variables: a self-draft is always
    accepted in match mode (the default), and the text equals target-only sampling."""
    bundle = exported("llama", "fp32")
    engine = Engine.load(target=bundle, draft=bundle)
    options = dict(temperature=0.9, top_p=0.95, seed=11, max_new_tokens=33)
    expected = engine.generate(PROMPTS[0], drafter="none", **options)
    result = engine.generate(PROMPTS[0], k=4, sampling_mode="match", **options)
    assert result.tokens == expected.tokens
    assert result.stats.accepted == result.stats.drafted > 0
    # match is the default: speculation at any k, or k chosen per round, gives the same text
    for k in (1, "auto"):
        assert engine.generate(PROMPTS[0], k=k, **options).tokens == expected.tokens


def test_draft_with_a_larger_model_vocabulary(
    exported: Callable[..., Path], tiny_model: Callable[[str], Path]
) -> None:
    """Model vocab sizes may differ by up to 128: q_draft is cut to the target's width."""
    wide = exported("mistral-wide", "fp32")
    assert (
        load_bundle(wide).manifest.model.vocab_size
        == load_bundle(exported("llama", "fp32")).manifest.model.vocab_size + 16
    )
    engine = Engine.load(target=exported("llama", "fp32"), draft=wide)
    expected = engine.generate(PROMPTS[1], drafter="none", max_new_tokens=30)
    assert engine.generate(PROMPTS[1], k=3, max_new_tokens=30).tokens == expected.tokens
    sampled = engine.generate(PROMPTS[1], k=3, max_new_tokens=30, temperature=1.0, seed=2)
    assert len(sampled.tokens) == 30 and max(sampled.tokens) < 384


def test_early_stopped_drafts_stay_exact(engines: Callable[[str, str], Engine]) -> None:
    engine = engines("llama", "fp32")
    expected = engine.generate(PROMPTS[0], drafter="none", max_new_tokens=40)
    result = engine.generate(PROMPTS[0], k=8, max_new_tokens=40, draft_min_probability=0.6)
    assert result.tokens == expected.tokens
    assert result.stats.drafted < 8 * result.stats.rounds
    sampled = engine.generate(
        PROMPTS[0],
        k=8,
        max_new_tokens=40,
        temperature=0.8,
        seed=3,
        sampling_mode="match",
        draft_min_probability=0.6,
    )
    assert (
        sampled.tokens
        == engine.generate(
            PROMPTS[0], drafter="none", max_new_tokens=40, temperature=0.8, seed=3
        ).tokens
    )


def test_auto_k_stays_exact(engines: Callable[[str, str], Engine]) -> None:
    engine = engines("llama", "fp32")
    expected = engine.generate(PROMPTS[1], drafter="none", max_new_tokens=48)
    result = engine.generate(PROMPTS[1], k="auto", max_new_tokens=48)
    assert result.tokens == expected.tokens
    assert all(0 <= k <= 8 for k in result.stats.k_values)


class ScriptedDrafter:
    """Right for exactly ``right`` tokens of the known continuation, then wrong."""

    def __init__(self, continuation: Sequence[int], *, right: int, vocab_size: int) -> None:
        self.continuation = list(continuation)
        self.right = right
        self.vocab_size = vocab_size
        self.position = 0
        self.proposed: tuple[int, ...] = ()

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> None:
        self.position = 0

    def propose(self, k: int) -> Draft:
        truth = self.continuation[self.position : self.position + k]
        right = min(self.right, len(truth))
        wrong = [(t + 1) % self.vocab_size for t in truth[right:]]
        self.proposed = tuple(truth[:right] + wrong)
        return Draft(tokens=self.proposed)

    def commit(self, n_accepted: int, next_token: int) -> None:
        self.position += n_accepted + 1


@pytest.mark.parametrize("right", range(0, 5))
def test_scripted_drafter_right_for_exactly_j_tokens(
    exported: Callable[..., Path], right: int
) -> None:
    target = OnnxModel(load_bundle(exported("qwen2", "fp32")))
    engine = Engine.load(target=exported("qwen2", "fp32"))
    prompt = engine.encode(PROMPTS[0])
    expected = engine.generate(prompt, drafter="none", max_new_tokens=30).tokens
    k = 4
    drafter = ScriptedDrafter(expected, right=right, vocab_size=target.vocab_size)
    stats = StatsCollector()
    rounds = decode(
        prompt,
        drafter=drafter,
        verifier=LocalVerifier(target),
        k_policy=FixedK(k),
        sampling=SamplingConfig(),
        rng=np.random.default_rng(0),
        max_new_tokens=30,
        eos_ids=frozenset(),
        observers=(stats,),
    )
    produced = [token for chunk in rounds for token in chunk]
    assert tuple(produced) == expected
    full_rounds = [r for r in stats.records if r.drafted == k]
    assert full_rounds and all(r.n_accepted == right for r in full_rounds)


def test_bound_path_equals_reference_path_with_rollbacks(exported: Callable[..., Path]) -> None:
    bundle = load_bundle(exported("llama", "int4"))
    bound = OnnxModel(bundle, options=ModelOptions(io_binding=True))
    plain = OnnxModel(bundle, options=ModelOptions(io_binding=False))
    fast, reference = bound.new_cache(), plain.new_cache()
    assert type(fast) is not type(reference)  # ping-pong buffers against replaced arrays
    rng = np.random.default_rng(7)
    for _ in range(40):
        count = int(rng.integers(1, 10))
        if fast.length + count > bound.max_length:
            break
        tokens = rng.integers(0, bound.vocab_size, count).tolist()
        fast_logits = bound.forward(tokens, fast).copy()
        reference_logits = plain.forward(tokens, reference)
        np.testing.assert_array_equal(fast_logits, reference_logits)
        keep = int(rng.integers(max(fast.length - count, 0), fast.length + 1))
        fast.crop(keep)
        reference.crop(keep)
        assert fast.length == reference.length == keep


@pytest.mark.parametrize(
    "options",
    [
        {"temperature": 0.8},
        {"temperature": 1.0, "top_k": 20},
        {"temperature": 0.7, "top_p": 0.9},
    ],
)
def test_match_sampling_equals_target_sampling_with_the_same_seed(
    engines: Callable[[str, str], Engine], options: dict[str, float]
) -> None:
    engine = engines("llama", "fp32")
    for seed in (1, 2):
        expected = engine.generate(
            PROMPTS[0], drafter="none", seed=seed, max_new_tokens=40, **options
        )
        for drafter in ("model", "ngram"):
            for k in (1, 3, 8):
                result = engine.generate(
                    PROMPTS[0],
                    drafter=drafter,
                    k=k,
                    seed=seed,
                    sampling_mode="match",
                    max_new_tokens=40,
                    **options,
                )
                assert result.tokens == expected.tokens, (drafter, k, seed)


def test_rejection_sampling_is_reproducible_and_seeded(
    engines: Callable[[str, str], Engine],
) -> None:
    engine = engines("llama", "fp32")
    options = dict(temperature=0.8, max_new_tokens=30, sampling_mode="rejection")
    first = engine.generate(PROMPTS[1], seed=5, **options)
    again = engine.generate(PROMPTS[1], seed=5, **options)
    other = engine.generate(PROMPTS[1], seed=6, **options)
    assert first.tokens == again.tokens
    assert first.tokens != other.tokens
    assert first.stats.drafted > 0


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
    with pytest.raises(
        ContextLimitError, match="exceeds the context limit of 256 tokens"
    ) as raised:
        engine.generate("x = 1\n" * 200, max_new_tokens=10)
    # The fix is what the user can do now; re-exporting is an aside for bundles of their own.
    assert raised.value.fix is not None
    assert raised.value.fix.startswith("shorten the prompt or lower max_new_tokens: 256 tokens")


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
