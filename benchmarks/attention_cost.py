"""What ONNX Runtime's GroupQueryAttention costs on this CPU by context, pass width and cache
type, alone: a graph of ``--layers`` attention nodes, each over its own in-place cache (so the
caches exceed the last-level cache, as in a model), nothing else.

    python benchmarks/attention_cost.py [--contexts 64,1024,3000] [--widths 1,2] [--layers 30]
        [--heads 9] [--kv-heads 3] [--head-dim 64] [--capacity 4096] [--threads 2]

The defaults are SmolLM2-135M's attention. For each cache type (float32, and float16 with
the packed Q, K, V cast to float16 before the nodes) and each width, the graph runs 25 passes
after ``context`` positions and the median is printed as one JSON line. A pass of one row and
a pass of several take different paths through the kernel (see docs/benchmarks/kernels.md, "Where a
4-bit step goes"), which is what ``--widths`` shows.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import harness

REPEATS = 25


def attention_graph(args: argparse.Namespace, *, half: bool) -> Any:
    import onnx
    from onnx import TensorProto, helper

    kv_type = TensorProto.FLOAT16 if half else TensorProto.FLOAT
    width = (args.heads + 2 * args.kv_heads) * args.head_dim
    nodes, query = [], "qkv"
    if half:
        nodes.append(helper.make_node("Cast", ["qkv"], ["qkv16"], to=kv_type))
        query = "qkv16"
    kv = [1, args.kv_heads, args.capacity, args.head_dim]
    inputs = [
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [1, "s", width]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    outputs = []
    for layer in range(args.layers):
        # Each node rotates its packed input in place: give it its own copy.
        nodes.append(helper.make_node("Identity", [query], [f"q{layer}"]))
        nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                [
                    f"q{layer}",
                    "",
                    "",
                    f"pk{layer}",
                    f"pv{layer}",
                    "seqlens_k",
                    "total",
                    "cos",
                    "sin",
                ],
                [f"o{layer}", f"ok{layer}", f"ov{layer}"],
                domain="com.microsoft",
                num_heads=args.heads,
                kv_num_heads=args.kv_heads,
                do_rotary=1,
            )
        )
        inputs += [helper.make_tensor_value_info(f"p{k}{layer}", kv_type, kv) for k in "kv"]
        outputs += [helper.make_tensor_value_info(f"o{k}{layer}", kv_type, kv) for k in "kv"]
    nodes.append(helper.make_node("Sum", [f"o{layer}" for layer in range(args.layers)], ["sum"]))
    outputs.insert(
        0, helper.make_tensor_value_info("sum", kv_type, [1, "s", args.heads * args.head_dim])
    )
    inverse = 10000.0 ** (-np.arange(0, args.head_dim, 2) / args.head_dim)
    angles = np.arange(args.capacity)[:, None] * inverse[None, :]
    dtype = np.float16 if half else np.float32
    rotary = [
        onnx.numpy_helper.from_array(np.cos(angles).astype(dtype), "cos"),
        onnx.numpy_helper.from_array(np.sin(angles).astype(dtype), "sin"),
    ]
    graph = helper.make_graph(nodes, "attention", inputs, outputs, rotary)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 10
    return model


def main() -> None:
    import onnxruntime

    parser = harness.argument_parser(__doc__, threads=2, contexts="64,1024,3000")
    parser.add_argument("--widths", default="1,2")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--capacity", type=int, default=4096)
    args = parser.parse_args()
    lines = harness.JsonLines(args.jsonl)
    rng = np.random.default_rng(0)
    width = (args.heads + 2 * args.kv_heads) * args.head_dim
    for half in (False, True):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = args.threads
        session = onnxruntime.InferenceSession(
            attention_graph(args, half=half).SerializeToString(),
            options,
            providers=["CPUExecutionProvider"],
        )
        dtype = np.float16 if half else np.float32
        shape = (1, args.kv_heads, args.capacity, args.head_dim)
        caches = [
            onnxruntime.OrtValue.ortvalue_from_numpy(
                (0.3 * rng.standard_normal(shape)).astype(dtype)
            )
            for _ in range(2 * args.layers)
        ]
        for context in (int(c) for c in args.contexts.split(",")):
            for rows in (int(w) for w in args.widths.split(",")):
                binding = session.io_binding()
                binding.bind_cpu_input("seqlens_k", np.array([context + rows - 1], np.int32))
                binding.bind_cpu_input("total", np.array(context + rows, np.int32))
                for layer in range(args.layers):
                    for index, kind in enumerate("kv"):
                        value = caches[2 * layer + index]
                        binding.bind_ortvalue_input(f"p{kind}{layer}", value)
                        binding.bind_ortvalue_output(f"o{kind}{layer}", value)
                binding.bind_output("sum")
                qkv = rng.standard_normal((1, rows, width)).astype(np.float32)
                found = []
                for _ in range(REPEATS):
                    binding.bind_cpu_input("qkv", qkv.copy())
                    started = time.perf_counter()
                    session.run_with_iobinding(binding)
                    found.append(time.perf_counter() - started)
                line = {"kv": "float16" if half else "float32", "context": context}
                line |= {"width": rows, "layers": args.layers}
                lines.write(line | {"median_ms": round(float(np.median(found)) * 1e3, 2)})


if __name__ == "__main__":
    main()
