"""edgespec's CacheAttention kernel (float32 and float16 caches) against ONNX Runtime's
GroupQueryAttention alone, on the same in-place caches: ``--layers`` nodes of each, every one
over its own cache (so the caches exceed the last-level cache, as in a model), the three
graphs alternating in one process.

    python benchmarks/cache_attention.py [--shapes 4x1x256,12x2x128,14x2x64,9x3x64]
        [--contexts 64,1500] [--widths 1,128] [--window 0] [--layers 8] [--threads 2]

A shape is query heads x KV heads x head width (Gemma 3 270M, Qwen2.5-Coder-1.5B, -0.5B,
SmolLM2-135M). For each shape, context and pass width, prints one JSON line: the median time
of a pass per layer in milliseconds for each operator, over ``--rounds`` alternating rounds
of 15 passes (the fastest round's median), and GroupQueryAttention's time over each kernel's.
GroupQueryAttention runs one thread per query head; ``--window`` gives every
operator a sliding window.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import harness

CAPACITY = 4096
PASSES = 15


def attention_session(kind: str, heads: int, kv_heads: int, d: int, args: Any) -> Any:
    import onnxruntime
    from onnx import TensorProto, helper

    from edgespec.graph.kernels import ATTENTION_KERNELS, GGUF_DOMAIN, register_gguf_kernels

    floats = TensorProto.FLOAT
    cache_type = TensorProto.FLOAT16 if kind == "CacheAttentionHalf" else floats
    inputs = [
        helper.make_tensor_value_info("q", floats, [1, "s", heads * d]),
        helper.make_tensor_value_info("k", floats, [1, "s", kv_heads * d]),
        helper.make_tensor_value_info("v", floats, [1, "s", kv_heads * d]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    cache = [1, kv_heads, CAPACITY, d]
    nodes, outputs = [], []
    for layer in range(args.layers):
        names = ["q", "k", "v", f"pk{layer}", f"pv{layer}", "seqlens_k", "total"]
        results = [f"y{layer}", f"ck{layer}", f"cv{layer}"]
        if kind in ATTENTION_KERNELS:
            node = helper.make_node(
                kind,
                names,
                results,
                domain=GGUF_DOMAIN,
                num_heads=heads,
                kv_num_heads=kv_heads,
                window=args.window,
            )
        else:
            window = {"local_window_size": args.window} if args.window else {}
            node = helper.make_node(
                "GroupQueryAttention",
                names,
                results,
                domain="com.microsoft",
                num_heads=heads,
                kv_num_heads=kv_heads,
                **window,
            )
        nodes.append(node)
        inputs += [helper.make_tensor_value_info(n, cache_type, cache) for n in names[3:5]]
        outputs += [helper.make_tensor_value_info(results[0], floats, [1, "s", heads * d])]
        outputs += [helper.make_tensor_value_info(n, cache_type, cache) for n in results[1:]]
    model = helper.make_model(
        helper.make_graph(nodes, "attention", inputs, outputs),
        opset_imports=[
            helper.make_opsetid("", 21),
            helper.make_opsetid("com.microsoft", 1),
            helper.make_opsetid(GGUF_DOMAIN, 1),
        ],
    )
    model.ir_version = 10
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    register_gguf_kernels(options, required=kind in ATTENTION_KERNELS)
    return onnxruntime.InferenceSession(model.SerializeToString(), options)


def bound(
    session: Any, shape: tuple[int, int, int], context: int, width: int, args: Any, half: bool
) -> Any:
    import onnxruntime

    heads, kv_heads, d = shape
    rng = np.random.default_rng(0)
    binding = session.io_binding()
    feeds = {
        "q": rng.standard_normal((1, width, heads * d), dtype=np.float32),
        "k": rng.standard_normal((1, width, kv_heads * d), dtype=np.float32),
        "v": rng.standard_normal((1, width, kv_heads * d), dtype=np.float32),
        "seqlens_k": np.array([context + width - 1], np.int32),
        "total": np.array(context + width, np.int32),
    }
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    for layer in range(args.layers):
        for kind in "kv":
            cache = rng.standard_normal((1, kv_heads, CAPACITY, d), dtype=np.float32)
            cache = cache.astype(np.float16) if half else cache
            value = onnxruntime.OrtValue.ortvalue_from_numpy(cache)
            binding.bind_ortvalue_input(f"p{kind}{layer}", value)
            binding.bind_ortvalue_output(f"c{kind}{layer}", value)
        binding.bind_output(f"y{layer}")
    return binding


def main() -> None:
    parser = harness.argument_parser(__doc__, threads=2, rounds=3, contexts="64,1500")
    parser.add_argument("--shapes", default="4x1x256,12x2x128,14x2x64,9x3x64")
    parser.add_argument("--widths", default="1,128")
    parser.add_argument("--window", type=int, default=0)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    lines = harness.JsonLines(args.jsonl)
    kinds = ("GroupQueryAttention", "CacheAttention", "CacheAttentionHalf")
    for text in args.shapes.split(","):
        heads, kv_heads, d = (int(x) for x in text.split("x"))
        sessions = {kind: attention_session(kind, heads, kv_heads, d, args) for kind in kinds}
        for context in (int(c) for c in args.contexts.split(",")):
            for width in (int(w) for w in args.widths.split(",")):
                bindings = {
                    kind: bound(
                        sessions[kind],
                        (heads, kv_heads, d),
                        context,
                        width,
                        args,
                        kind == "CacheAttentionHalf",
                    )
                    for kind in kinds
                }
                best: dict[str, float] = {}
                for _ in range(args.rounds):
                    for kind in kinds:
                        times = []
                        for _ in range(PASSES):
                            started = time.perf_counter()
                            sessions[kind].run_with_iobinding(bindings[kind])
                            times.append(time.perf_counter() - started)
                        median = float(np.median(times)) / args.layers * 1e3
                        best[kind] = min(best.get(kind, median), median)
                line = {"shape": text, "context": context, "width": width, "window": args.window}
                line |= {f"{kind}_ms": round(best[kind], 3) for kind in kinds}
                for kind in kinds[1:]:
                    line[f"ratio_{kind}"] = round(best["GroupQueryAttention"] / best[kind], 2)
                lines.write(line)


if __name__ == "__main__":
    main()
