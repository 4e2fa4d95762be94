"""What each term of a K-quant layer costs in ONNX Runtime's MatMulNBits and in edgespec's
GGUF kernels, at a real model's shapes: the ingredients of one target step, timed alone.

    python benchmarks/matmul_terms.py [--k 1536] [--n 17920] [--rows 1,2,5,8] [--threads 2]

The default shape is Qwen2.5-Coder-1.5B's stacked gate/up projection (1,536 -> 2 x 8,960).
Each variant is one small graph of random codes in one session (2 intra-op threads), timed
for ``--rows`` rows per call (1: a single step; 2: a padded step; 5: a 4-token verify pass),
best of three blocks of 50 calls, all variants alternating:

- ``4-bit``: symmetric 4-bit codes, float32 scales per block of 32 (what a Q4_0 weight, and
  the scaled part of a Q4_K weight, run as).
- ``4-bit + minimum term``: the Q4_K minimum as edgespec's graph adds it: the input summed
  per block, times a [K / 32, N] float32 matrix, added.
- ``4-bit, uint8 zero points``: ONNX Runtime GenAI's asymmetric layout (a requantization:
  the minimum rounded to the code grid).
- ``4-bit, float zero points``: the minimum exactly, as MatMulNBits' float zero points.
- ``8-bit``: 8-bit codes (how MatMulNBits runs Q6_K and Q8_0 weights).
- ``GGUF kernel, TYPE, file layout`` / ``..., rows of 8``: edgespec's own operator on random
  blocks of Q4_K, Q6_K, Q4_0, Q5_0 or Q8_0 (small float16 factors), as the file stores them and in
  the rows-of-8 layout the importer writes, when the kernels are built; ``GB_per_s`` is the
  weight's bytes over the time.

Then whether one row's output is bit-identical whatever the call's row count (what lets a
one-token step and a verify pass give the same logits): one JSON line per variant and row
count, then one per variant with ``same_bits_1_vs_2`` and ``same_bits_2_vs_5``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import harness

BLOCK = 32
#: Timed blocks per variant and row count (the best is kept: the multi-row kernel's time
#: moves by tens of percent from block to block on 2 cores).
BLOCKS = 3


#: The GGUF kernels' block types: ggml type id, inputs and bytes per block, where its float16
#: factors start and how many there are.
KERNEL_TYPES = {
    "Q4_K": (12, 256, 144, 0, 2),
    "Q6_K": (14, 256, 210, 208, 1),
    "Q4_0": (2, 32, 18, 0, 1),
    "Q5_0": (6, 32, 22, 0, 1),
    "Q8_0": (8, 32, 34, 0, 1),
}
KERNEL_VARIANTS = {
    f"GGUF kernel, {kind}, {layout}": (kind, layout == "rows of 8")
    for kind in KERNEL_TYPES
    for layout in ("file layout", "rows of 8")
}


def kernel_session(k: int, n: int, variant: str, threads: int, seed: int = 0) -> Any:
    """One GgufMatMul over random blocks of the variant's type."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from edgespec.export.gguf.rows8 import ROWS8_OFFSET, to_rows8
    from edgespec.graph.kernels import GGUF_DOMAIN, register_gguf_kernels

    kind, rows8 = KERNEL_VARIANTS[variant]
    ggml_type, inputs, size, at, halves = KERNEL_TYPES[kind]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n * k // inputs, size), dtype=np.uint8)
    factors = rng.uniform(2e-4, 6e-4, (len(blocks), halves)).astype(np.float16)
    blocks[:, at : at + 2 * halves] = factors.view(np.uint8)
    blocks = blocks.reshape(n, -1)
    if rows8:
        blocks, ggml_type = to_rows8(blocks, kind), ggml_type + ROWS8_OFFSET
    node = helper.make_node(
        "GgufMatMul", ["x", "w"], ["y"], domain=GGUF_DOMAIN, ggml_type=ggml_type,
        in_features=k, out_features=n,
    )  # fmt: skip
    graph = helper.make_graph(
        [node],
        "kernel",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "rows", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "rows", n])],
        [numpy_helper.from_array(blocks, "w")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(GGUF_DOMAIN, 1)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    register_gguf_kernels(options, required=True)
    model = helper.make_model(graph, opset_imports=opsets)
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def session(k: int, n: int, variant: str, threads: int, seed: int = 0) -> Any:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    if variant in KERNEL_VARIANTS:
        return kernel_session(k, n, variant, threads, seed)
    rng = np.random.default_rng(seed)
    bits = 8 if variant == "8-bit" else 4
    blocks = k // BLOCK
    codes = rng.integers(0, 256, size=(n, blocks, BLOCK * bits // 8), dtype=np.uint8)
    scales = (rng.random(n * blocks, dtype=np.float32) * 0.01).astype(np.float32)
    initializers = [numpy_helper.from_array(codes, "w"), numpy_helper.from_array(scales, "s")]
    inputs = ["x", "w", "s"]
    if variant == "4-bit, uint8 zero points":
        points = rng.integers(0, 256, size=n * ((blocks + 1) // 2), dtype=np.uint8)
        initializers.append(numpy_helper.from_array(points, "zp"))
        inputs.append("zp")
    if variant == "4-bit, float zero points":
        points = (rng.random(n * blocks, dtype=np.float32) * 8).astype(np.float32)
        initializers.append(numpy_helper.from_array(points, "zp"))
        inputs.append("zp")
    offsets = variant == "4-bit + minimum term"
    nodes = [
        helper.make_node(
            "MatMulNBits",
            inputs,
            ["p" if offsets else "y"],
            domain="com.microsoft",
            K=k,
            N=n,
            bits=bits,
            block_size=BLOCK,
            accuracy_level=4,
        )
    ]
    if offsets:  # sums [.., K / 32] @ minimums [K / 32, N], added
        minimums = rng.random((blocks, n), dtype=np.float32)
        initializers += [
            numpy_helper.from_array(np.array([1, -1, blocks, BLOCK]), "shape"),
            numpy_helper.from_array(np.array([-1]), "axis"),
            numpy_helper.from_array(minimums, "minimums"),
        ]
        nodes += [
            helper.make_node("Reshape", ["x", "shape"], ["xb"]),
            helper.make_node("ReduceSum", ["xb", "axis"], ["sums"], keepdims=0),
            helper.make_node("MatMul", ["sums", "minimums"], ["o"]),
            helper.make_node("Add", ["p", "o"], ["y"]),
        ]
    graph = helper.make_graph(
        nodes,
        "term",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "rows", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "rows", n])],
        initializers,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


VARIANTS = (
    "4-bit",
    "4-bit + minimum term",
    "4-bit, uint8 zero points",
    "4-bit, float zero points",
    "8-bit",
)


def main() -> None:
    parser = harness.argument_parser(__doc__, threads=2)
    parser.add_argument("--k", type=int, default=1536)
    parser.add_argument("--n", type=int, default=17920)
    parser.add_argument("--rows", default="1,2,5,8")
    args = parser.parse_args()
    lines = harness.JsonLines(args.jsonl)
    rows = [int(r) for r in args.rows.split(",")]
    from edgespec.graph.kernels import gguf_kernel_library

    variants = VARIANTS + (tuple(KERNEL_VARIANTS) if gguf_kernel_library() else ())
    sessions = {v: session(args.k, args.n, v, args.threads) for v in variants}
    x = np.random.default_rng(1).standard_normal((1, max(rows), args.k), dtype=np.float32)
    best: dict[tuple[str, int], float] = {}
    for _ in range(BLOCKS):
        for count in rows:
            for variant, run in sessions.items():
                calls = 10 if "float zero" in variant else 50
                feed = {"x": x[:, :count]}
                run.run(None, feed)
                started = time.perf_counter()
                for _ in range(calls):
                    run.run(None, feed)
                elapsed = (time.perf_counter() - started) / calls * 1e3
                key = (variant, count)
                best[key] = min(best.get(key, elapsed), elapsed)
    for (variant, count), ms in best.items():
        line = {"variant": variant, "rows": count, "ms": round(ms, 3)}
        line["vs_one_row_4bit"] = round(ms / best[("4-bit", 1)], 2)
        if variant in KERNEL_VARIANTS:
            _, inputs, size, _, _ = KERNEL_TYPES[KERNEL_VARIANTS[variant][0]]
            line["GB_per_s"] = round(args.n * args.k // inputs * size / ms / 1e6, 1)
        lines.write(line)
    for variant, run in sessions.items():
        first = {c: run.run(None, {"x": x[:, :c]})[0][0, 0] for c in (1, 2, 5)}
        same = {
            "variant": variant,
            "same_bits_1_vs_2": bool(np.array_equal(first[1], first[2])),
            "same_bits_2_vs_5": bool(np.array_equal(first[2], first[5])),
        }
        lines.write(same)


if __name__ == "__main__":
    main()
