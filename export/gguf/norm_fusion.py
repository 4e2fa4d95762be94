"""A pass over the GGUF graph's nodes: each residual Add folded into the RMSNorm that reads
it (ONNX Runtime's SkipSimplifiedLayerNormalization), one node instead of two."""

from __future__ import annotations

from typing import Any


def fuse_residual_norms(nodes: list[Any]) -> list[Any]:
    """Each residual Add followed by the next RMSNorm of its sum becomes one
    SkipSimplifiedLayerNormalization, which returns the normed sum and the sum itself (its
    fourth output, the residual stream): one kernel instead of two, 60 fewer per step for a
    30-layer model. ONNX Runtime's optimizer does not make this fusion itself."""
    from onnx import helper

    residual_adds = {
        node.output[0]: node
        for node in nodes
        if node.op_type == "Add" and node.output[0].endswith("_residual")
    }
    fused, replaced = [], set()
    for node in nodes:
        add = (
            residual_adds.get(node.input[0])
            if node.op_type == "SimplifiedLayerNormalization"
            else None
        )
        if add is None or add.output[0] in replaced:
            fused.append(node)
            continue
        replaced.add(add.output[0])
        epsilon = next(a.f for a in node.attribute if a.name == "epsilon")
        fused.append(
            helper.make_node(
                "SkipSimplifiedLayerNormalization",
                [add.input[1], add.input[0], node.input[1]],  # the branch, the residual, gamma
                [node.output[0], "", "", add.output[0]],
                name=node.name,
                domain="com.microsoft",
                epsilon=epsilon,
            )
        )
    return [node for node in fused if node.op_type != "Add" or node.output[0] not in replaced]
