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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.events import ProgressEvent, ProgressObserver, ignore_progress
from edgespec.export.gguf.reader import (
    GGUFFile,
    WeightSource,
    float_rows,
    float_tensor,
    tensor_rows,
)
from edgespec.export.gguf.rope import rotary_caches
from edgespec.export.invariance import check_batch_invariance
from edgespec.graph.driver import GraphDriver, check_session
from edgespec.graph.paths import GraphSizes
from edgespec.manifest import UNSCORED_LOGIT, GraphSpec
from edgespec.verification import BatchInvarianceResult, ParityResult

PARITY_TEXTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens and",
)
GREEDY_TOKENS = 12


#: The batch invariance check's stream: a prefill, then eight passes of the widest width.
INVARIANCE_PREFILL, INVARIANCE_POSITIONS = 16, 9 * 8


#: The KV buffers' length in the checks (their streams are far shorter): the graph's own
#: length is the runtime's to choose.
CHECK_CAPACITY = 1024


def check_driver(session: Any, source: WeightSource, graph: GraphSpec) -> GraphDriver:
    """The checks' driver of an in-place graph: the plain path over buffers of
    :data:`CHECK_CAPACITY` positions, passes padded and cut as ``graph`` (``graph_spec``'s
    record) tells the runtime to."""
    return GraphDriver(session, graph, graph_sizes(source, graph), bound=False)


def graph_sizes(source: WeightSource, graph: GraphSpec) -> GraphSizes:
    """The KV heads, head size, vocabulary and the checks' capacity of ``source``'s in-place
    graph (an older graph's fixed one where it has one)."""
    arch = source.architecture
    return GraphSizes(
        kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        vocab_size=arch.vocab_size,
        capacity=graph.kv_capacity or min(CHECK_CAPACITY, arch.context_length),
        hidden_size=arch.hidden_size,
    )


#: Elements of one weight that the reference forward dequantizes at once (float64: 32 MB).
REFERENCE_SLICE = 1 << 22


def reference_logits(source: WeightSource, tokens: Sequence[int]) -> np.ndarray:
    """Logits [len(tokens), vocab] of the file's weights in float64 numpy (causal, no cache)."""
    return reference_logits_batch(source, [tokens])[0]


def reference_logits_batch(
    source: WeightSource,
    sequences: Sequence[Sequence[int]],
    *,
    observe: ProgressObserver = ignore_progress,
) -> list[np.ndarray]:
    """:func:`reference_logits` of each sequence, computed layer by layer for all of them at
    once: each weight is dequantized a slice of rows at a time (``REFERENCE_SLICE``
    elements) and dropped, so the check holds one slice beside the sequences' activations,
    whatever the model's size."""
    arch = source.architecture
    eps = arch.rms_norm_eps
    longest = max(len(tokens) for tokens in sequences)
    d, turned = arch.head_dim, arch.rotated_dims
    rotary = {
        False: rotary_caches(
            head_dim=turned, theta=arch.rope_theta, capacity=longest, scaling=arch.rope_scaling
        ),
        True: rotary_caches(head_dim=turned, theta=arch.local_rope_theta or 1.0, capacity=longest),
    }
    # SmolLM3's layers without rotary embedding: cos 1, sin 0.
    identity = (np.ones_like(rotary[False][0]), np.zeros_like(rotary[False][1]))
    embedding = source.tensor("token_embd.weight")
    xs = [
        float_rows(embedding, list(tokens)).astype(np.float64) * arch.embedding_scale
        for tokens in sequences
    ]
    for layer in range(arch.num_layers):
        p = f"blk.{layer}."

        def vector(name: str, prefix: str = p) -> np.ndarray:
            return float_tensor(source.tensor(prefix + name)).astype(np.float64)

        hs = [_rms(x, vector("attn_norm.weight"), eps) for x in xs]
        q, k, v = (_project(source, hs, p, part, arch) for part in ("q", "k", "v"))
        if arch.qk_norm:
            q_norm, k_norm = vector("attn_q_norm.weight"), vector("attn_k_norm.weight")
            q = [_rms(_heads(x, arch.num_heads, d), q_norm, eps) for x in q]
            k = [_rms(_heads(x, arch.num_kv_heads, d), k_norm, eps) for x in k]
        sliding = arch.is_sliding(layer)
        tables = rotary[sliding] if arch.rotates(layer) else identity
        attended = [_attention(arch, sliding, tables, *qkv) for qkv in zip(q, k, v, strict=True)]
        outs = _times(source, p + "attn_output.weight", attended)
        if arch.gemma:
            outs = [_rms(out, vector("post_attention_norm.weight"), eps) for out in outs]
        xs = [x + out for x, out in zip(xs, outs, strict=True)]
        hs = [_rms(x, vector("ffn_norm.weight"), eps) for x in xs]
        gates = _times(source, p + "ffn_gate.weight", hs)
        ups = _times(source, p + "ffn_up.weight", hs)
        hidden = [
            (_gelu_tanh(gate) if arch.gemma else gate / (1 + np.exp(-gate))) * up
            for gate, up in zip(gates, ups, strict=True)
        ]
        outs = _times(source, p + "ffn_down.weight", hidden)
        if arch.gemma:
            outs = [_rms(out, vector("post_ffw_norm.weight"), eps) for out in outs]
        xs = [x + out for x, out in zip(xs, outs, strict=True)]
        observe(
            ProgressEvent(
                stage="verify",
                message="numpy reference, layers",
                step=layer + 1,
                total=arch.num_layers,
            )
        )
    norm = float_tensor(source.tensor("output_norm.weight")).astype(np.float64)
    lm_head = "token_embd.weight" if arch.tied_embeddings else "output.weight"
    logits = _times(source, lm_head, [_rms(x, norm, eps) for x in xs])
    if arch.final_softcap:  # Gemma 2
        logits = [arch.final_softcap * np.tanh(scored / arch.final_softcap) for scored in logits]
    if not arch.output_vocabulary:
        return logits
    fulls = []
    for scored in logits:  # a draft's reduced head
        full = np.full((len(scored), arch.vocab_size), UNSCORED_LOGIT)
        full[:, list(arch.output_vocabulary)] = scored
        fulls.append(full)
    return fulls


