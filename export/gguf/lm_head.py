"""The GGUF graph's output layer: the logits from the final hidden state, through the output
weight, the tied embedding, or a draft's head over a reduced vocabulary."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgespec.errors import UnsupportedModelError
from edgespec.export.gguf.builder import GraphBuilder
from edgespec.export.gguf.raw_blocks import RawBlocks
from edgespec.export.gguf.reader import WeightSource, tensor_rows
from edgespec.manifest import UNSCORED_LOGIT


def lm_head(builder: GraphBuilder, source: WeightSource, x: str, tied: Any, *, logits: str) -> str:
    """The logits [1, R, vocab] (``logits``) from the final hidden state ``x``: the output
    weight's product, the tied embedding's, or a draft's head over a reduced vocabulary;
    Gemma 2's capped as cap * tanh(logits / cap)."""
    cap = source.architecture.final_softcap
    if not cap:
        return _head(builder, source, x, tied, logits=logits)
    raw = _head(builder, source, x, tied, logits=f"{logits}.uncapped")
    factor = builder.constant("logits.softcap", np.float32(cap))
    scaled = builder.node("Div", [raw, factor], f"{logits}.scaled")
    return builder.node("Mul", [builder.node("Tanh", [scaled], f"{logits}.tanh"), factor], logits)


def _head(builder: GraphBuilder, source: WeightSource, x: str, tied: Any, *, logits: str) -> str:
    kept = source.architecture.output_vocabulary
    if kept:
        return _reduced_lm_head(builder, source, x, np.asarray(kept, np.int64), logits)
    if not source.architecture.tied_embeddings:
        return builder.linear(x, source.tensor("output.weight"), logits)
    if isinstance(tied, np.ndarray):  # the float embedding table [vocab, hidden] itself
        hidden = source.architecture.hidden_size
        rows = builder.node(
            "Reshape", [x, builder.constant("lm_head.rows", np.array([-1, hidden]))], "lm_head.x"
        )
        products = builder.node("Gemm", [rows, "embed.table"], "lm_head.gemm", transB=1)
        shape = builder.constant("lm_head.shape", np.array([1, -1, source.architecture.vocab_size]))
        return builder.node("Reshape", [products, shape], logits)
    names, weights = tied
    if isinstance(weights, RawBlocks):
        return builder.gguf_matmul(x, names, weights, logits)
    return builder.matmul_nbits(x, names, weights, logits)


def _reduced_lm_head(
    builder: GraphBuilder, source: WeightSource, x: str, kept: np.ndarray, logits: str
) -> str:
    """A draft's head over its ``kept`` tokens only ([1, R, N]: the output layer's cost falls
    with N), scattered into full-vocabulary logits [1, R, vocab] that hold ``UNSCORED_LOGIT``
    elsewhere, so the runtime reads a draft like any other."""

    rows = tensor_rows(source.tensor("output.weight"))[0]
    vocab = source.architecture.vocab_size
    if rows != len(kept) or kept.min() < 0 or kept.max() >= vocab or (np.diff(kept) <= 0).any():
        raise UnsupportedModelError(
            f"the reduced output vocabulary ({len(kept)} ids) does not match output.weight "
            f"({rows} rows) or is not ascending ids below {vocab}",
            fix="rewrite the draft with tools/reduce_draft_vocabulary.py",
        )
    scored = builder.linear(x, source.tensor("output.weight"), "lm_head.kept")  # [1, R, N]
    shape = builder.node("Shape", [scored], "lm_head.kept_shape")
    starts, ends = (
        builder.constant("lm_head.s0", np.array([0])),
        builder.constant("lm_head.s2", np.array([2])),
    )
    leading = builder.node("Slice", [shape, starts, ends], "lm_head.leading")  # [1, R]
    full_shape = builder.node(
        "Concat", [leading, builder.constant("lm_head.vocab", np.array([vocab]))], "lm_head.full",
        axis=0,
    )  # fmt: skip
    fill = builder.node(
        "Expand", [builder.constant("lm_head.unscored", np.array([UNSCORED_LOGIT], np.float32)),
                   full_shape], "lm_head.fill",
    )  # fmt: skip
    ids = builder.node(
        "Expand", [builder.constant("lm_head.ids", kept.reshape(1, 1, -1)), shape], "lm_head.where"
    )
    return builder.node("ScatterElements", [fill, ids, scored], logits, axis=2)
