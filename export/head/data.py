"""A head's training data, from the target's own passes (the requests: :mod:`.requests`): the
target's greedy answers (sampled ones once the requests run
out), and the target's features at every position of prompt and answer. The features are the
graph's own ``features`` output, bit for bit what the runtime hands a head; saved in shards as
they are made, resumed from the last one, bounded in time.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.graph.driver import GraphDriver
from edgespec.graph.lookup import NgramIndex
from edgespec.graph.paths import PREFILL_CHUNK, GraphSizes
from edgespec.manifest import Bundle

Log = Callable[[str], None]
#: Samples per shard file (a shard is written when it fills, or when the time is up).
SHARD_SAMPLES = 24
SAMPLED_TEMPERATURE = 0.8
#: A greedy answer's lookup passes: n-grams of up to 3 tokens; 2 drafted tokens after a miss
#: (the runtime lookup's cold length), 6 while the previous pass kept all it drafted (a running
#: copy; the runtime's lookup drafts up to its k there).
LOOKUP_MAX_NGRAM = 3
LOOKUP_COLD = 2
LOOKUP_LONG = 6


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One sequence: ``tokens`` [L] (prompt then answer), the target's ``features`` [L, H]
    (float16; row t is the hidden state after token t), and where the answer starts."""

    tokens: np.ndarray
    features: np.ndarray
    prompt_length: int


class FeatureTeacher:
    """The target bundle on ONNX Runtime (bound, in-place cache), as the runtime runs it."""

    def __init__(self, bundle: Bundle, *, threads: int = 0) -> None:
        import onnxruntime

        from edgespec.graph.kernels import register_gguf_kernels

        manifest = bundle.manifest
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        register_gguf_kernels(options, required=False)
        session = onnxruntime.InferenceSession(
            str(bundle.graph_path), options, providers=["CPUExecutionProvider"]
        )
        model, graph = manifest.model, manifest.graph
        sizes = GraphSizes(
            kv_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            vocab_size=model.vocab_size,
            capacity=bundle.manifest.context(),
            hidden_size=model.hidden_size,
        )
        self.driver = GraphDriver(session, graph, sizes, bound=True, label=str(bundle.root))
        self.hidden = model.hidden_size
        self.eos_ids = frozenset(manifest.tokenizer.eos_token_ids)
        self.capacity = sizes.capacity

    def answer(
        self, prompt: list[int], count: int, *, temperature: float, rng: np.random.Generator
    ) -> Sample:
        """The target's answer to ``prompt`` (up to ``count`` tokens, to its end of turn) and
        the features of every token of prompt and answer (the answer's last token has none:
        it is dropped)."""
        tokens, parts = self._continue(prompt, count, temperature=temperature, rng=rng)
        feature_rows = np.concatenate(parts).astype(np.float16)
        return Sample(
            tokens=np.asarray(tokens[: len(feature_rows)], np.int32),
            features=feature_rows,
            prompt_length=len(prompt),
        )

    def written(
        self, prompt: list[int], count: int, *, temperature: float, rng: np.random.Generator
    ) -> list[int] | None:
        """The tokens the target writes after ``prompt`` when it ends its turn within
        ``count`` (its end-of-turn token dropped), else None."""
        tokens, _ = self._continue(prompt, count, temperature=temperature, rng=rng)
        if len(tokens) > len(prompt) and tokens[-1] in self.eos_ids:
            return tokens[len(prompt) : -1]
        return None

    def _continue(
        self, prompt: list[int], count: int, *, temperature: float, rng: np.random.Generator
    ) -> tuple[list[int], list[np.ndarray]]:
        """Prompt and continuation (to an end-of-turn token, kept, or ``count`` tokens), and
        the features [n, H] of each pass's kept tokens. A greedy answer is decoded with
        prompt-lookup passes: each pass checks the token picked and the tokens that followed
        the latest earlier copy of the context's tail, and keeps those the target's own
        argmax agrees with. The graph's passes are batch invariant, so tokens and features
        are what one-token steps give, in fewer passes where the answer copies its request
        (an edit rewrites the function it was given)."""
        cache = self.driver.new_cache()
        parts: list[np.ndarray] = []
        logits = np.zeros(0, np.float32)
        for begin in range(0, len(prompt), PREFILL_CHUNK):
            chunk = prompt[begin : begin + PREFILL_CHUNK]
            logits, features = self.driver.forward_features(chunk, cache, last_only=True)
            parts.append(features)
        tokens = list(prompt)
        room = max(min(count, self.capacity - len(prompt) - 1), 0)
        lookup = NgramIndex(max_ngram=LOOKUP_MAX_NGRAM, min_ngram=1) if temperature <= 0 else None
        if lookup is not None:
            lookup.reset(tokens)
        token, streak = _pick(logits[-1], temperature, rng), False
        while len(tokens) - len(prompt) < room:
            tokens.append(token)
            if token in self.eos_ids:
                break
            draft: tuple[int, ...] = ()
            if lookup is not None:
                lookup.extend((token,))
                left = room - (len(tokens) - len(prompt))
                draft = lookup.continuation(min(LOOKUP_LONG if streak else LOOKUP_COLD, left))
            logits, features = self.driver.forward_features([token, *draft], cache)
            kept = 0  # drafted tokens the target's argmax agrees with, up to its end of turn
            while kept < len(draft) and draft[kept] not in self.eos_ids:
                if int(np.argmax(logits[kept])) != draft[kept]:
                    break
                kept += 1
            cache.crop(cache.length - len(draft) + kept)
            streak = bool(draft) and kept == len(draft)
            parts.append(features[: 1 + kept])
            tokens.extend(draft[:kept])
            if lookup is not None:
                lookup.extend(draft[:kept])
            token = _pick(logits[kept], temperature, rng)
        return tokens, parts


