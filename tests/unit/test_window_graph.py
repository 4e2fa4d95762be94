"""The draft window's graph edit (``edgespec.graph.window``), made on protobuf's wire format
without the onnx package: read back by onnx, every CacheAttention node that saw more than the
window has the window and the sink, a shorter sliding window is kept, and everything else is
as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgespec.graph.kernels import CACHE_ATTENTION, CACHE_ATTENTION_HALF, GGUF_DOMAIN
from edgespec.graph.window import SINK, windowed_graph

onnx = pytest.importorskip("onnx")


def attention(name: str, op: str = CACHE_ATTENTION, **attributes: int) -> object:
    return onnx.helper.make_node(
        op,
        ["q", "k", "v", "pk", "pv", "s", "t"],
        [f"{name}.y", f"{name}.k", f"{name}.v"],
        name=name,
        domain=GGUF_DOMAIN,
        num_heads=12,
        kv_num_heads=2,
        **attributes,
    )


def graph_file(tmp_path: Path, nodes: list[object]) -> Path:
    floats = onnx.TensorProto.FLOAT
    graph = onnx.helper.make_graph(
        nodes,
        "g",
        [onnx.helper.make_tensor_value_info("q", floats, [1, "s", 12 * 64])],
        [onnx.helper.make_tensor_value_info("global.y", floats, [1, "s", 12 * 64])],
        initializer=[onnx.helper.make_tensor("w", floats, [2], [1.0, -2.5])],
    )
    model = onnx.helper.make_model(
        graph,
        opset_imports=[onnx.helper.make_opsetid("", 21), onnx.helper.make_opsetid(GGUF_DOMAIN, 1)],
    )
    model.metadata_props.add(key="edgespec", value="kept")
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return path


def attributes_of(model: object, name: str) -> dict[str, int]:
    node = next(n for n in model.graph.node if n.name == name)  # type: ignore[attr-defined]
    return {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}


def test_every_attention_node_that_sees_more_gets_the_window_and_the_sink(tmp_path: Path) -> None:
    nodes = [
        attention("global", window=0, softcap=0),
        attention("local", window=512),  # Gemma 3's sliding layers: trained so, kept
        attention("wide", window=4096),
        attention("bare"),  # no window attribute at all
        attention("half", CACHE_ATTENTION_HALF, window=0),
        onnx.helper.make_node("Relu", ["x"], ["y"], name="other"),
    ]
    edited = windowed_graph(graph_file(tmp_path, nodes), 1024)
    assert edited is not None
    model = onnx.load_from_string(edited)
    for name in ("global", "wide", "bare", "half"):
        found = attributes_of(model, name)
        assert (found["window"], found["sink"]) == (1024, SINK)
        assert (found["num_heads"], found["kv_num_heads"]) == (12, 2)
    assert attributes_of(model, "global")["softcap"] == 0
    assert attributes_of(model, "local") == {"num_heads": 12, "kv_num_heads": 2, "window": 512}
    assert [n.name for n in model.graph.node] == [n.name for n in nodes]  # type: ignore[attr-defined]
    assert onnx.numpy_helper.to_array(model.graph.initializer[0]).tolist() == [1.0, -2.5]
    assert model.metadata_props[0].value == "kept"


def test_a_graph_without_edgespecs_attention_is_left_whole(tmp_path: Path) -> None:
    relu = onnx.helper.make_node("Relu", ["q"], ["global.y"], name="other")
    assert windowed_graph(graph_file(tmp_path, [relu]), 1024) is None
    short = attention("global", window=512)
    assert windowed_graph(graph_file(tmp_path, [short]), 1024) is None


def test_an_ort_format_graph_is_left_whole(tmp_path: Path) -> None:
    # ONNX Runtime's .ort format (a phone's bundle) is a flatbuffer: its bytes read as
    # protobuf give a wire type that does not exist, so it must not be parsed at all.
    ort = tmp_path / "model.ort"
    ort.write_bytes(b"\x18\x00\x00\x00ORTM\x00\x00\x00\x00\x0c\x00\x10\x00\x0c\x00\x08\x00")
    assert windowed_graph(ort, 1024) is None
