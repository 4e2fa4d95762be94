"""A head on a tiny GGUF target, trained in the test (seconds): the target's features are
batch invariant, greedy output with the head (alone or in the combined drafter) is the
target's own at every k, the head's cache rolls back after a partial acceptance, sampled
drafts keep the target's distribution, and a head made for another target is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError, IncompatiblePairError
from edgespec.manifest import load_bundle
from edgespec.runtime.drafters.head import HeadDrafter
from edgespec.runtime.model import ModelOptions, OnnxModel
from edgespec.runtime.sampling import probabilities
from edgespec.runtime.verifiers.local import LocalVerifier

from support.statistics_checks import chi_square, chi_square_critical

pytestmark = pytest.mark.integration

PROMPTS = ([5, 17, 33, 2, 9, 100, 120], list(range(1, 30)), [300, 200, 100, 50])


@pytest.fixture(scope="module")
def target_and_head(
    tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    from edgespec.cli import main
    from edgespec.export.head import HeadConfig, train_head

    from support.gguf_model import write_llama_gguf

    root = tmp_path_factory.mktemp("head")
    files = {
        "q8": write_llama_gguf(tiny_model("llama"), root / "q8.gguf", weight_type="Q8_0"),
        "f32": write_llama_gguf(tiny_model("llama"), root / "f32.gguf"),
    }
    bundles = {}
    for name, path in files.items():
        out = root / f"{name}-bundle"
        assert main(["export", str(path), "--out", str(out), "--quiet", "--max-length", "256"]) == 0
        bundles[name] = out
    head = train_head(
        HeadConfig(
            target=bundles["q8"],
            gguf=files["q8"],
            out=root / "head",
            data_minutes=2,
            train_minutes=2,
            max_samples=48,
            max_steps=80,
            new_tokens=24,
            prompt_tokens=32,
            vocabulary=128,
            edit_prompts=8,
            max_length=256,
        ),
        log=lambda line: None,
    )
    return {"target": bundles["q8"], "other": bundles["f32"], "head": head.root}


def test_features_are_batch_invariant(target_and_head: dict[str, Path]) -> None:
    bundle = load_bundle(target_and_head["target"])
    invariance = bundle.manifest.verification.batch_invariance
    assert invariance is not None and invariance.max_abs_feature_diff == 0.0
    model = OnnxModel(bundle)
    tokens = list(range(3, 40))
    cache = model.new_cache()
    _, whole = model.forward_features(tokens, cache)
    cache = model.new_cache()
    single = np.concatenate([model.forward_features([t], cache)[1] for t in tokens])
    np.testing.assert_array_equal(whole, single)


@pytest.mark.parametrize("drafter", ["head", "combined"])
@pytest.mark.parametrize("k", [1, 2, 4, "auto"])
def test_greedy_output_is_the_targets_own(
    target_and_head: dict[str, Path], drafter: str, k: Any
) -> None:
    from edgespec.api import Engine

    engine = Engine.load(target=target_and_head["target"], head=target_and_head["head"])
    for prompt in PROMPTS:
        plain = engine.generate(prompt, max_new_tokens=40, drafter="none")
        spoken = engine.generate(prompt, max_new_tokens=40, drafter=drafter, k=k)
        assert spoken.tokens == plain.tokens


def test_the_head_drafts_and_is_accepted(target_and_head: dict[str, Path]) -> None:
    """On held-out requests the trained head proposes tokens the target keeps (a head that
    never drafted, or whose features were misaligned, would be accepted at about
    1 / vocabulary)."""
    from edgespec.api import Engine
    from edgespec.export.head.requests import HELD_OUT, requests

    engine = Engine.load(target=target_and_head["target"], head=target_and_head["head"])
    accepted = tested = 0
    for request in requests(8, 0)[:HELD_OUT][:6]:
        result = engine.generate(request, max_new_tokens=24, drafter="head", k=3)
        accepted, tested = accepted + result.stats.accepted, tested + result.stats.tested
    assert tested > 0
    assert accepted / tested > 0.15


def _pair(paths: dict[str, Path]) -> tuple[OnnxModel, OnnxModel]:
    target = OnnxModel(load_bundle(paths["target"]))
    head = OnnxModel(load_bundle(paths["head"]), options=ModelOptions(exact_passes=False))
    return target, head


def test_rollback_after_partial_acceptance(target_and_head: dict[str, Path]) -> None:
    """After a round that keeps 1 of 4 drafted tokens, the head's next proposal is the one
    a head prefilled over the same committed tokens makes."""
    target, head = _pair(target_and_head)
    greedy = SamplingConfig()
    prompt = PROMPTS[1]
    verifier = LocalVerifier(target, features=True)
    drafter = HeadDrafter(head, vocab_size=target.vocab_size)
    rng = np.random.default_rng(0)
    features = verifier.begin(prompt, sampling=greedy, rng=rng)
    drafter.begin(prompt, sampling=greedy, rng=rng, features=features)
    draft = drafter.propose(4)
    assert len(draft.tokens) == 4
    keep = draft.tokens[:1]
    # The target's features of the round's last token and the one kept token, as a verdict
    # that accepted 1 carries them; the token after them is one the draft did not propose.
    _, features = target.forward_features([prompt[-1], *keep], verifier.cache)
    next_token = (draft.tokens[1] + 1) % target.vocab_size
    drafter.commit(1, next_token, features=features)
    following = drafter.propose(3)

    fresh = HeadDrafter(head, vocab_size=target.vocab_size)
    committed = [*prompt, *keep, next_token]
    fresh_verifier = LocalVerifier(target, features=True)
    features = fresh_verifier.begin(committed, sampling=greedy, rng=rng)
    fresh.begin(committed, sampling=greedy, rng=rng, features=features)
    expected = fresh.propose(3)
    assert following.tokens == expected.tokens


def test_sampled_drafts_keep_the_targets_distribution(target_and_head: dict[str, Path]) -> None:
    """Rejection sampling over the head's sparse q (its kept tokens only): the first emitted
    token follows the target's distribution (chi-square, false-failure rate 1e-4)."""
    target, head = _pair(target_and_head)
    sampling = SamplingConfig(temperature=1.0, mode="rejection")
    prompt = PROMPTS[0]
    rng = np.random.default_rng(7)
    verifier = LocalVerifier(target, features=True)
    features = verifier.begin(prompt, sampling=sampling, rng=rng)
    prefix = verifier.cache.length
    drafter = HeadDrafter(head, vocab_size=target.vocab_size)
    drafter.begin(prompt, sampling=sampling, rng=rng, features=features)
    p = probabilities(target.forward(prompt, target.new_cache())[-1], sampling)
    counts = np.zeros(target.vocab_size, np.int64)
    for _ in range(20_000):
        draft = drafter.propose(1)  # one token: the head's cache is not touched
        verdict = verifier.verify(prompt[-1], draft)
        counts[verdict.tokens[0]] += 1
        verifier.cache.crop(prefix)
    assert counts[p == 0].sum() == 0, "a token outside the target's support was emitted"
    statistic, freedom = chi_square(counts, p)
    assert statistic < chi_square_critical(freedom), (statistic, freedom)