def _pick(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    scaled = (logits - logits.max()) / temperature
    weights = np.exp(scaled)
    return int(rng.choice(len(weights), p=weights / weights.sum()))


def collect(
    teacher: FeatureTeacher,
    encode: Callable[[str], list[int]],
    texts: list[str],
    directory: Path,
    *,
    new_tokens: int,
    prompt_tokens: int,
    deadline: float,
    seed: int,
    log: Log,
    max_samples: int | None = None,
) -> None:
    """Answers to ``texts`` (greedy first, then sampled repeats) with their features, into
    ``directory``'s shards, until ``deadline`` (time.monotonic()); resumes where the last
    shard ended."""
    directory.mkdir(parents=True, exist_ok=True)
    done = sum(_shard_count(path) for path in sorted(directory.glob("shard-*.npz")))
    shard = len(list(directory.glob("shard-*.npz")))
    pending: list[Sample] = []
    started, positions = time.monotonic(), 0
    for index in range(done, max_samples or 1 << 30):
        if time.monotonic() >= deadline:
            break
        repeat, text = divmod(index, len(texts))
        prompt = encode(texts[text])[-prompt_tokens:]
        temperature = 0.0 if repeat == 0 else SAMPLED_TEMPERATURE
        rng = np.random.default_rng(seed * 1_000_003 + index)
        sample = teacher.answer(prompt, new_tokens, temperature=temperature, rng=rng)
        pending.append(sample)
        positions += len(sample.tokens)
        if len(pending) == SHARD_SAMPLES:
            shard, pending = _flush(directory, shard, pending), []
            log(_progress("data", f"{index + 1} samples", positions, started, deadline))
    if pending:
        write_shard(directory / f"shard-{shard:04d}.npz", pending)


def stdlib_texts(seed: int) -> list[str]:
    """The Python standard library's modules (its tests left out), shuffled by ``seed``: text
    the target reads in prefill passes only, many positions a second. The benchmark sets quote
    other packages, never the standard library."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        path
        for path in root.glob("**/*.py")
        if not any(part in ("test", "tests", "idlelib", "site-packages") for part in path.parts)
    )
    order = np.random.default_rng(seed).permutation(len(files))
    return [files[i].read_text(encoding="utf-8", errors="replace") for i in order]


def collect_text(
    teacher: FeatureTeacher,
    encode: Callable[[str], list[int]],
    texts: list[str],
    directory: Path,
    *,
    window: int,
    deadline: float,
    log: Log,
    max_samples: int | None = None,
) -> None:
    """The target's features over windows of ``window`` tokens of ``texts`` (prefill passes
    only, no answers), into ``directory``'s shards until ``deadline``; resumed."""
    directory.mkdir(parents=True, exist_ok=True)
    done = sum(_shard_count(path) for path in sorted(directory.glob("shard-*.npz")))
    shard = len(list(directory.glob("shard-*.npz")))
    windows = (
        ids[begin : begin + window]
        for text in texts
        for ids in (encode(text),)
        for begin in range(0, len(ids) - 8, window)
    )
    pending: list[Sample] = []
    started, positions, made = time.monotonic(), 0, 0
    for index, tokens in enumerate(windows):
        if time.monotonic() >= deadline or (max_samples is not None and made >= max_samples):
            break
        if index < done:
            continue
        cache = teacher.driver.new_cache()
        parts = [
            teacher.driver.forward_features(tokens[b : b + PREFILL_CHUNK], cache, last_only=True)[1]
            for b in range(0, len(tokens), PREFILL_CHUNK)
        ]
        features = np.concatenate(parts).astype(np.float16)
        pending.append(
            Sample(tokens=np.asarray(tokens, np.int32), features=features, prompt_length=0)
        )
        positions += len(tokens)
        made += 1
        if len(pending) == SHARD_SAMPLES:
            shard, pending = _flush(directory, shard, pending), []
            log(_progress("text", f"{index + 1} windows", positions, started, deadline))
    if pending:
        write_shard(directory / f"shard-{shard:04d}.npz", pending)


