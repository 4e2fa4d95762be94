"""Which draft tokens the target keeps, and the token it adds after them. Pure functions.

Row i of the target's verify output predicts the token after ``draft_tokens[:i]``, so k draft
tokens come with k + 1 target rows: one per draft token, and one for the token after a fully
accepted draft. Every rule returns ``n_accepted`` (0..k) and the target's ``next_token``.
Names follow Leviathan et al., "Fast Inference from Transformers via Speculative Decoding":
``p_target`` and ``q_draft``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.runtime.sampling import Uniforms, keyed_race, residual, sample


@dataclass(frozen=True, kw_only=True)
class Acceptance:
    """The outcome of one verification.

    ``tokens`` is what the round emits: the accepted draft tokens, then ``next_token``
    (length ``n_accepted + 1``).
    """

    n_accepted: int
    next_token: int
    tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != self.n_accepted + 1 or self.tokens[-1] != self.next_token:
            raise ValueError(
                f"tokens {self.tokens} are not {self.n_accepted} accepted tokens "
                f"followed by next token {self.next_token}"
            )


def _accepted(draft_tokens: Sequence[int], n_accepted: int, next_token: int) -> Acceptance:
    tokens = (*(int(token) for token in draft_tokens[:n_accepted]), next_token)
    return Acceptance(n_accepted=n_accepted, next_token=next_token, tokens=tokens)


def _check_rows(name: str, rows: np.ndarray, expected: int) -> None:
    if rows.ndim != 2 or rows.shape[0] != expected:
        raise ValueError(f"{name} must be [{expected}, vocab], got shape {rows.shape}")


def accept_greedy(draft_tokens: Sequence[int], target_logits: np.ndarray) -> Acceptance:
    """Keep draft tokens while each equals the target's argmax.

    ``target_logits`` [k + 1, vocab]. ``next_token`` is the argmax at the first mismatch, or at
    row k when the whole draft is accepted (k = 0 included).
    """
    k = len(draft_tokens)
    _check_rows("target_logits", target_logits, k + 1)
    choices = np.argmax(target_logits, axis=-1)  # [k + 1]
    n_accepted = 0
    while n_accepted < k and draft_tokens[n_accepted] == choices[n_accepted]:
        n_accepted += 1
    return _accepted(draft_tokens, n_accepted, int(choices[n_accepted]))


def accept_sampled(
    draft_tokens: Sequence[int],
    q_draft: np.ndarray,
    p_target: np.ndarray,
    rng: Uniforms,
) -> Acceptance:
    """Leviathan et al. Algorithm 1: the emitted tokens are distributed exactly as p_target.

    ``q_draft`` [k, vocab] and ``p_target`` [k + 1, vocab] are rows from ``probabilities``;
    draft token i was sampled from ``q_draft[i]``. Token x_i is accepted with probability
    min(1, p/q) (one ``rng.random()`` per tested token); the first rejection draws
    ``next_token`` from residual(p, q) at that row, and a fully accepted draft draws it from
    ``p_target[k]``.
    """
    k = len(draft_tokens)
    _check_rows("q_draft", q_draft, k)
    _check_rows("p_target", p_target, k + 1)
    for i, token in enumerate(draft_tokens):
        q = q_draft[i, token]
        r = rng.random()
        # r < min(1, p/q) with r in [0, 1) is r * q < p; a token the draft gave q = 0 is rejected.
        if not (q > 0.0 and r * q < p_target[i, token]):
            return _accepted(draft_tokens, i, sample(residual(p_target[i], q_draft[i]), rng))
    return _accepted(draft_tokens, k, sample(p_target[k], rng))


def accept_match(
    draft_tokens: Sequence[int], p_target: np.ndarray, *, seed: int, position: int
) -> Acceptance:
    """Keep draft tokens while each equals the target's own keyed draw at its position.

    ``p_target`` [k + 1, vocab]; ``position`` is the absolute position of draft_tokens[0] (the
    one after the last committed token). The target's token at position + i is
    ``keyed_race(p_target[i], seed, position + i)``; ``next_token`` is that draw
    at the first mismatch, or at i = k. The output is token-identical to plain target sampling
    with the same keyed draws, whatever the draft proposed.
    """
    k = len(draft_tokens)
    _check_rows("p_target", p_target, k + 1)
    for i, token in enumerate(draft_tokens):
        drawn = keyed_race(p_target[i], seed, position + i)
        if token != drawn:
            return _accepted(draft_tokens, i, drawn)
    return _accepted(draft_tokens, k, keyed_race(p_target[k], seed, position + k))