def test_a_head_for_another_target_is_refused(target_and_head: dict[str, Path]) -> None:
    from edgespec.api import Engine

    with pytest.raises(IncompatiblePairError, match="made for"):
        Engine.load(target=target_and_head["other"], head=target_and_head["head"])


def test_a_head_with_a_remote_target_is_one_clear_line(target_and_head: dict[str, Path]) -> None:
    from edgespec.engine.assembly import DraftSource, reads_features

    _, head = _pair(target_and_head)
    source = DraftSource(
        draft=None,
        head=head,
        vocab_size=384,
        stop_probability=0.0,
        costs=lambda: None,  # type: ignore[arg-type, return-value]
    )
    assert reads_features("head", source) and reads_features("combined", source)
    with pytest.raises(ConfigError, match="features"):
        HeadDrafter(head, vocab_size=384).begin(
            [1, 2, 3], sampling=SamplingConfig(), rng=np.random.default_rng(0), features=None
        )


def test_pair_checks_a_head_against_its_target(target_and_head: dict[str, Path]) -> None:
    from edgespec.cli import main

    head = str(target_and_head["head"])
    assert main(["pair", "--head", head, str(target_and_head["target"])]) == 0
    assert main(["pair", "--head", head, str(target_and_head["other"])]) == 1


def test_a_head_profile_races_a_named_draft_model_too(
    target_and_head: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """``pair --head HEAD --profile DRAFT TARGET`` races the draft model beside the head's own
    drafters (the float32 import of the same tiny model drafts: its tokenizer is the
    target's); without --profile a DRAFT is refused in one line."""
    import json

    from edgespec.cli import main

    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path))  # where the measured choice is kept
    head, draft, target = (str(target_and_head[n]) for n in ("head", "other", "target"))
    assert main(["pair", "--head", head, "--profile", "--json", draft, target]) == 0
    profile = json.loads(capsys.readouterr().out)["profile"]
    assert set(profile["by_drafter"]) == {"head", "combined", "ngram", "model"}
    assert main(["pair", "--head", head, draft, target]) == 1
    assert "only races in --profile" in capsys.readouterr().err