def _flush(directory: Path, shard: int, samples: list[Sample]) -> int:
    """Writes ``samples`` as shard number ``shard``; the next shard's number."""
    write_shard(directory / f"shard-{shard:04d}.npz", samples)
    return shard + 1


def _progress(stage: str, done: str, positions: int, started: float, deadline: float) -> str:
    elapsed = max(time.monotonic() - started, 1e-9)
    left = max(deadline - time.monotonic(), 0.0) / 60
    return (
        f"head: {stage} {done}, {positions:,} positions this run "
        f"({positions / elapsed:,.0f} positions/s), {left:.1f} min left"
    )


def held_out_samples(
    teacher: FeatureTeacher,
    encode: Callable[[str], list[int]],
    texts: list[str],
    path: Path,
    *,
    new_tokens: int,
    prompt_tokens: int,
) -> list[Sample]:
    """Greedy answers to the held-out requests (made once, kept in ``path``)."""
    if not path.is_file():
        rng = np.random.default_rng(0)
        samples = [
            teacher.answer(encode(text)[-prompt_tokens:], new_tokens, temperature=0.0, rng=rng)
            for text in texts
        ]
        write_shard(path, samples)
    return list(read_shard(path))


def write_shard(path: Path, samples: list[Sample]) -> None:
    lengths = np.array([len(s.tokens) for s in samples], np.int64)
    scratch = path.with_name(path.name + ".tmp.npz")
    np.savez(
        scratch,
        tokens=np.concatenate([s.tokens for s in samples]),
        features=np.concatenate([s.features for s in samples]),
        lengths=lengths,
        prompt_lengths=np.array([s.prompt_length for s in samples], np.int64),
    )
    os.replace(scratch, path)


def read_shard(path: Path) -> Iterator[Sample]:
    with np.load(path) as data:
        tokens, features = data["tokens"], data["features"]
        ends = np.cumsum(data["lengths"])
        for end, length, prompt in zip(ends, data["lengths"], data["prompt_lengths"], strict=True):
            begin = int(end - length)
            yield Sample(
                tokens=tokens[begin:end],
                features=features[begin:end],
                prompt_length=int(prompt),
            )


def read_samples(directory: Path) -> list[Sample]:
    return [s for path in sorted(directory.glob("shard-*.npz")) for s in read_shard(path)]


def _shard_count(path: Path) -> int:
    with np.load(path) as data:
        return len(data["lengths"])


def kept_vocabulary(samples: list[Sample], size: int, always: frozenset[int]) -> np.ndarray:
    """The ``size`` token ids the target writes most in ``samples`` (answers counted, then
    prompts to fill), and ``always`` (its end-of-turn ids); ascending."""
    answers = np.concatenate([s.tokens[s.prompt_length :] for s in samples] or [np.zeros(0)])
    prompts = np.concatenate([s.tokens[: s.prompt_length] for s in samples] or [np.zeros(0)])
    counts: dict[int, float] = {}
    for ids, weight in ((answers, 1.0), (prompts, 1e-6)):
        unique, frequency = np.unique(ids.astype(np.int64), return_counts=True)
        for token, count in zip(unique.tolist(), frequency.tolist(), strict=True):
            counts[token] = counts.get(token, 0.0) + weight * count
    ranked = sorted(counts, key=lambda token: -counts[token])
    kept = set(always) | set(ranked[: max(size - len(always), 0)])
    return np.array(sorted(kept), np.int64)


def data_record(samples: list[Sample]) -> dict[str, Any]:
    return {
        "samples": len(samples),
        "positions": int(sum(len(s.tokens) for s in samples)),
        "answer_positions": int(sum(len(s.tokens) - s.prompt_length for s in samples)),
    }


def save_json(path: Path, value: Any) -> None:
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    os.replace(scratch, path)
