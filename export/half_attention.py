"""A float16-attention copy of an in-place graph, for ONNX Runtime's CUDA provider.

Why: the CUDA provider's ``GroupQueryAttention`` takes float16 or bfloat16 only. A float32 one
is placed on the CPU, so every pass copies every layer's KV buffer between the GPU and the
host, and a step costs several times the CPU's (docs/benchmarks/gpu.md, "On a GPU").

The copy casts each attention's packed query/key/value [1, S, (H + 2 Hkv) D] to float16 and
its output [1, S, H D] back to float32, so only attention changes precision; its past and
present KV buffers [1, Hkv, capacity, D] become float16 graph inputs and outputs (half the
memory), and the rotary tables [positions, D / 2] float16 initializers. Everything else, the
weights above all, stays as the bundle stores it: the copy's initializers point into the
bundle's own data file, so the copy is a few hundred kilobytes. The exporter writes it into
every bundle whose in-place graph has float32 attention; the runtime runs it on CUDA.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from edgespec.errors import ExportError
from edgespec.manifest import GraphSpec

#: The copy's file in a bundle, beside the graph (``GraphSpec.half_attention_file``).
HALF_ATTENTION_FILE = "model.fp16-attention.onnx"
HALF_ATTENTION_ROLE = "graph_half_attention"
ATTENTION_OP = "GroupQueryAttention"
#: GroupQueryAttention's inputs by position: packed or separate query/key/value, past key and
#: value, the rotary cos and sin tables, and an additive attention bias.
_ACTIVATION_INPUTS = (0, 1, 2, 10)
_PAST_INPUTS = (3, 4)
_ROTARY_INPUTS = (7, 8)
_PRESENT_OUTPUTS = (1, 2)


def add_half_attention(staging: Path, spec: GraphSpec, roles: dict[str, str]) -> GraphSpec:
    """Writes the float16-attention copy of ``staging``'s in-place graph beside it when its
    attention is float32, adds the file to ``roles`` and returns ``spec`` naming it."""
    if spec.kv_sharing != "shared" or spec.kv_dtype != "float32":
        return spec
    import onnx

    graph_path = staging / spec.file
    model = onnx.load(str(graph_path), load_external_data=False)
    if not _float_attention(model):
        return spec
    convert_attention_to_half(model, base_dir=staging)
    onnx.save(model, str(staging / HALF_ATTENTION_FILE))
    roles[HALF_ATTENTION_FILE] = HALF_ATTENTION_ROLE
    return replace(spec, half_attention_file=HALF_ATTENTION_FILE)


def has_float_attention(graph_path: Path) -> bool:
    """Whether the graph's attention is a float32 ``GroupQueryAttention`` (the CUDA provider
    would place it on the CPU)."""
    import onnx

    return _float_attention(onnx.load(str(graph_path), load_external_data=False))


def _float_attention(model: Any) -> bool:
    from onnx import TensorProto

    inputs = {value.name: value.type.tensor_type.elem_type for value in model.graph.input}
    for node in model.graph.node:
        if node.op_type == ATTENTION_OP and len(node.input) > 3:
            return inputs.get(node.input[3]) == TensorProto.FLOAT
    return False


def convert_attention_to_half(model: Any, *, base_dir: Path) -> None:
    """Rewrites ``model`` (an ``onnx.ModelProto`` whose weights may stay external) in place."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    half_tables: dict[str, str] = {}
    casts: list[tuple[int, Any]] = []  # (index of the attention node, cast node before it)
    kv_names: set[str] = set()
    for index, node in enumerate(graph.node):
        if node.op_type != ATTENTION_OP:
            continue
        for position in _ACTIVATION_INPUTS:
            if position < len(node.input) and node.input[position]:
                name = node.input[position]
                cast_name = f"{name}.fp16.{index}"
                casts.append(
                    (index, helper.make_node("Cast", [name], [cast_name], to=TensorProto.FLOAT16))
                )
                node.input[position] = cast_name
        for position in _PAST_INPUTS:
            if position < len(node.input) and node.input[position]:
                kv_names.add(node.input[position])
        for position in _ROTARY_INPUTS:
            if position < len(node.input) and node.input[position] in initializers:
                name = node.input[position]
                if name not in half_tables:
                    table = numpy_helper.to_array(initializers[name], base_dir=str(base_dir))
                    half = numpy_helper.from_array(table.astype("float16"), f"{name}.fp16")
                    graph.initializer.append(half)
                    half_tables[name] = half.name
                node.input[position] = half_tables[name]
        for position in _PRESENT_OUTPUTS:
            if position < len(node.output) and node.output[position]:
                kv_names.add(node.output[position])
        output = node.output[0]
        node.output[0] = f"{output}.fp16"
        casts.append(
            (index + 1, helper.make_node("Cast", [node.output[0]], [output], to=TensorProto.FLOAT))
        )
    if not half_tables and not casts:
        raise ExportError(
            "this graph has no GroupQueryAttention to run in float16",
            fix="export it with the in-place graph (--graph inplace)",
        )
    # Insert the casts from the back so the earlier indices stay valid; each Cast before an
    # attention node goes right before it, each Cast of its output right after it.
    for position, cast in sorted(casts, key=lambda item: item[0], reverse=True):
        graph.node.insert(position, cast)
    for value in list(graph.input) + list(graph.output):
        if value.name in kv_names:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    # Tables left without a user (all attention nodes now read the float16 ones) go.
    used = {name for node in graph.node for name in node.input}
    kept = [tensor for tensor in graph.initializer if tensor.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
