"""Logits → probabilities, and draws from them. Pure numpy.

``probabilities`` is the one transform (temperature, then top-k, then top-p) applied to both
p_target and q_draft: it is deterministic, so the same logits always give the same row.
Draws use the inverse CDF of one uniform number, so a draw is fixed by that number alone:
``sample`` takes it from a ``numpy.random.Generator``, and the ``match`` mode takes it from
``keyed_uniform(seed, position)`` so a position is drawn the same with or without speculation.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from edgespec.config import SamplingConfig

#: Tokens per block of :func:`sample_at`'s two-level cumulative sum.
CDF_BLOCK = 1024


def probabilities(logits: np.ndarray, sampling: SamplingConfig) -> np.ndarray:
    """Float64 probabilities [..., vocab] from logits [..., vocab], row-wise over the last axis.

    Greedy (temperature 0) gives a one-hot row at the argmax (ties → lowest id). Otherwise:
    softmax(logits / temperature); top-k keeps the k highest logits (tokens tied with the k-th
    are all kept); top-p keeps the smallest set of most probable tokens whose probability sums
    to at least top_p (ties broken towards the lower id; the top token is always kept); the
    kept probabilities are renormalised to sum to 1.
    """
    if sampling.greedy:
        scores = np.asarray(logits)  # [..., vocab]
        one_hot = np.zeros(scores.shape, dtype=np.float64)
        top = np.argmax(scores, axis=-1)[..., np.newaxis]  # [..., 1]
        np.put_along_axis(one_hot, top, 1.0, axis=-1)
        return one_hot
    # float32 arithmetic up to the normalisation: the exponential of a 151,936-token row costs
    # 0.6 ms against 1.6 ms in float64 and is paid for every drafted and verified row. A tiny
    # temperature keeps float64, where 1 / temperature cannot overflow.
    work_dtype = np.float32 if sampling.temperature >= 1e-3 else np.float64
    scores = np.asarray(logits, dtype=work_dtype)  # [..., vocab]
    # Shift the row maximum to 0 before scaling: a tiny temperature then sends the other
    # scores to -inf (probability 0) instead of overflowing both sides into inf - inf = NaN.
    with np.errstate(over="ignore"):
        scores = scores - np.max(scores, axis=-1, keepdims=True)
        scores /= work_dtype(sampling.temperature)
    vocab = scores.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = np.partition(scores, vocab - sampling.top_k, axis=-1)[..., -sampling.top_k]  # [...]
        scores = np.where(scores < kth[..., np.newaxis], -np.inf, scores).astype(work_dtype)
    # The top score is 0 and top-k keeps it, so exp cannot overflow: [..., vocab] in place.
    exp = np.exp(scores, out=scores)
    total = exp.sum(axis=-1, keepdims=True, dtype=np.float64)  # [..., 1]
    probs: np.ndarray = exp.astype(np.float64)  # [..., vocab]
    probs /= total
    if sampling.top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")  # [..., vocab], most probable first
        sorted_probs = np.take_along_axis(probs, order, axis=-1)  # [..., vocab]
        # A token is needed while the tokens before it sum to less than top_p.
        mass_before = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # [..., vocab]
        keep = np.zeros(probs.shape, dtype=bool)
        np.put_along_axis(keep, order, mass_before < sampling.top_p, axis=-1)
        probs = np.where(keep, probs, 0.0)
        probs = probs / probs.sum(axis=-1, keepdims=True)
    return probs


def greedy_token(logits: np.ndarray) -> int:
    """The argmax of one logits (or probability) row [vocab]; ties → lowest id."""
    if np.ndim(logits) != 1:
        raise ValueError(f"greedy_token takes one row [vocab], got shape {np.shape(logits)}")
    return int(np.argmax(logits))


def sample_at(probs: np.ndarray, u: float) -> int:
    """The inverse-CDF draw from a probability row [vocab] for a uniform ``u`` in [0, 1).

    ``u`` is scaled by the row's total, so a row summing slightly off 1 is harmless, and a
    token of probability 0 is never returned. The cumulative sum runs over blocks of
    ``CDF_BLOCK`` tokens first, then within the block the draw falls in: a full 151,936-token
    cumulative sum cost 0.57 ms a draw, and is paid for every drafted and verified token.
    """
    if np.ndim(probs) != 1:
        raise ValueError(f"sample_at takes one row [vocab], got shape {np.shape(probs)}")
    row = np.asarray(probs, dtype=np.float64)  # [vocab]
    whole = len(row) // CDF_BLOCK * CDF_BLOCK
    block_sums = row[:whole].reshape(-1, CDF_BLOCK).sum(axis=1)  # [vocab // CDF_BLOCK]
    if whole < len(row):
        block_sums = np.append(block_sums, row[whole:].sum())
    block_cdf = np.cumsum(block_sums)  # [blocks]
    point = u * block_cdf[-1]
    block = int(np.searchsorted(block_cdf, point, side="right"))
    if block >= len(block_cdf):  # u * total rounded up to the total
        block = int(np.flatnonzero(block_sums)[-1])
    start = block * CDF_BLOCK
    piece = row[start : start + CDF_BLOCK]  # [<= CDF_BLOCK], its sum > 0
    cdf = np.cumsum(piece)
    before = block_cdf[block - 1] if block else 0.0  # the mass of the blocks before it
    index = int(np.searchsorted(cdf, point - before, side="right"))
    if index >= len(piece):  # the point at the block's end (rounding, or the clamp above)
        index = int(np.flatnonzero(piece)[-1])
    return start + index


class Uniforms(Protocol):
    """A source of uniforms in [0, 1): the generation's ``numpy.random.Generator`` on the
    device, the draws a client sent with its round on the verification server."""

    def random(self) -> float: ...


def sample(probs: np.ndarray, rng: Uniforms) -> int:
    """One token id drawn from a probability row [vocab], using exactly one ``rng.random()``."""
    return sample_at(probs, float(rng.random()))


def keyed_uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) that depends only on (seed, absolute position).

    It is the first double of a Philox counter-based generator with key ``seed`` and counter
    ``position`` (``Generator(Philox(key=seed, counter=position)).random()``), so each position
    has its own stream and no state is carried between draws. ``seed`` must be in [0, 2**128).
    """
    return float(np.random.Generator(np.random.Philox(key=seed, counter=position)).random())


def residual(p_target: np.ndarray, q_draft: np.ndarray) -> np.ndarray:
    """norm(max(0, p_target - q_draft)) over rows [..., vocab]: where to draw after a rejection.

    A row whose residual sums to 0 (p_target == q_draft, where rejection cannot happen) gives
    p_target itself.
    """
    p = np.asarray(p_target, dtype=np.float64)  # [..., vocab]
    excess = p - np.asarray(q_draft, dtype=np.float64)  # [..., vocab]
    np.maximum(excess, 0.0, out=excess)
    total = excess.sum(axis=-1, keepdims=True)  # [..., 1]
    if (total > 0.0).all():
        excess /= total
        return excess
    return np.where(total > 0.0, excess / np.where(total > 0.0, total, 1.0), p)
