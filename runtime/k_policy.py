"""``k = "auto"``: choose each round's draft length from running estimates.

With per-token acceptance rate α, a round drafting k tokens commits
E[k] = (1 − α^(k+1)) / (1 − α) tokens on average (Leviathan et al.). In target-step units it
costs k·c + T(k+1)/T(1), with c the draft step cost and T(w)/T(1) the verify cost curve
(``expected_speedup``, used by the bench). The policy picks the k in 0..k_max with the most
expected tokens per second, from measured round times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgespec.events import KPolicy, StepRecord


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per round] = (1 − α^(k+1)) / (1 − α); k + 1 when α = 1."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, c: float, verify_cost: Sequence[float], k: int) -> float:
    """Tokens per target-step-equivalent of a k-token round; ``verify_cost[w - 1]`` = T(w)/T(1)."""
    return expected_tokens(alpha, k) / (k * c + verify_cost[k])


@dataclass(frozen=True, kw_only=True)
class CostProfile:
    """Measured costs after a short history: ``target_step_s`` = T(1); ``verify_cost[w - 1]``
    = T(w)/T(1) for w = 1..len; ``draft_step_s`` = one draft model call. ``target_position_s``
    and ``draft_position_s``: what each position of history adds to one row of a pass (its
    attention), which after thousands of positions is a large part of a verify pass's cost:
    every row attends over the whole history (:meth:`at_depth`). ``draft_window``: the most
    positions a draft step reads (a draft over a window of its history and its sink,
    :mod:`edgespec.graph.window`); 0: all of them."""

    target_step_s: float
    draft_step_s: float
    verify_cost: tuple[float, ...]
    target_position_s: float = 0.0
    draft_position_s: float = 0.0
    draft_window: int = 0

    @property
    def c(self) -> float:
        return self.draft_step_s / self.target_step_s

    def at_depth(self, length: int) -> CostProfile:
        """The costs after ``length`` positions of history: a pass of w rows costs w rows'
        attention over them more, a draft step one row's."""
        if length <= 0 or not (self.target_position_s or self.draft_position_s):
            return self
        step = self.target_step_s + self.target_position_s * length
        passes = [
            cost * self.target_step_s + width * self.target_position_s * length
            for width, cost in enumerate(self.verify_cost, start=1)
        ]
        return CostProfile(
            target_step_s=step,
            draft_step_s=self.draft_step_s + self.draft_position_s * self.draft_read(length),
            verify_cost=tuple(seconds / step for seconds in passes),
            target_position_s=self.target_position_s,
            draft_position_s=self.draft_position_s,
            draft_window=self.draft_window,
        )

    def draft_read(self, length: int) -> int:
        """The positions a draft step reads after ``length`` of history."""
        return min(length, self.draft_window) if self.draft_window else length


#: How fast AutoK's α follows the rounds (the weight of the newest round). Greedy agreement
#: comes in runs (a copied line, then a divergent one), which a quick estimate follows.
#: Sampled acceptance is a draw per token around a slowly moving rate, so a quick estimate
#: chases noise: simulating i.i.d. acceptance at the 1.5B pair's costs
#: (``benchmarks/k_policy_sim.py``), α's weight 0.2 loses more of the best fixed k's speed
#: than 0.05 does (docs/benchmarks/qwen-vs-llama-cpp.md, "On a 2-core AVX-512 Xeon").
GREEDY_ALPHA_SMOOTHING = 0.2
SAMPLED_ALPHA_SMOOTHING = 0.05


