"""A draft's attention over a window of its history: a graph's CacheAttention nodes given a
window of recent positions and a sink of the first ones, as the bytes of a graph that ONNX
Runtime loads beside the bundle's weights.

Why: every draft step attends over the whole history, so at long contexts a draft's step grows
with it (the 0.5B beside Qwen2.5-Coder-1.5B: 7.6 ms a step near the start, 17.1 ms 6,144
tokens in) and drafting stops paying. A draft need not be exact (the target checks every token
it proposes), so it can read only the last ``window`` positions and, because a model not
trained with a window puts much of its attention on the first tokens ("attention sinks"),
the first ``SINK`` positions too: its step then costs what it costs ``window`` tokens in. The
cache still holds every position (the target's rounds roll it back as before); only the
kernel's reads stop at the window.

Only edgespec's CacheAttention (GGUF imports and heads) takes a window; a graph of ONNX
Runtime's attention operators is left whole (:func:`windowed_graph` returns None), and so is a
graph in ONNX Runtime's own ``.ort`` format (a phone's bundle): that file is a flatbuffer, not a
protobuf, and is not edited here. A layer that already has a window as short (Gemma 3's local
layers) keeps its own.

The device install has no ``onnx`` package, so the graph is edited on protobuf's wire format:
ModelProto's graph (field 7), GraphProto's nodes (1), a NodeProto's op_type (4), domain (7)
and attributes (5), an AttributeProto's name (1), int (3) and type (20). Every other field is
copied as it was.
"""

from __future__ import annotations

from pathlib import Path

from edgespec.graph.kernels import ATTENTION_KERNELS, GGUF_DOMAIN

#: The first positions every windowed row still sees: one block of the kernel's 128
#: positions (the kernel reads whole blocks, so a smaller sink costs the same).
SINK = 128
#: ONNX Runtime's session setting that says where a graph loaded from bytes finds the files of
#: its external initializers.
EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"

MODEL_GRAPH, GRAPH_NODE = 7, 1
NODE_OP_TYPE, NODE_DOMAIN, NODE_ATTRIBUTE = 4, 7, 5
ATTRIBUTE_NAME, ATTRIBUTE_INT, ATTRIBUTE_TYPE = 1, 3, 20
ATTRIBUTE_TYPE_INT = 2
LENGTH_DELIMITED, VARINT = 2, 0
#: The file suffix of a protobuf graph; ONNX Runtime's flatbuffer format is ``.ort``.
ONNX_SUFFIX = ".onnx"


def windowed_graph(graph_path: Path, window: int) -> bytes | None:
    """The graph at ``graph_path`` with every CacheAttention node that sees more than
    ``window`` positions set to the last ``window`` and the first :data:`SINK` (its weights
    stay in the bundle's files); None when the graph has no such node or is not an ONNX
    protobuf (an ``.ort`` file)."""
    if graph_path.suffix != ONNX_SUFFIX:
        return None
    model = parse(graph_path.read_bytes())
    changed = 0
    for index, (number, wire, value) in enumerate(model):
        if number != MODEL_GRAPH or not isinstance(value, bytes):
            continue
        graph = parse(value)
        for at, (field, kind, nested) in enumerate(graph):
            edited = windowed_node(nested, window) if field == GRAPH_NODE else None
            if edited is not None:
                graph[at] = (field, kind, edited)
                changed += 1
        model[index] = (number, wire, serialize(graph))
    return serialize(model) if changed else None


def windowed_node(node: bytes | int, window: int) -> bytes | None:
    """A NodeProto of CacheAttention with the window and sink, or None to keep it as it is
    (another operator, or a window already at most ``window``)."""
    if not isinstance(node, bytes):
        return None
    fields = parse(node)
    texts = {number: value for number, _, value in fields if isinstance(value, bytes)}
    kernels = {op.encode() for op in ATTENTION_KERNELS}
    if texts.get(NODE_DOMAIN) != GGUF_DOMAIN.encode() or texts.get(NODE_OP_TYPE) not in kernels:
        return None
    attributes: dict[bytes, int] = {}  # name -> index of its field
    for index, (number, _, value) in enumerate(fields):
        if number == NODE_ATTRIBUTE and isinstance(value, bytes):
            attributes[attribute_name(value)] = index
    own = int_attribute(fields[attributes[b"window"]][2]) if b"window" in attributes else 0
    if own and own <= window:
        return None
    for name, value in ((b"window", window), (b"sink", SINK)):
        encoded = (NODE_ATTRIBUTE, LENGTH_DELIMITED, int_attribute_bytes(name, value))
        if name in attributes:
            fields[attributes[name]] = encoded
        else:
            fields.append(encoded)
    return serialize(fields)


Field = tuple[int, int, "bytes | int"]


def parse(data: bytes) -> list[Field]:
    """A message's fields in order: (number, wire type, bytes of a length-delimited field or
    the integer of a varint); fixed-width fields keep their bytes."""
    fields: list[Field] = []
    at = 0
    while at < len(data):
        key, at = varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, at = varint(data, at)
            fields.append((number, wire, value))
        elif wire == LENGTH_DELIMITED:
            length, at = varint(data, at)
            fields.append((number, wire, data[at : at + length]))
            at += length
        elif wire in (1, 5):  # 64- and 32-bit
            width = 8 if wire == 1 else 4
            fields.append((number, wire, data[at : at + width]))
            at += width
        else:
            raise ValueError(f"protobuf wire type {wire} is not read here")
    return fields


def serialize(fields: list[Field]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += encode_varint(number << 3 | wire)
        if wire == VARINT:
            assert isinstance(value, int)
            out += encode_varint(value)
        elif wire == LENGTH_DELIMITED:
            assert isinstance(value, bytes)
            out += encode_varint(len(value)) + value
        else:
            assert isinstance(value, bytes)
            out += value
    return bytes(out)


def varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # a negative int64 is its two's complement, ten bytes
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def attribute_name(attribute: bytes) -> bytes:
    found = next((v for n, _, v in parse(attribute) if n == ATTRIBUTE_NAME), b"")
    return found if isinstance(found, bytes) else b""


def int_attribute(attribute: bytes | int) -> int:
    assert isinstance(attribute, bytes)
    found = next((v for n, _, v in parse(attribute) if n == ATTRIBUTE_INT), 0)
    return found if isinstance(found, int) else 0


def int_attribute_bytes(name: bytes, value: int) -> bytes:
    return serialize(
        [
            (ATTRIBUTE_NAME, LENGTH_DELIMITED, name),
            (ATTRIBUTE_INT, VARINT, value),
            (ATTRIBUTE_TYPE, VARINT, ATTRIBUTE_TYPE_INT),
        ]
    )
