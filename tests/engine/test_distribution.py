"""Rejection sampling with real model logits: the first emitted token has the target's law.

For each sampling transform (plain temperature, top-k, top-p) the draft model's transformed
distribution q after a prompt is computed once; each of 20,000 draws samples a draft token
from q, verifies it with one pass of the target model (``LocalVerifier``) and rolls the
target's cache back. The emitted token's histogram is compared with the target's transformed
distribution p by Pearson's chi-square test (categories with an expected count under 5 pooled)
at a false-failure rate of 1e-4 per check, with fixed seeds, so a failure means a bug (the
wrong row, the wrong transform on one side, or a wrong residual), not bad luck.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgespec.config import SamplingConfig
from edgespec.manifest import load_bundle
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.model import OnnxModel
from edgespec.runtime.sampling import probabilities, sample
from edgespec.runtime.verifiers.local import LocalVerifier

from support.statistics_checks import chi_square, chi_square_critical

pytestmark = pytest.mark.integration

DRAWS = 20_000


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=0.8, top_k=12),
        SamplingConfig(temperature=1.2, top_p=0.8),
    ],
    ids=["temperature", "top-k", "top-p"],
)
def test_first_token_follows_the_target_distribution(
    exported: Callable[..., Path], sampling: SamplingConfig
) -> None:
    target = OnnxModel(load_bundle(exported("llama", "fp32")))
    draft = OnnxModel(load_bundle(exported("mistral", "fp32")))
    prompt = [0, 72, 105, 110, 116, 32]
    p = probabilities(target.forward(prompt, target.new_cache())[-1], sampling)
    q = probabilities(draft.forward(prompt, draft.new_cache())[-1], sampling)
    assert 0.5 * np.abs(p - q).sum() > 0.2, "draft and target must differ for a real test"

    rng = np.random.default_rng(1234)
    verifier = LocalVerifier(target)
    verifier.begin(prompt, sampling=sampling, rng=rng)
    prefix = verifier.cache.length
    counts = np.zeros(target.vocab_size, dtype=np.int64)
    for _ in range(DRAWS):
        token = sample(q, rng)
        verdict = verifier.verify(prompt[-1], Draft(tokens=(token,), q_draft=q[None, :]))
        counts[verdict.tokens[0]] += 1
        verifier.cache.crop(prefix)
    assert counts[p == 0].sum() == 0, "a token outside the target's support was emitted"
    statistic, df = chi_square(counts, p)
    assert statistic < chi_square_critical(df), (statistic, df)
