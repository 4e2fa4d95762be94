"""Logits → probabilities, and draws from them. Pure numpy.

``probabilities`` is the one transform (temperature, then top-k, then top-p) applied to both
p_target and q_draft: it is deterministic, so the same logits always give the same row.
``sample`` draws by the inverse CDF of one uniform number from a ``numpy.random.Generator``
(rejection sampling). The ``match`` mode draws by ``keyed_race``: each token's exponential
variable is keyed by (seed, position, token id), so a position is drawn the same with or
without speculation, and a draft that races its own distribution with the same variables
proposes the target's token as often as a shared Gumbel noise couples the two.
"""

from __future__ import annotations

import math
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
    # float32 arithmetic up to the normalisation: the exponential of a large vocabulary's row
    # costs less than float64's and is paid for every drafted and verified row (measured:
    # docs/benchmarks/qwen-vs-llama-cpp.md, "Decode on a 2-core AMD EPYC (AVX2)"). A tiny
    # temperature keeps float64, where
    # 1 / temperature cannot overflow.
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
    ``CDF_BLOCK`` tokens first, then within the block the draw falls in: a cumulative sum over
    a full 151,936-token row costs several times as much (docs/benchmarks/qwen-vs-llama-cpp.md,
    "On a 2-core AVX-512 Xeon"), and is paid for every drafted and verified token.
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


#: The race's uniforms lie on a grid of 2^-RACE_BITS, strictly inside (0, 1).
RACE_BITS = 24
#: The smallest exponential the race draws: -log of the largest uniform, 1 - 2^-(RACE_BITS + 1).
RACE_FLOOR = -math.log1p(-(2.0 ** -(RACE_BITS + 1)))
#: A token this far below the row's top starts the race's first round (a best value to beat).
RACE_FIRST = 1e-3
_MASK64 = (1 << 64) - 1


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64 [n], wrapping: a bijection that scatters every bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def keyed_exponentials(seed: int, position: int, ids: np.ndarray) -> np.ndarray:
    """Exp(1) variables float64 [len(ids)], one per token id, each a function of (seed,
    absolute position, id) alone: -log u, u on a grid of 2^-RACE_BITS in (0, 1), from a
    splitmix64 hash. ``seed`` must be in [0, 2**128)."""
    key = _mix64(np.array([seed & _MASK64], dtype=np.uint64))
    key = _mix64(key ^ np.uint64(seed >> 64))
    key = _mix64(key ^ np.uint64(position & _MASK64))  # [1]
    golden = np.uint64(0x9E3779B97F4A7C15)
    bits = _mix64(key + np.asarray(ids, dtype=np.uint64) * golden)  # [n]
    u = ((bits >> np.uint64(64 - RACE_BITS)).astype(np.float64) + 0.5) * 2.0**-RACE_BITS
    return -np.log(u)


def keyed_race(probs: np.ndarray, seed: int, position: int, ids: np.ndarray | None = None) -> int:
    """An exact draw from a probability row [n] for the token at absolute ``position``: the
    index of the largest probs[i] / E(ids[i]) (the exponential race, the form of Gumbel-max
    that needs no logarithm of the row), with E from :func:`keyed_exponentials` and ``ids``
    the row's token ids (its indices when None).

    The same (seed, position) draws the same token from the same row, whoever asks, and two
    close rows over the same ids mostly draw the same token. Only tokens that can win are
    keyed: a first round over the likeliest tokens gives a best value v, and a token with
    probs[i] < v * RACE_FLOOR <= v * E cannot beat it, so the index is the full race's.
    """
    if np.ndim(probs) != 1:
        raise ValueError(f"keyed_race takes one row [n], got shape {np.shape(probs)}")
    row = np.asarray(probs, dtype=np.float64)  # [n]
    top = float(row.max())
    if not top > 0.0:
        raise ValueError("keyed_race needs a row with positive mass")
    # A row's indices are its ids unless named: no [n] id array is built on this hot path.
    keys = (lambda at: at) if ids is None else (lambda at: np.asarray(ids)[at])
    first = np.flatnonzero(row >= top * RACE_FIRST)  # [m], the top token among them
    best = float(np.max(row[first] / keyed_exponentials(seed, position, keys(first))))
    contenders = np.flatnonzero(row >= best * RACE_FLOOR)  # [c], every token that can win
    values = row[contenders] / keyed_exponentials(seed, position, keys(contenders))
    return int(contenders[int(np.argmax(values))])


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
