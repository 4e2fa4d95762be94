"""Verification with a target model on this device.

:func:`verify_round` is one round on a target and a cache; :class:`LocalVerifier` runs it on its
own cache, and the verification server (``edgespec.server.sessions``) on each session's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError
from edgespec.graph.kv_cache import KVCache
from edgespec.runtime.acceptance import Acceptance, accept_greedy, accept_match, accept_sampled
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.model import OnnxModel
from edgespec.runtime.sampling import Uniforms, probabilities
from edgespec.runtime.verifiers.base import Verdict


class LocalVerifier:
    """Runs the target over ``[last] + draft`` in one pass and applies the acceptance rule.

    With ``features`` (a head drafts beside it), ``begin`` returns the target's features of
    the prompt it prefilled and each verdict carries those of ``last`` and the accepted tokens;
    without, the passes copy none out."""

    def __init__(self, model: OnnxModel, *, features: bool = False) -> None:
        if features and not model.has_features:
            raise ConfigError(
                f"{model.bundle.root} returns no features for a head to draft from (imported "
                "by an older edgespec)",
                fix="import the model again with this version ('edgespec cache prune --stale' "
                "for a catalog model), or draft with --drafter model or ngram",
            )
        self.model = model
        self.max_length = model.max_length
        # The last generation's cache, so that a prompt that starts as its text did (a
        # chat's history) is prefilled from where they part.
        self.cache = model.take_cache()
        self.features = features
        self._sampling = SamplingConfig()
        self._rng = np.random.default_rng(0)

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> np.ndarray | None:
        self._sampling, self._rng = sampling, rng
        if self.features:
            return self.model.start_features(prompt, self.cache)
        self.model.start(prompt, self.cache)
        return None

    def verify(self, last_token: int, draft: Draft) -> Verdict:
        started = time.perf_counter()
        position = self.cache.length  # last_token follows what the cache holds
        features = None
        if self.features:
            logits, rows = self.model.forward_features([last_token, *draft.tokens], self.cache)
            acceptance = accept(
                draft, logits, sampling=self._sampling, rng=self._rng, position=position + 1
            )
            self.cache.crop(position + 1 + acceptance.n_accepted)
            features = rows[: acceptance.n_accepted + 1]  # [n_accepted + 1, hidden]
        else:
            acceptance = verify_round(
                self.model,
                self.cache,
                position=position,
                last_token=last_token,
                draft=draft,
                sampling=self._sampling,
                rng=self._rng,
            )
        return Verdict(
            tokens=acceptance.tokens,
            n_accepted=acceptance.n_accepted,
            elapsed_s=time.perf_counter() - started,
            features=features,
        )

    def close(self) -> None:
        self.model.keep_cache(self.cache)


def verify_round(
    target: OnnxModel,
    cache: KVCache,
    *,
    position: int,
    last_token: int,
    draft: Draft,
    sampling: SamplingConfig,
    rng: Uniforms,
) -> Acceptance:
    """One target pass over ``[last_token] + draft.tokens`` with ``last_token`` at absolute
    ``position`` (at most ``cache.length``), the acceptance rule, and ``cache`` cropped to
    ``last_token`` plus the accepted tokens.

    The cache is cropped to ``position`` first, so a round resent to the server recomputes the
    same answer; locally ``position`` is the cache's length and that crop does nothing."""
    cache.crop(position)
    logits = target.forward([last_token, *draft.tokens], cache)  # [k + 1, vocab]
    acceptance = accept(draft, logits, sampling=sampling, rng=rng, position=position + 1)
    cache.crop(position + 1 + acceptance.n_accepted)
    return acceptance


def accept(
    draft: Draft,
    logits: np.ndarray,
    *,
    sampling: SamplingConfig,
    rng: Uniforms,
    position: int,
) -> Acceptance:
    """The acceptance rule ``sampling`` asks for, over target ``logits`` [k + 1, vocab];
    ``position`` is the absolute position of ``draft.tokens[0]`` (used by match mode)."""
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
