"""Builds of the GGUF kernel library against each other on one product, in one process: what a
change to a kernel's instructions buys, without a model's memory traffic or a process's luck.

    python benchmarks/kernel_builds.py A.so,B.so[,...] [--types Q4_K,Q6_K,Q4_0]
        [--outputs 4096] [--inputs 1536] [--widths 1,5,8,64] [--threads 1] [--runs 150]

For each block type, one GgufMatMul over random blocks in the kernels' rows-of-8 layout
(``--outputs`` x ``--inputs``, small enough to stay in cache) is loaded once per build, each
session registering its own build of the library. Every width's passes then run the builds
in turn, ``--runs`` times, and the script prints each build's median pass in microseconds and
its ratio to the first build's. The outputs of every build are checked to be the same bits
(the builds compute the same integer sums). One thread by default: a session's spinning
threads would otherwise take the cores from the next build's pass. Separate processes
(``kernel_paths.py --builds``) moved by up to 20% between runs of the same build on a busy
machine; builds in one process, interleaved pass by pass, moved by 1-2%. Naming a build twice
shows that floor.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

import harness

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def product_session(library: str, kind: str, blocks: np.ndarray, inputs: int, threads: int):
    """One GgufMatMul (x [rows, inputs] by ``blocks`` in rows of 8) on ``library``."""
    import gguf
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    from edgespec.export.gguf.rows8 import ROWS8_OFFSET, to_rows8
    from edgespec.graph.kernels import GGUF_DOMAIN

    node = helper.make_node(
        "GgufMatMul",
        ["x", "w"],
        ["y"],
        domain=GGUF_DOMAIN,
        ggml_type=int(gguf.GGMLQuantizationType[kind]) + ROWS8_OFFSET,
        in_features=inputs,
        out_features=len(blocks),
    )
    graph = helper.make_graph(
        [node],
        "product",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", inputs])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(to_rows8(blocks, kind), "w")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(GGUF_DOMAIN, 1)]
    )
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(library)
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def main() -> None:
    parser = harness.argument_parser(__doc__, threads=1, jsonl=False)
    parser.add_argument("builds", help="library builds, comma-separated (a .so each)")
    parser.add_argument("--types", default="Q4_K,Q6_K,Q4_0")
    parser.add_argument("--outputs", type=int, default=4096)
    parser.add_argument("--inputs", type=int, default=1536)
    parser.add_argument("--widths", default="1,5,8,64")
    parser.add_argument("--runs", type=int, default=150)
    args = parser.parse_args()
    from support.gguf_model import random_blocks  # tests/, first on sys.path

    builds = args.builds.split(",")
    missing = [build for build in builds if not Path(build).is_file()]
    if missing:
        sys.exit(
            f"no library build at {', '.join(missing)}: build one with "
            "'python setup.py build_ext --inplace' and copy the .so it writes"
        )
    widths = [int(width) for width in args.widths.split(",")]
    for kind in args.types.split(","):
        rng = np.random.default_rng(0)
        blocks = random_blocks(rng, kind, args.outputs, args.inputs)
        sessions = [
            product_session(build, kind, blocks, args.inputs, args.threads) for build in builds
        ]
        x = rng.standard_normal((max(widths), args.inputs)).astype(np.float32)
        for width in widths:
            feed = {"x": x[:width]}
            outputs = [session.run(None, feed)[0] for session in sessions]
            if not all(np.array_equal(outputs[0], y) for y in outputs[1:]):
                sys.exit(f"{kind} at {width} rows: the builds' outputs differ")
            times: list[list[float]] = [[] for _ in sessions]
            for _ in range(args.runs):
                for index, session in enumerate(sessions):
                    started = time.perf_counter()
                    session.run(None, feed)
                    times[index].append(time.perf_counter() - started)
            medians = [statistics.median(found) * 1e6 for found in times]
            print(
                f"{kind} x{width}: "
                + "  ".join(f"{median:8.1f} us" for median in medians)
                + "  vs the first: "
                + " ".join(f"{median / medians[0]:.3f}" for median in medians[1:]),
                flush=True,
            )


if __name__ == "__main__":
    main()