class RunningAcceptance:
    """Acceptance as accepted / tested draft tokens, two running sums that each round blends
    into with weight ``smoothing``: a round tests n_accepted + 1 draft tokens when one is
    rejected, n_accepted when all pass (accepted / drafted would be biased low for k > 1)."""

    def __init__(self, prior: float, smoothing: float = GREEDY_ALPHA_SMOOTHING) -> None:
        self.prior = prior
        self.smoothing = smoothing
        self.reset()

    def reset(self) -> None:
        self._accepted, self._tested = self.prior, 1.0

    @property
    def rate(self) -> float:
        return self._accepted / self._tested

    def update(self, drafted: int, n_accepted: int) -> None:
        """A round that drafted ``drafted`` tokens kept ``n_accepted``; the token after the
        last accepted one was tested too, unless every token was accepted."""
        if drafted:
            tested = n_accepted + (n_accepted < drafted)
            keep = 1.0 - self.smoothing
            self._accepted = keep * self._accepted + self.smoothing * n_accepted
            self._tested = keep * self._tested + self.smoothing * tested


class AutoK:
    """Adapts k from running estimates of α and of the real cost of each kind of round.

    ``round_s[k]`` is the time of a round that drafted k tokens (k draft steps and a verify pass
    over k + 1 positions), seeded from ``profile`` (measured in isolation, so optimistic: each k
    gets tried) and then blended with what rounds really cost. Measuring whole rounds keeps the
    model honest about fixed costs, such as the first draft step after a target pass running on
    cold caches. α is accepted / tested draft tokens, blended with weight
    ``alpha_smoothing`` (``smoothing`` when not given; :data:`SAMPLED_ALPHA_SMOOTHING` suits
    sampled rounds). When k = 0 wins for ``probe_every``
    rounds in a row, one round drafts a single token so that a recovering α can be noticed.
    """

    def __init__(
        self,
        profile: CostProfile,
        *,
        k_max: int = 8,
        alpha: float = 0.6,
        smoothing: float = GREEDY_ALPHA_SMOOTHING,
        alpha_smoothing: float | None = None,
        probe_every: int = 16,
    ) -> None:
        self.k_max = min(k_max, len(profile.verify_cost) - 1)
        self.alpha = alpha
        self.smoothing = smoothing
        self.alpha_smoothing = smoothing if alpha_smoothing is None else alpha_smoothing
        self.probe_every = probe_every
        self.round_s = [
            k * profile.draft_step_s + profile.verify_cost[k] * profile.target_step_s
            for k in range(self.k_max + 1)
        ]
        self._zero_rounds = 0
        self._acceptance = RunningAcceptance(alpha, self.alpha_smoothing)

    def _blend(self, old: float, new: float) -> float:
        return (1.0 - self.smoothing) * old + self.smoothing * new

    def next_k(self) -> int:
        best = max(
            range(self.k_max + 1),
            key=lambda k: expected_tokens(self.alpha, k) / self.round_s[k],
        )
        if best == 0:
            self._zero_rounds += 1
            if self._zero_rounds >= self.probe_every:
                self._zero_rounds = 0
                return 1
        else:
            self._zero_rounds = 0
        return best

    def observe(self, record: StepRecord) -> None:
        if record.drafted:
            self._acceptance.update(record.drafted, record.n_accepted)
            self.alpha = self._acceptance.rate
        if record.drafted <= self.k_max:
            spent = record.draft_s + record.verify_s
            self.round_s[record.drafted] = self._blend(self.round_s[record.drafted], spent)


class CappedK:
    """Another policy's k, never above ``cap()`` (a remote server's suggested k, which shrinks
    as its queue grows)."""

    def __init__(self, inner: KPolicy, *, cap: Callable[[], int]) -> None:
        self.inner = inner
        self.cap = cap

    def next_k(self) -> int:
        return min(self.inner.next_k(), self.cap())

    def observe(self, record: StepRecord) -> None:
        self.inner.observe(record)


class FixedK:
    """The same k every round (k = 0 is plain target decoding)."""

    def __init__(self, k: int) -> None:
        if k < 0:
            raise ValueError(f"k must be >= 0, not {k}")
        self.k = k

    def next_k(self) -> int:
        return self.k

    def observe(self, record: StepRecord) -> None:
        """A fixed k learns nothing."""