def _heads(x: np.ndarray, heads: int, d: int) -> np.ndarray:
    return x.reshape(len(x), heads, d)


def _attention(
    arch: Any,
    sliding: bool,
    rotary: tuple[np.ndarray, np.ndarray],
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
) -> np.ndarray:
    """One sequence's causal attention (q [S, heads · D] or [S, heads, D]) → [S, heads · D]."""
    length, d = len(q), arch.head_dim
    cos, sin = rotary
    q = _rope(_heads(q, arch.num_heads, d), cos, sin, arch.rope_interleaved)
    k = _rope(_heads(k, arch.num_kv_heads, d), cos, sin, arch.rope_interleaved)
    v = _heads(v, arch.num_kv_heads, d)
    causal = np.triu(np.full((length, length), -np.inf), 1)
    # A sliding-window layer's position i sees positions i - window + 1 .. i (llama.cpp).
    distance = np.arange(length)[:, None] - np.arange(length)[None, :]
    mask = np.where(distance >= max(arch.sliding_window, 1), -np.inf, causal) if sliding else causal
    group = arch.num_heads // arch.num_kv_heads
    heads = []
    for head in range(arch.num_heads):
        scores = q[:, head] @ k[:, head // group].T / np.sqrt(d)
        if arch.attention_softcap:  # Gemma 2: cap * tanh(score / cap), before the mask
            scores = arch.attention_softcap * np.tanh(scores / arch.attention_softcap)
        scores = scores + mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        heads.append((probs / probs.sum(-1, keepdims=True)) @ v[:, head // group])
    return np.concatenate(heads, axis=-1)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _times(source: WeightSource, name: str, xs: list[np.ndarray]) -> list[np.ndarray]:
    """Each x [S, K] @ weight.T → [S, N], the weight dequantized to float64 a slice of rows at
    a time (and a mapped file's pages released after each)."""
    tensor = source.tensor(name)
    rows, columns = tensor_rows(tensor)
    stacked = np.concatenate(xs)
    out = np.empty((len(stacked), rows))
    step = max(1, REFERENCE_SLICE // columns)
    for start in range(0, rows, step):
        weight = float_rows(tensor, slice(start, start + step)).astype(np.float64)
        out[:, start : start + step] = stacked @ weight.T
        source.release_pages()  # the slice's pages of a mapped file were read
    return np.split(out, np.cumsum([len(x) for x in xs])[:-1])


def _project(
    source: WeightSource, hs: list[np.ndarray], prefix: str, part: str, arch: Any
) -> list[np.ndarray]:
    outs = _times(source, f"{prefix}attn_{part}.weight", hs)
    if not arch.qkv_bias:
        return outs
    bias = float_tensor(source.tensor(f"{prefix}attn_{part}.bias")).astype(np.float64)
    return [out + bias for out in outs]


def _rms(x: np.ndarray, scale: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * scale


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """x [S, heads, D]: rotate pairs (adjacent when interleaved, else first/second halves) of
    the first 2 x cos.shape[-1] dimensions; the rest pass as they are."""
    turned = 2 * cos.shape[-1]
    if turned < x.shape[-1]:
        rest = x[..., turned:]
        return np.concatenate([_rope(x[..., :turned], cos, sin, interleaved), rest], axis=-1)
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
    driver: GraphDriver,
    source: WeightSource,
    prompts: Sequence[Sequence[int]],
    *,
    min_top1: float,
    observe: ProgressObserver = ignore_progress,
) -> ParityResult:
    diffs, agree, positions, greedy_match = [], 0, 0, 0
    graph = [driver.forward(prompt, driver.new_cache()) for prompt in prompts]
    greedy = [driver.greedy(prompt, GREEDY_TOKENS) for prompt in prompts]
    # One reference pass over every sequence: each weight is dequantized once.
    continued = [[*prompt, *made[:-1]] for prompt, made in zip(prompts, greedy, strict=True)]
    references = reference_logits_batch(source, [*prompts, *continued], observe=observe)
    for i, prompt in enumerate(prompts):
        expected, got, produced = references[i], graph[i], greedy[i]
        diffs.append(float(np.abs(got - expected).max()))
        agree += int((got.argmax(-1) == expected.argmax(-1)).sum())
        positions += len(prompt)
        full = references[len(prompts) + i]
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
    exact_unpadded: bool = False,
    observe: ProgressObserver = ignore_progress,
) -> tuple[BatchInvarianceResult, GraphDriver]:
    """Batch invariance on the prompts' tokens and the graph's greedy continuation of the
    first. A graph whose one-token steps run unpadded and differ from its passes is checked
    again with them padded to two positions (MatMulNBits' one-row kernel rounds differently
    from its multi-row one); returns the result and the driver it is for. ``exact_unpadded``:
    unpadded steps must give the passes' logits bit for bit (the GGUF kernels' promise), not
    only their argmax."""
    sample = [t for prompt in prompts for t in prompt] + driver.greedy(prompts[0], 48)
    stream = [sample[: INVARIANCE_PREFILL + INVARIANCE_POSITIONS]]
    invariance = check_batch_invariance(driver, stream, prefill=INVARIANCE_PREFILL, observe=observe)
    differs = not invariance.passed or (exact_unpadded and invariance.max_abs_logit_diff > 0)
    if differs and driver.graph.min_pass_width == 1:
        observe(ProgressEvent(stage="verify", message="single steps padded to two positions"))
        driver = check_driver(driver.session, source, replace(driver.graph, min_pass_width=2))
        invariance = check_batch_invariance(
            driver, stream, prefill=INVARIANCE_PREFILL, observe=observe
        )
    return invariance, driver


@dataclass(frozen=True, kw_only=True)
class GraphChecks:
    """What :func:`check_graph` measured of a saved graph."""

    parity: ParityResult
    invariance: BatchInvarianceResult
    #: The graph's logits of each prompt, for :func:`llama_cpp_agreement`.
    prompt_logits: list[np.ndarray]
    #: The narrowest pass the graph stays batch invariant at.
    min_pass_width: int


def check_graph(
    graph_path: Path,
    source: GGUFFile,
    graph: GraphSpec,
    prompts: Sequence[Sequence[int]],
    *,
    min_top1: float,
    exact_unpadded: bool = False,
    observe: ProgressObserver = ignore_progress,
) -> GraphChecks:
    """Parity and batch invariance of the graph at ``graph_path`` (``graph``: its record), and
    its logits of the prompts. Its session (the initializers and MatMulNBits' packed copies)
    lives only in this call, so that llama.cpp's check maps the file without it beside."""
    driver = check_driver(check_session(graph_path), source, graph)
    observe(ProgressEvent(stage="verify", message="parity with the file's weights (numpy)"))
    parity = check_parity(driver, source, prompts, min_top1=min_top1, observe=observe)
    observe(ProgressEvent(stage="verify", message="batch invariance, widths 2-9"))
    invariance, driver = batch_invariance(
        driver, source, prompts, exact_unpadded=exact_unpadded, observe=observe
    )
    return GraphChecks(
        parity=parity,
        invariance=invariance,
        prompt_logits=[driver.forward(prompt, driver.new_cache()) for prompt in prompts],
        min_pass_width=driver.graph.min_pass_width,
    )
