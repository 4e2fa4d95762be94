"""Export-time checks of an ONNX graph: parity with PyTorch and batch invariance.

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
from edgespec.manifest import BatchInvarianceResult, GraphSpec, ParityResult

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
BATCH_WIDTHS = tuple(range(2, 10))  # k + 1 verify positions for k = 1..8
_BATCH_PREFILL = 8
_BATCH_COMPARED_POSITIONS = 72
#: Parity tolerance on max |Δlogit|, relative to max(1, largest |logit| of PyTorch).
LOGIT_TOLERANCE = {"float32": 1e-4, "float16": 2e-2}
GREEDY_TOKENS = 32


@dataclass(frozen=True, kw_only=True)
class KVState:
    """The KV cache between calls: ``keys[i]``/``values[i]`` are [1, kv_heads, length, head_dim]."""

    keys: tuple[np.ndarray, ...]
    values: tuple[np.ndarray, ...]

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[2])


class GraphRunner:
    """A plain numpy driver of the exported graph at batch 1, for export-time checks only."""

    def __init__(self, graph_path: Path, spec: GraphSpec, *, kv_heads: int, head_dim: int) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(
            str(graph_path), options, providers=["CPUExecutionProvider"]
        )
        self.providers = tuple(self.session.get_providers())
        self.spec = spec
        self._kv_dtype = np.dtype(spec.kv_dtype)
        self._kv_heads = kv_heads
        self._head_dim = head_dim
        self._outputs = [spec.logits, *spec.present_key, *spec.present_value]

    def empty(self) -> KVState:
        empty = np.zeros((1, self._kv_heads, 0, self._head_dim), dtype=self._kv_dtype)
        layers = len(self.spec.past_key)
        return KVState(keys=(empty,) * layers, values=(empty,) * layers)

    def forward(self, token_ids: Sequence[int], state: KVState) -> tuple[np.ndarray, KVState]:
        """Runs ``token_ids`` after ``state``; returns logits [len(token_ids), vocab] as float32."""
        spec = self.spec
        count = len(token_ids)
        past = state.length
        feeds: dict[str, np.ndarray] = {
            spec.input_ids: np.asarray([token_ids], dtype=np.int64),
        }
        if spec.attention_mask is not None:
            feeds[spec.attention_mask] = np.ones((1, past + count), dtype=np.int64)
        if spec.position_ids is not None:
            feeds[spec.position_ids] = np.arange(past, past + count, dtype=np.int64)[None, :]
        for name, array in zip(spec.past_key, state.keys, strict=True):
            feeds[name] = array
        for name, array in zip(spec.past_value, state.values, strict=True):
            feeds[name] = array
        results = self.session.run(self._outputs, feeds)
        layers = len(spec.past_key)
        logits = np.asarray(results[0][0], dtype=np.float32)
        new_state = KVState(
            keys=tuple(results[1 : 1 + layers]), values=tuple(results[1 + layers : 1 + 2 * layers])
        )
        return logits, new_state

    def greedy(self, prompt: Sequence[int], count: int) -> list[int]:
        logits, state = self.forward(prompt, self.empty())
        tokens = [int(np.argmax(logits[-1]))]
        while len(tokens) < count:
            logits, state = self.forward(tokens[-1:], state)
            tokens.append(int(np.argmax(logits[-1])))
        return tokens


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
    runner: GraphRunner, torch_model: Any, prompt: Sequence[int], *, greedy_tokens: int
) -> _PromptParity:
    """One pass over ``prompt`` (logits [len(prompt), vocab] from each) and greedy continuations."""
    reference = _torch_logits(torch_model, prompt)
    exported, _ = runner.forward(prompt, runner.empty())
    expected, margins = _torch_greedy(torch_model, prompt, greedy_tokens)
    matched = _common_prefix(expected, runner.greedy(prompt, greedy_tokens))
    return _PromptParity(
        max_abs_logit_diff=float(np.max(np.abs(reference - exported))),
        largest_logit=float(np.max(np.abs(reference))),
        top1_agreeing=int(np.sum(reference.argmax(-1) == exported.argmax(-1))),
        positions=len(prompt),
        greedy_match=matched,
        divergence_margin=margins[matched] if matched < greedy_tokens else None,
    )


def check_parity(
    runner: GraphRunner,
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
        compared.append(_compare_prompt(runner, torch_model, prompt, greedy_tokens=greedy_tokens))
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


def _single_step_logits(
    runner: GraphRunner, tokens: Sequence[int], prefill: int
) -> tuple[np.ndarray, KVState]:
    """Logits [len(tokens) - prefill, vocab] computed one position at a time after a prefill."""
    _, prefilled = runner.forward(tokens[:prefill], runner.empty())
    rows = []
    state = prefilled
    for token in tokens[prefill:]:
        logits, state = runner.forward([token], state)
        rows.append(logits[0])
    return np.stack(rows), prefilled


def check_batch_invariance(
    runner: GraphRunner,
    token_ids: Sequence[int],
    *,
    observe: ProgressObserver,
    widths: Sequence[int] = BATCH_WIDTHS,
) -> BatchInvarianceResult:
    """Compares multi-position passes of each width with single-position steps.

    Two token streams are checked: the calibration text, and the graph's own greedy
    continuation of its first tokens (what a verify pass sees when the draft is right, and where
    repetitive text makes near-ties common). After a prefill, every later position's logits are
    computed once one token at a time (the reference) and, for each width w, in consecutive
    passes of w tokens, as a verify pass of k = w - 1 drafted tokens would.
    """
    prefill = min(_BATCH_PREFILL, len(token_ids) - max(widths))
    if prefill < 1:
        raise ValueError(f"batch invariance needs more than {max(widths)} calibration tokens")
    text = list(token_ids[: prefill + _BATCH_COMPARED_POSITIONS])
    continuation = text[:prefill] + runner.greedy(text[:prefill], _BATCH_COMPARED_POSITIONS)
    streams = [
        (tokens, *_single_step_logits(runner, tokens, prefill)) for tokens in (text, continuation)
    ]
    mismatched = compared = 0
    max_diff = 0.0
    by_width: dict[str, float] = {}
    for step, width in enumerate(widths):
        width_mismatched = width_compared = 0
        for tokens, single, prefilled in streams:
            state = prefilled
            offset = 0
            while offset + width <= len(single):
                chunk = tokens[prefill + offset : prefill + offset + width]
                logits, state = runner.forward(chunk, state)
                reference = single[offset : offset + width]
                width_mismatched += int(np.sum(logits.argmax(-1) != reference.argmax(-1)))
                max_diff = max(max_diff, float(np.max(np.abs(logits - reference))))
                width_compared += width
                offset += width
        by_width[str(width)] = width_mismatched / width_compared
        mismatched += width_mismatched
        compared += width_compared
        observe(
            ProgressEvent(
                stage="verify",
                message=f"batch invariance, width {width}",
                step=step + 1,
                total=len(widths),
            )
        )
    return BatchInvarianceResult(
        widths=tuple(widths),
        positions=compared,
        argmax_mismatch_fraction=mismatched / compared,
        max_abs_logit_diff=max_diff,
        mismatch_fraction_by_width=by_width,
        passed=mismatched == 0,
    )
