"""The in-place graph's embedding lookup: the file's blocks on the GGUF kernels, MatMulNBits'
block initializers gathered and dequantized in the graph, or a float table."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgespec.export.gguf.builder import GraphBuilder
from edgespec.export.gguf.reader import WeightSource, float_tensor


def embedding(builder: GraphBuilder, source: WeightSource, ids: str) -> tuple[str, Any]:
    """The embedding lookup [1, S, hidden], and what the tied LM head reuses: the same block
    initializers (rows are tokens), dequantized in the graph for the S looked-up tokens only."""
    tensor = source.tensor("token_embd.weight")
    raw = builder.raw_blocks(tensor)
    if raw is not None:  # the GGUF kernels: rows looked up from the file's blocks
        blocks = builder.raw_initializer("embed", raw)
        return builder.gguf_gather(ids, blocks, raw, "embed"), (blocks, raw)
    weights = builder.blocks(tensor)
    if weights is None:
        table = float_tensor(tensor)
        builder.float_weights += table.size
        return builder.node("Gather", [builder.constant("embed.table", table), ids], "embed"), (
            table
        )
    names = builder.block_initializers("embed", weights)
    last_axis = builder.constant("c.axis", np.array([-1]))
    codes = builder.node("Gather", [names.packed, ids], "embed.codes")  # [1, S, blocks, bytes]
    if weights.bits == 4:
        low = builder.node("BitwiseAnd", [codes, builder.constant("c.15", np.uint8(15))], "e.lo")
        high = builder.node(
            "BitShift", [codes, builder.constant("c.4", np.uint8(4))], "e.hi", direction="RIGHT"
        )
        pairs = [builder.node("Unsqueeze", [part, last_axis], f"{part}1") for part in (low, high)]
        codes = builder.node("Concat", pairs, "e.pairs", axis=-1)  # [1, S, blocks, 16, 2]
    size = weights.block
    shape = builder.constant("embed.block_shape", np.array([1, -1, weights.columns // size, size]))
    codes = builder.node("Reshape", [codes, shape], "e.blocks")
    codes = builder.node("Cast", [codes], "e.float", to=1)
    zero_point = builder.constant("embed.zero_point", np.float32(2 ** (weights.bits - 1)))
    scales = builder.node(
        "Unsqueeze", [builder.node("Gather", [names.scales, ids], "e.scales"), last_axis], "e.s"
    )
    centred = builder.node("Sub", [codes, zero_point], "e.centred")
    values = builder.node("Mul", [centred, scales], "e.scaled")
    if names.offsets_t is not None:  # stored [K / 32, N]: gather columns, then [1, S, blocks, 1]
        offsets = builder.node("Gather", [names.offsets_t, ids], "e.off", axis=1)
        offsets = builder.node("Transpose", [offsets], "e.off_t", perm=[1, 2, 0])
        offsets = builder.node("Unsqueeze", [offsets, last_axis], "e.off_u")
        values = builder.node("Add", [values, offsets], "e.values")
    flat = builder.constant("embed.shape", np.array([1, -1, weights.columns]))
    return builder.node("Reshape", [values, flat], "embed"), (names, weights.shape)