def test_the_training_schedule_warms_up_decays_and_unrolls_late() -> None:
    from edgespec.export.head.train import FINAL_LR_SHARE, WARMUP_STEPS, TrainSettings, schedule

    settings = TrainSettings(lr=1e-3, depth=3, depth_one_share=0.5)
    first_lr, first_depth = schedule(settings, step=0, progress=0.0)
    assert first_lr == 1e-3 / WARMUP_STEPS and first_depth == 1
    peak_lr, _ = schedule(settings, step=WARMUP_STEPS, progress=0.0)
    late_lr, late_depth = schedule(settings, step=10_000, progress=0.75)
    last_lr, _ = schedule(settings, step=10_000, progress=1.0)
    assert peak_lr == 1e-3 and late_depth == 3
    assert peak_lr > late_lr > last_lr
    assert abs(last_lr - 1e-3 * FINAL_LR_SHARE) < 1e-12


def test_self_written_requests_keep_closed_turns_and_leave_out_benchmark_prompts() -> None:
    """The requests the target writes after its template's user-turn opening: kept where it
    closed the turn, each once, never a benchmark prompt, at most the count asked for."""
    from edgespec.export.head.requests import benchmark_prompts, self_written_requests

    template = (
        "{% for m in messages %}<|user|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    excluded = benchmark_prompts()
    assert "What is the capital of France?" in excluded
    words = {1: "Explain tides to me.", 2: "What is the capital of France?", 3: "Hi"}
    # What the target writes at each try: a closed turn (token ids), or None (it did not close).
    script = [[1], [1], None, [2], [3], [1, 1], [1, 1, 1], [1, 1, 1, 1]]
    openings: list[list[int]] = []

    class ScriptedTeacher:
        def written(self, prompt: list[int], count: int, **_: Any) -> list[int] | None:
            openings.append(prompt)
            return script[len(openings) - 1]

    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(ids: list[int]) -> str:
        return " ".join(words[i] for i in ids)

    def written(template: str | None) -> list[str]:
        return self_written_requests(
            ScriptedTeacher(),  # type: ignore[arg-type]
            template,
            encode,
            decode,
            3,
            seed=0,
            excluded=excluded,
            log=lambda line: None,
        )

    found = written(template)
    assert found == ["Explain tides to me.", " ".join([words[1]] * 2), " ".join([words[1]] * 3)]
    assert openings[0] == encode("<|user|>")
    assert len(openings) == 7
    assert written(None) == []


def test_greedy_answers_with_lookup_passes_are_the_one_token_steps(
    target_and_head: dict[str, Path],
) -> None:
    """A head's data: the target's greedy answers, decoded with prompt-lookup passes, give
    the tokens and features (bit for bit) of one-token steps, in fewer passes where the
    answer repeats its context."""
    from edgespec.export.head.data import FeatureTeacher

    bundle = load_bundle(target_and_head["target"])
    teacher = FeatureTeacher(bundle, threads=1)
    passes = []
    forward_features = teacher.driver.forward_features

    def counted(tokens: Any, cache: Any, **options: Any) -> Any:
        passes.append(len(tokens))
        return forward_features(tokens, cache, **options)

    teacher.driver.forward_features = counted  # type: ignore[method-assign]
    model = OnnxModel(bundle)
    answered = decode_passes = 0
    for prompt in ([5, 6, 7, 8] * 6, *PROMPTS):
        passes.clear()
        sample = teacher.answer(list(prompt), 48, temperature=0.0, rng=np.random.default_rng(0))
        cache = model.new_cache()
        logits, features = model.forward_features(list(prompt), cache)
        tokens, rows = list(prompt), [features]
        while len(tokens) < len(sample.tokens):
            tokens.append(int(np.argmax(logits[-1])))
            logits, features = model.forward_features(tokens[-1:], cache)
            rows.append(features)
        assert sample.tokens.tolist() == tokens
        np.testing.assert_array_equal(sample.features, np.concatenate(rows).astype(np.float16))
        answered += len(tokens) - len(prompt)
        decode_passes += len(passes) - 1  # the prompt's one prefill pass
    assert decode_passes < answered
