"""Export-time checks of an optimum graph: parity with PyTorch, and the streams its batch
invariance is checked on (:mod:`edgespec.export.invariance`).

Both checks drive the graph only through the I/O names written in its :class:`GraphSpec`, so
a passing export also proves that the manifest describes the graph correctly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.events import ProgressEvent, ProgressObserver
from edgespec.export.bundle import kv_shape
from edgespec.export.invariance import WIDTHS
from edgespec.graph.driver import GraphDriver, check_session
from edgespec.graph.paths import GraphSizes
from edgespec.manifest import GraphSpec
from edgespec.verification import ParityResult

PARITY_PROMPTS = (
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "import os\nimport sys\n\n\nclass Config:\n    def __init__(self, path):\n",
    "Once upon a time, in a small village by the sea, there lived",
)
CALIBRATION_TEXT = (
    "Large language models decode one token at a time, and each step reads every weight "
    "from memory. A small draft model proposes several tokens, and the target model checks "
    "them all in a single pass.\n\ndef merge(left, right):\n    result = []\n    i = j = 0\n"
    "    while i < len(left) and j < len(right):\n        if left[i] <= right[j]:\n"
    "            result.append(left[i])\n            i += 1\n        else:\n"
    "            result.append(right[j])\n            j += 1\n    return result + left[i:] + "
    "right[j:]\n"
)
#: A calibration stream's prefill (at most) and the positions compared after it.
BATCH_PREFILL, BATCH_COMPARED_POSITIONS = 8, 72
#: Parity tolerance on max |Δlogit|, relative to max(1, largest |logit| of PyTorch).
LOGIT_TOLERANCE = {"float32": 1e-4, "float16": 2e-2}
GREEDY_TOKENS = 32


def optimum_driver(
    graph_path: Path, spec: GraphSpec, *, vocab_size: int, capacity: int
) -> GraphDriver:
    """The checks' driver of an optimum graph: the plain path on the CPU, as the runtime's
    reference path runs it."""
    kv_heads, head_dim = kv_shape(spec)
    sizes = GraphSizes(
        kv_heads=kv_heads, head_dim=head_dim, vocab_size=vocab_size, capacity=capacity
    )
    return GraphDriver(check_session(graph_path), spec, sizes, bound=False, label=str(graph_path))


def _torch_logits(model: Any, token_ids: Sequence[int]) -> np.ndarray:
    import torch

    with torch.inference_mode():
        output = model(input_ids=torch.tensor([list(token_ids)], dtype=torch.long))
    return output.logits[0].float().numpy()


def _torch_greedy(model: Any, prompt: Sequence[int], count: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and, for each, the reference margin (top-1 minus top-2 logit)."""
    import torch

    tokens: list[int] = []
    margins: list[float] = []
    with torch.inference_mode():
        output = model(input_ids=torch.tensor([list(prompt)], dtype=torch.long), use_cache=True)
        while True:
            top2 = torch.topk(output.logits[0, -1].float(), 2)
            tokens.append(int(top2.indices[0]))
            margins.append(float(top2.values[0] - top2.values[1]))
            if len(tokens) == count:
                return tokens, margins
            output = model(
                input_ids=torch.tensor([tokens[-1:]], dtype=torch.long),
                past_key_values=output.past_key_values,
                use_cache=True,
            )


def _common_prefix(left: Sequence[int], right: Sequence[int]) -> int:
    for index, (a, b) in enumerate(zip(left, right, strict=False)):
        if a != b:
            return index
    return min(len(left), len(right))


@dataclass(frozen=True, kw_only=True)
class _PromptParity:
    """One prompt's comparison of the graph with PyTorch."""

    max_abs_logit_diff: float
    largest_logit: float  # largest |logit| of PyTorch, which scales the exact tolerance
    top1_agreeing: int  # positions whose argmax is the same in both
    positions: int
    greedy_match: int  # leading greedy tokens that are identical
    divergence_margin: float | None  # PyTorch's top-1 margin where the continuations part


