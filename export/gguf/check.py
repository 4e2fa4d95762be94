"""Checks of an imported GGUF graph, without torch.

* Parity: the graph against a float64 numpy forward pass over the *same* dequantized weights
  (what the file means, computed exactly), on fixed prompts: max |Δlogit|, top-1 agreement and
  a greedy continuation. A miswired graph scores near chance.
* llama.cpp: when llama-cpp-python is installed, top-1 agreement with llama.cpp's own logits
  on the same prompts, recorded for information (llama.cpp multiplies 4-bit weights with 8-bit
  activations, so it strays from the exact result too), beside llama.cpp's agreement with
  itself (its batched and one-token logits).
* Batch invariance (:mod:`edgespec.export.invariance`, as every exporter checks it): positions
  computed in one pass of width w (2..9) against the same positions one at a time (each padded
  to the graph's minimum width, as the runtime runs them): greedy speculative output equals
  target-only output only if no argmax differs.

The graph runs through :class:`~edgespec.graph.driver.GraphDriver`'s plain path, as the runtime
runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.events import ProgressEvent, ProgressObserver, ignore_progress
from edgespec.export.gguf.graph import rotary_caches
from edgespec.export.gguf.reader import UNSCORED_LOGIT, WeightSource, float_tensor
from edgespec.export.invariance import check_batch_invariance
from edgespec.graph.driver import GraphDriver
from edgespec.graph.paths import GraphSizes
from edgespec.manifest import BatchInvarianceResult, GraphSpec, ParityResult

PARITY_TEXTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens and",
)
GREEDY_TOKENS = 12


#: The batch invariance check's stream: a prefill, then eight passes of the widest width.
INVARIANCE_PREFILL, INVARIANCE_POSITIONS = 16, 9 * 8


def check_driver(session: Any, source: WeightSource, graph: GraphSpec) -> GraphDriver:
    """The checks' driver of an in-place graph: the plain path over full-capacity buffers,
    passes padded and cut as ``graph`` (``graph_spec``'s record) tells the runtime to."""
    arch = source.architecture
    assert graph.kv_capacity is not None  # graph_spec records it for every in-place graph
    sizes = GraphSizes(
        kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        vocab_size=arch.vocab_size,
        capacity=graph.kv_capacity,
    )
    return GraphDriver(session, graph, sizes, bound=False)


def reference_logits(source: WeightSource, tokens: Sequence[int]) -> np.ndarray:
    """Logits [len(tokens), vocab] of the file's weights in float64 numpy (causal, no cache)."""
    arch = source.architecture
    weight = _WeightCache(source)
    length, d = len(tokens), arch.head_dim
    rotary = {
        False: rotary_caches(head_dim=d, theta=arch.rope_theta, capacity=length),
        True: rotary_caches(head_dim=d, theta=arch.local_rope_theta or 1.0, capacity=length),
    }
    x = weight("token_embd.weight")[list(tokens)] * arch.embedding_scale
    causal = np.triu(np.full((length, length), -np.inf), 1)
    # A sliding-window layer's position i sees positions i - window + 1 .. i (llama.cpp).
    distance = np.arange(length)[:, None] - np.arange(length)[None, :]
    windowed = np.where(distance >= max(arch.sliding_window, 1), -np.inf, causal)
    for layer in range(arch.num_layers):
        p = f"blk.{layer}."
        sliding = arch.is_sliding(layer)
        cos, sin = rotary[sliding]
        h = _rms(x, weight(p + "attn_norm.weight"), arch.rms_norm_eps)
        q, k, v = (_project(weight, h, p, part, arch) for part in ("q", "k", "v"))
        q, k = q.reshape(length, arch.num_heads, d), k.reshape(length, arch.num_kv_heads, d)
        if arch.qk_norm:
            q = _rms(q, weight(p + "attn_q_norm.weight"), arch.rms_norm_eps)
            k = _rms(k, weight(p + "attn_k_norm.weight"), arch.rms_norm_eps)
        q = _rope(q, cos, sin, arch.rope_interleaved)
        k = _rope(k, cos, sin, arch.rope_interleaved)
        v = v.reshape(length, arch.num_kv_heads, d)
        mask = windowed if sliding else causal
        group = arch.num_heads // arch.num_kv_heads
        heads = []
        for head in range(arch.num_heads):
            scores = q[:, head] @ k[:, head // group].T / np.sqrt(d) + mask
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            heads.append((probs / probs.sum(-1, keepdims=True)) @ v[:, head // group])
        out = np.concatenate(heads, axis=-1) @ weight(p + "attn_output.weight").T
        if arch.gemma:
            out = _rms(out, weight(p + "post_attention_norm.weight"), arch.rms_norm_eps)
        x = x + out
        h = _rms(x, weight(p + "ffn_norm.weight"), arch.rms_norm_eps)
        gate, up = h @ weight(p + "ffn_gate.weight").T, h @ weight(p + "ffn_up.weight").T
        out = (_gelu_tanh(gate) if arch.gemma else gate / (1 + np.exp(-gate))) * up
        out = out @ weight(p + "ffn_down.weight").T
        if arch.gemma:
            out = _rms(out, weight(p + "post_ffw_norm.weight"), arch.rms_norm_eps)
        x = x + out
    lm_head = "token_embd.weight" if arch.tied_embeddings else "output.weight"
    logits = _rms(x, weight("output_norm.weight"), arch.rms_norm_eps) @ weight(lm_head).T
    if not arch.output_vocabulary:
        return logits
    full = np.full((length, arch.vocab_size), UNSCORED_LOGIT)  # a draft's reduced head
    full[:, list(arch.output_vocabulary)] = logits
    return full


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


class _WeightCache:
    def __init__(self, source: WeightSource) -> None:
        self.source = source
        self.cache: dict[str, np.ndarray] = {}

    def __call__(self, name: str) -> np.ndarray:
        if name not in self.cache:
            self.cache[name] = float_tensor(self.source.tensor(name)).astype(np.float64)
        return self.cache[name]


def _project(weight: Any, h: np.ndarray, prefix: str, part: str, arch: Any) -> np.ndarray:
    out = h @ weight(f"{prefix}attn_{part}.weight").T
    if arch.qkv_bias:
        out = out + weight(f"{prefix}attn_{part}.bias")
    return out


def _rms(x: np.ndarray, scale: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * scale


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """x [S, heads, D]: rotate pairs (adjacent when interleaved, else first/second halves)."""
    c, s = cos[: len(x), None, :], sin[: len(x), None, :]
    half = x.shape[-1] // 2
    first, second = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :half], x[..., half:])
    rotated = np.empty_like(x)
    if interleaved:
        rotated[..., 0::2], rotated[..., 1::2] = first * c - second * s, first * s + second * c
    else:
        rotated[..., :half], rotated[..., half:] = first * c - second * s, first * s + second * c
    return rotated


def check_parity(
    driver: GraphDriver, source: WeightSource, prompts: Sequence[Sequence[int]], *, min_top1: float
) -> ParityResult:
    diffs, agree, positions, greedy_match = [], 0, 0, 0
    for prompt in prompts:
        expected = reference_logits(source, prompt)
        got = driver.forward(prompt, driver.new_cache())
        diffs.append(float(np.abs(got - expected).max()))
        agree += int((got.argmax(-1) == expected.argmax(-1)).sum())
        positions += len(prompt)
        produced = driver.greedy(prompt, GREEDY_TOKENS)
        full = reference_logits(source, [*prompt, *produced[:-1]])
        exact = [int(row.argmax()) for row in full[len(prompt) - 1 :]]
        greedy_match += next(
            (i for i, (a, b) in enumerate(zip(produced, exact, strict=True)) if a != b),
            len(exact),
        )
    top1 = agree / positions
    return ParityResult(
        prompts=len(prompts),
        positions=positions,
        max_abs_logit_diff=max(diffs),
        logit_tolerance=None,
        top1_agreement=top1,
        min_top1_agreement=min_top1,
        greedy_tokens=GREEDY_TOKENS * len(prompts),
        greedy_match_tokens=greedy_match,
        greedy_divergence_margins=(),
        required=("top1",),
        passed=top1 >= min_top1,
    )


def batch_invariance(
    driver: GraphDriver,
    source: WeightSource,
    prompts: Sequence[Sequence[int]],
    *,
    observe: ProgressObserver = ignore_progress,
) -> tuple[BatchInvarianceResult, GraphDriver]:
    """Batch invariance on the prompts' tokens and the graph's greedy continuation of the
    first. A graph whose one-token steps run unpadded and differ from its passes is checked
    again with them padded to two positions (MatMulNBits' one-row kernel rounds differently
    from its multi-row one); returns the result and the driver it is for."""
    sample = [t for prompt in prompts for t in prompt] + driver.greedy(prompts[0], 48)
    stream = [sample[: INVARIANCE_PREFILL + INVARIANCE_POSITIONS]]
    invariance = check_batch_invariance(driver, stream, prefill=INVARIANCE_PREFILL)
    if not invariance.passed and driver.graph.min_pass_width == 1:
        observe(ProgressEvent(stage="verify", message="single steps padded to two positions"))
        driver = check_driver(driver.session, source, replace(driver.graph, min_pass_width=2))
        invariance = check_batch_invariance(driver, stream, prefill=INVARIANCE_PREFILL)
    return invariance, driver


def llama_cpp_agreement(
    path: Path, prompts: Sequence[Sequence[int]], driver: GraphDriver
) -> dict[str, Any]:
    """Top-1 agreement and max |Δlogit| with llama.cpp's logits (None figures without it).

    llama.cpp's logits come from one batched ``eval`` per prompt (its prompt path). Its
    one-token path (an ``eval`` per token, as it decodes) rounds differently, so their own
    agreement is recorded beside ours as ``llama_cpp_self_agreement``: the ceiling any
    other engine can be expected to reach."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return {"checked": False, "reason": "llama-cpp-python is not installed"}
    llm = Llama(model_path=str(path), n_ctx=512, logits_all=True, n_threads=2, verbose=False)
    agree, self_agree, positions, diff = 0, 0, 0, 0.0
    for prompt in prompts:
        llm.reset()
        llm.eval(list(prompt))
        theirs = np.array(llm.scores[: len(prompt)], copy=True)  # llama.cpp reuses the buffer
        llm.reset()
        one_token = []
        for token in prompt:
            llm.eval([token])
            one_token.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        ours = driver.forward(prompt, driver.new_cache())
        agree += int((theirs.argmax(-1) == ours.argmax(-1)).sum())
        self_agree += int((theirs.argmax(-1) == np.array(one_token)).sum())
        positions += len(prompt)
        diff = max(diff, float(np.abs(theirs - ours).max()))
    return {
        "checked": True,
        "top1_agreement": agree / positions,
        "max_abs_logit_diff": diff,
        "llama_cpp_self_agreement": self_agree / positions,
    }
