"""A draft GGUF whose head scores only the tokens a text corpus uses most.

A draft's output layer reads one row per vocabulary token every step: for
Qwen2.5-Coder-0.5B (151,936 tokens x 896, 8-bit) that is about a third of the bytes a step
reads. Text uses a small part of a vocabulary, so a head over the most used tokens costs a
fraction and still proposes almost every token the target writes.

Exactness does not depend on which tokens are kept: the draft only proposes, and the target
checks every proposal (greedy: its own argmax decides; sampled: rejection sampling against
the draft's distribution, which is zero outside the kept tokens and so never proposes
them). A target token outside the kept set is one rejected position, the acceptance rate's
loss, which :func:`corpus_coverage` measures.

The tokens are counted over the Python standard library's sources on this machine (code,
docstrings and comments: the text a coding assistant writes), read in sorted order up to
:data:`CORPUS_CHARACTERS`, then ranked by count, then id; the tokenizer's end-of-turn tokens
are always kept.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: Characters of corpus counted (about 8 M characters of stdlib source: seconds to tokenize).
CORPUS_CHARACTERS = 8_000_000
#: Texts tokenized per batch.
BATCH = 64


def corpus_texts(limit: int = CORPUS_CHARACTERS) -> Iterator[str]:
    """The standard library's ``.py`` sources, sorted by path, up to ``limit`` characters."""
    root = Path(sysconfig.get_paths()["stdlib"])
    taken = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        yield text
        taken += len(text)
        if taken >= limit:
            return


def token_counts(tokenizer: Any, vocab_size: int, texts: Iterable[str]) -> np.ndarray:
    """How often each token id occurs in ``texts`` ([vocab_size] int64)."""
    counts = np.zeros(vocab_size, np.int64)
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == BATCH:
            _count(tokenizer, batch, counts)
            batch = []
    if batch:
        _count(tokenizer, batch, counts)
    return counts


def _count(tokenizer: Any, batch: list[str], counts: np.ndarray) -> None:
    for encoding in tokenizer.encode_batch(batch, add_special_tokens=False):
        ids = np.asarray(encoding.ids, np.int64)
        np.add.at(counts, ids[ids < len(counts)], 1)


def kept_tokens(counts: np.ndarray, size: int, always: Sequence[int]) -> np.ndarray:
    """The ``size`` most counted ids (ties by id), ``always`` first; ascending."""
    order = np.lexsort((np.arange(len(counts)), -counts))  # by count, then by id
    chosen = list(dict.fromkeys([*(int(t) for t in always), *(int(t) for t in order)]))[:size]
    return np.array(sorted(chosen), np.int64)


def corpus_coverage(kept: np.ndarray, tokens: Sequence[int]) -> float:
    """The share of ``tokens`` that a head over ``kept`` can propose."""
    if not tokens:
        return 1.0
    return float(np.isin(np.asarray(tokens, np.int64), kept).mean())


def reduced_head_gguf(
    path: Path,
    out: Path,
    size: int,
    texts: Iterable[str] | None = None,
    *,
    requantize: dict[str, str] | None = None,
    head_type: str | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Writes ``out``: the draft GGUF ``path`` with a head over its ``size`` most used tokens
    in ``texts`` (default :func:`corpus_texts`), in the block type ``head_type`` (default: the
    file's own), its layers' ``requantize`` block types (e.g. {"Q5_0": "Q4_0"}) at fewer
    bits; returns it and a record of the choice."""
    from edgespec.export.distill.gguf_draft import reduce_output_vocabulary
    from edgespec.export.gguf.reader import open_gguf
    from edgespec.export.gguf.tokenizer import build_tokenizer

    source = open_gguf(path)
    vocab = source.architecture.vocab_size
    tokenizer = build_tokenizer(source)
    counts = token_counts(tokenizer.tokenizer, vocab, corpus_texts() if texts is None else texts)
    kept = kept_tokens(counts, min(size, vocab), tokenizer.eos_token_ids)
    record = {
        "output_vocabulary": len(kept),
        "output_vocabulary_made_by": (
            f"the {len(kept):,} tokens used most in {int(counts.sum()):,} tokens of "
            f"{'the Python standard library' if texts is None else 'the given texts'}, "
            f"covering {counts[kept].sum() / max(int(counts.sum()), 1):.2%} of them"
        ),
    }
    if requantize:
        record["requantized"] = dict(requantize)
    if head_type:
        record["head_type"] = head_type
    del source
    reduced = reduce_output_vocabulary(path, out, kept, requantize=requantize, head_type=head_type)
    return reduced, record