def _compare_prompt(
    driver: GraphDriver, torch_model: Any, prompt: Sequence[int], *, greedy_tokens: int
) -> _PromptParity:
    """One pass over ``prompt`` (logits [len(prompt), vocab] from each) and greedy continuations."""
    reference = _torch_logits(torch_model, prompt)
    exported = driver.forward(prompt, driver.new_cache())
    expected, margins = _torch_greedy(torch_model, prompt, greedy_tokens)
    matched = _common_prefix(expected, driver.greedy(prompt, greedy_tokens))
    return _PromptParity(
        max_abs_logit_diff=float(np.max(np.abs(reference - exported))),
        largest_logit=float(np.max(np.abs(reference))),
        top1_agreeing=int(np.sum(reference.argmax(-1) == exported.argmax(-1))),
        positions=len(prompt),
        greedy_match=matched,
        divergence_margin=margins[matched] if matched < greedy_tokens else None,
    )


def check_parity(
    driver: GraphDriver,
    torch_model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    exact_dtype: str | None,
    min_top1_agreement: float,
    greedy_tokens: int,
    observe: ProgressObserver,
) -> ParityResult:
    """Compares the graph with PyTorch on ``prompts``.

    ``exact_dtype`` is float32/float16 for unquantized graphs, which must match logits within
    ``LOGIT_TOLERANCE`` and reproduce the greedy continuation; quantized graphs (None) must
    agree on the top-1 token for ``min_top1_agreement`` of the positions.
    """
    compared = []
    for index, prompt in enumerate(prompts):
        compared.append(_compare_prompt(driver, torch_model, prompt, greedy_tokens=greedy_tokens))
        observe(
            ProgressEvent(
                stage="verify", message="parity with PyTorch", step=index + 1, total=len(prompts)
            )
        )
    return _parity_result(
        compared,
        exact_dtype=exact_dtype,
        min_top1_agreement=min_top1_agreement,
        greedy_tokens=greedy_tokens,
    )


def _parity_result(
    compared: Sequence[_PromptParity],
    *,
    exact_dtype: str | None,
    min_top1_agreement: float,
    greedy_tokens: int,
) -> ParityResult:
    """Sums the prompts' comparisons and applies the criterion for exact or quantized graphs."""
    # max() over a list that starts at 0.0 keeps the running maximum's semantics exactly.
    max_diff = max([0.0, *(p.max_abs_logit_diff for p in compared)])
    largest_logit = max([0.0, *(p.largest_logit for p in compared)])
    positions = sum(p.positions for p in compared)
    top1 = sum(p.top1_agreeing for p in compared) / positions
    divergence_margins = [p.divergence_margin for p in compared if p.divergence_margin is not None]
    common: dict[str, Any] = dict(
        prompts=len(compared),
        positions=positions,
        max_abs_logit_diff=max_diff,
        top1_agreement=top1,
        greedy_tokens=greedy_tokens * len(compared),
        greedy_match_tokens=sum(p.greedy_match for p in compared),
        greedy_divergence_margins=tuple(divergence_margins),
    )
    if exact_dtype is not None:
        tolerance = LOGIT_TOLERANCE[exact_dtype] * max(1.0, largest_logit)
        # A continuation may part from PyTorch's only where PyTorch itself saw a numerical tie
        # (top-1 minus top-2 below the logit tolerance); anywhere else it is a graph error.
        greedy_ok = all(margin <= tolerance for margin in divergence_margins)
        return ParityResult(
            **common,
            logit_tolerance=tolerance,
            min_top1_agreement=None,
            required=("max_abs_logit_diff", "greedy_identical_except_ties"),
            passed=max_diff <= tolerance and greedy_ok,
        )
    return ParityResult(
        **common,
        logit_tolerance=None,
        min_top1_agreement=min_top1_agreement,
        required=("top1_agreement",),
        passed=top1 >= min_top1_agreement,
    )


def calibration_streams(
    driver: GraphDriver, token_ids: Sequence[int]
) -> tuple[list[list[int]], int]:
    """The two token streams the batch invariance check runs on an optimum graph, and their
    prefill: the calibration text, and the graph's own greedy continuation of its first tokens
    (what a verify pass sees when the draft is right, and where repetitive text makes
    near-ties common)."""
    prefill = min(BATCH_PREFILL, len(token_ids) - max(WIDTHS))
    if prefill < 1:
        raise ValueError(f"batch invariance needs more than {max(WIDTHS)} calibration tokens")
    text = list(token_ids[: prefill + BATCH_COMPARED_POSITIONS])
    continuation = text[:prefill] + driver.greedy(text[:prefill], BATCH_COMPARED_POSITIONS)
    return [text, continuation], prefill
