"""Verification with a target model on this device."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError
from edgespec.runtime.acceptance import Acceptance, accept_greedy, accept_match, accept_sampled
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.model import OnnxModel
from edgespec.runtime.sampling import probabilities
from edgespec.runtime.verifiers.base import Verdict


class LocalVerifier:
    """Runs the target over ``[last] + draft`` in one pass and applies the acceptance rule."""

    def __init__(self, session: OnnxModel) -> None:
        self.session = session
        self.max_length = session.max_length
        self.cache = session.new_cache()
        self._sampling = SamplingConfig()
        self._rng = np.random.default_rng(0)

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> None:
        self._sampling, self._rng = sampling, rng
        self.session.start(prompt, self.cache)

    def verify(self, last_token: int, draft: Draft) -> Verdict:
        started = time.perf_counter()
        position = self.cache.length + 1  # absolute position of draft.tokens[0]
        logits = self.session.forward([last_token, *draft.tokens], self.cache)  # [k+1, vocab]
        acceptance = accept(
            draft, logits, sampling=self._sampling, rng=self._rng, position=position
        )
        # The cache holds last_token and all k drafts; keep last_token and the accepted ones.
        self.cache.crop(position + acceptance.n_accepted)
        return Verdict(
            tokens=acceptance.tokens,
            n_accepted=acceptance.n_accepted,
            elapsed_s=time.perf_counter() - started,
        )

    def close(self) -> None:
        self.cache.reset()


def accept(
    draft: Draft,
    logits: np.ndarray,
    *,
    sampling: SamplingConfig,
    rng: np.random.Generator,
    position: int,
) -> Acceptance:
    """The acceptance rule ``sampling`` asks for, over target ``logits`` [k + 1, vocab];
    ``position`` is the absolute position of ``draft.tokens[0]`` (used by match mode).
    Shared with the verification server, which applies it to its sessions' rounds."""
    if sampling.greedy:
        return accept_greedy(draft.tokens, logits)
    p_target = probabilities(logits, sampling)
    if sampling.mode == "match":
        return accept_match(draft.tokens, p_target, seed=sampling.seed, position=position)
    if draft.tokens and draft.q_draft is None:
        raise ConfigError(
            "rejection sampling needs the draft's probabilities, and this drafter has none",
            fix="use sampling mode 'match' with the prompt-lookup drafter",
        )
    q_draft = draft.q_draft if draft.q_draft is not None else np.zeros((0, logits.shape[1]))
    return accept_sampled(draft.tokens, q_draft, p_target, rng)
