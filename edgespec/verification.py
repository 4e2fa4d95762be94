"""What an export's checks found, as a bundle's manifest records it (``manifest.verification``):
parity with the source model and batch invariance, and on which ONNX Runtime providers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ParityResult:
    """Exported graph vs PyTorch on fixed prompts.

    ``max_abs_logit_diff`` is over all prompt positions; ``top1_agreement`` is the fraction of
    positions with the same argmax; ``greedy_match_tokens`` counts how many of the
    ``greedy_tokens`` greedy continuation tokens agree before the first difference, summed
    over prompts, and ``greedy_divergence_margins`` gives PyTorch's top-1 minus top-2 logit
    where a continuation parted (below the tolerance it was a numerical tie, not an error).
    ``required`` says which checks decided ``passed``.
    """

    prompts: int
    positions: int
    max_abs_logit_diff: float
    logit_tolerance: float | None
    top1_agreement: float
    min_top1_agreement: float | None
    greedy_tokens: int
    greedy_match_tokens: int
    greedy_divergence_margins: tuple[float, ...]
    required: tuple[str, ...]
    passed: bool


@dataclass(frozen=True, kw_only=True)
class BatchInvarianceResult:
    """Logits of positions computed in one multi-token pass vs one position at a time.

    For each pass width w in ``widths`` (w = k + 1 verify positions) the calibration text and
    the graph's own greedy continuation are decoded in chunks of w after a prefill;
    ``positions`` counts the comparisons over all widths.
    Greedy speculative output equals the target's greedy output only when no argmax differs.
    """

    widths: tuple[int, ...]
    positions: int
    argmax_mismatch_fraction: float
    max_abs_logit_diff: float
    mismatch_fraction_by_width: dict[str, float]
    passed: bool
    #: For a graph with a ``features`` output, the largest difference of a position's features
    #: between a pass of any width and its single step (0.0: the same bits); None without one.
    max_abs_feature_diff: float | None = None


@dataclass(frozen=True, kw_only=True)
class VerificationRecord:
    """What was checked at export time, on which ONNX Runtime providers."""

    performed: bool
    providers: tuple[str, ...] = ()
    onnxruntime_version: str = ""
    parity: ParityResult | None = None
    batch_invariance: BatchInvarianceResult | None = None

    @property
    def batch_invariant(self) -> bool | None:
        """True/False when measured, None when the export skipped verification."""
        return None if self.batch_invariance is None else self.batch_invariance.passed
