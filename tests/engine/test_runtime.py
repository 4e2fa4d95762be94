"""The speculative engine on exported tiny pairs: exactness for every k, drafter and sampling
mode, and rollback."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from edgespec.api import Engine
from edgespec.config import SamplingConfig
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
        result = engine.generate(PROMPTS[0], drafter="model", k=k, max_new_tokens=41)
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
        self,
        prompt: Sequence[int],
        *,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        features: np.ndarray | None = None,
    ) -> None:
        self.position = 0

    def propose(self, k: int) -> Draft:
        truth = self.continuation[self.position : self.position + k]
        right = min(self.right, len(truth))
        wrong = [(t + 1) % self.vocab_size for t in truth[right:]]
        self.proposed = tuple(truth[:right] + wrong)
        return Draft(tokens=self.proposed)

    def commit(
        self, n_accepted: int, next_token: int, *, features: np.ndarray | None = None
    ) -> None:
        self.position += n_accepted + 1

    def close(self) -> None:
        pass


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
